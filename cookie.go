package rrl

import (
	"crypto/subtle"
	"encoding/binary"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dchest/siphash"
	"github.com/dnsrake/rrl/internal/dnscookie"
	"github.com/miekg/dns"
)

// DNS cookie sizes (RFC 7873 section 4) and the RFC 9018 server cookie layout.
const (
	clientCookieLen    = dnscookie.ClientLen // a client cookie is exactly 8 bytes
	serverCookieLen    = dnscookie.ServerLen // an RFC 9018 server cookie: version, reserved, timestamp, hash
	cookieLen          = dnscookie.Len
	minServerCookieLen = 8  // RFC 7873 allows server cookies of 8..32 bytes
	maxServerCookieLen = 32 //
	cookieVersion      = 1  // RFC 9018 version 1: SipHash-2-4

	// RFC 9018 section 4.3: accept a cookie up to an hour old and up to five
	// minutes from the future (clock skew between anycast nodes), and give the
	// client a fresh one once it is half an hour old.
	cookieMaxAge     = 3600
	cookieMaxFuture  = 300
	cookieReissueAge = 1800
)

// CookieSecret is the 128-bit SipHash-2-4 key server cookies are made with. All
// servers answering for the same address (an anycast set) share it, so that a cookie
// one of them issued verifies at the others. Draw it from crypto/rand.
type CookieSecret [16]byte

// CookieResult is the verdict on the COOKIE option of a query.
type CookieResult uint8

// The cookie verdicts. Only CookieValid and CookieValidReissue prove that the client
// receives packets at its source address (RFC 7873 section 5.2).
const (
	CookieNone         CookieResult = iota // no COOKIE option
	CookieClientOnly                       // a client cookie without a server cookie
	CookieValid                            // a server cookie this server made, fresh
	CookieValidReissue                     // valid, but old or made with the previous secret: send a new one
	CookieBad                              // a server cookie of the right size that this server did not make for this client
	CookieExpired                          // made by this server, but outside -3600 s..+300 s of now
	CookieMalformed                        // option length not 8 or 16..40: answer FORMERR
	cookieResultLast                       // number of results; not a result
)

var cookieResultNames = [...]string{
	CookieNone:         "none",
	CookieClientOnly:   "client-only",
	CookieValid:        "valid",
	CookieValidReissue: "valid-reissue",
	CookieBad:          "bad",
	CookieExpired:      "expired",
	CookieMalformed:    "malformed",
}

// String returns the result's name, suitable as a metric label.
func (r CookieResult) String() string {
	if int(r) < len(cookieResultNames) {
		return cookieResultNames[r]
	}
	return "CookieResult(" + strconv.Itoa(int(r)) + ")"
}

// Valid reports whether the query carried a server cookie this server made for this
// client within its lifetime: the client has proved it receives packets at its source
// address, so its responses need no rate limit (RFC 7873 section 5.2.3).
func (r CookieResult) Valid() bool { return r == CookieValid || r == CookieValidReissue }

// sipKey is a CookieSecret split into SipHash's two little-endian key words.
type sipKey struct{ k0, k1 uint64 }

func newSipKey(s CookieSecret) sipKey {
	return sipKey{binary.LittleEndian.Uint64(s[:8]), binary.LittleEndian.Uint64(s[8:])}
}

// cookieKeys is replaced as a whole on rotation so that readers see a consistent
// pair without locking.
type cookieKeys struct {
	current  sipKey
	previous sipKey
	hasPrev  bool
}

// Cookies makes and verifies interoperable DNS server cookies (RFC 7873, with the
// SipHash-2-4 construction of RFC 9018, keyed by a CookieSecret): a cookie made by
// BIND, Knot, PowerDNS or another RFC 9018 implementation with the same secret
// verifies here and the other way round.
//
// To rotate secrets across an anycast set without rejecting cookies, first give every
// server the new secret as an extra accepted one (SetPrevious), then make it the
// current one everywhere (Rotate, which keeps the old one accepted), and after an
// hour or more forget the old one (ClearPrevious). Filter.UseCookies gives a kernel
// filter the same secrets, and these calls reach it before they return.
//
// Make one with NewCookies (the zero value has no secret and panics). The methods
// are safe for concurrent use; Verify does not lock and does not allocate.
type Cookies struct {
	keys atomic.Pointer[cookieKeys]

	// sinks receive every change of keys: the kernel filters using these secrets
	// (Filter.UseCookies). Changes are published under sinksMu so that the last
	// keys written to every sink are the latest.
	sinksMu sync.Mutex
	sinks   map[cookieSink]struct{}
}

// cookieSink is told the keys whenever they change.
type cookieSink interface {
	setCookieKeys(k *cookieKeys)
}

// publish gives every sink the current keys.
func (c *Cookies) publish() {
	c.sinksMu.Lock()
	defer c.sinksMu.Unlock()
	k := c.keys.Load()
	for s := range c.sinks {
		s.setCookieKeys(k)
	}
}

// subscribe adds s to the sinks and gives it the current keys.
func (c *Cookies) subscribe(s cookieSink) {
	c.sinksMu.Lock()
	defer c.sinksMu.Unlock()
	if c.sinks == nil {
		c.sinks = map[cookieSink]struct{}{}
	}
	c.sinks[s] = struct{}{}
	s.setCookieKeys(c.keys.Load())
}

func (c *Cookies) unsubscribe(s cookieSink) {
	c.sinksMu.Lock()
	defer c.sinksMu.Unlock()
	delete(c.sinks, s)
}

// NewCookies returns a Cookies making cookies with secret.
func NewCookies(secret CookieSecret) *Cookies {
	c := new(Cookies)
	c.keys.Store(&cookieKeys{current: newSipKey(secret)})
	return c
}

// SetPrevious makes Verify also accept cookies made with secret, besides the current
// secret.
func (c *Cookies) SetPrevious(secret CookieSecret) {
	for {
		old := c.keys.Load()
		k := *old
		k.previous, k.hasPrev = newSipKey(secret), true
		if c.keys.CompareAndSwap(old, &k) {
			c.publish()
			return
		}
	}
}

// ClearPrevious stops accepting cookies made with the previous secret.
func (c *Cookies) ClearPrevious() {
	for {
		old := c.keys.Load()
		k := *old
		k.previous, k.hasPrev = sipKey{}, false
		if c.keys.CompareAndSwap(old, &k) {
			c.publish()
			return
		}
	}
}

// Rotate makes newSecret the secret new cookies are made with, and keeps accepting
// cookies made with the secret it replaces.
func (c *Cookies) Rotate(newSecret CookieSecret) {
	for {
		old := c.keys.Load()
		k := cookieKeys{current: newSipKey(newSecret), previous: old.current, hasPrev: true}
		if c.keys.CompareAndSwap(old, &k) {
			c.publish()
			return
		}
	}
}

// setSecrets makes current the secret cookies are made with and, when previous is
// not nil, accepts cookies made with it too; no other secret is accepted.
func (c *Cookies) setSecrets(current CookieSecret, previous *CookieSecret) {
	k := &cookieKeys{current: newSipKey(current)}
	if previous != nil {
		k.previous, k.hasPrev = newSipKey(*previous), true
	}
	c.keys.Store(k)
	c.publish()
}

// Generate returns a full cookie (cookieLen bytes: the client cookie followed by a
// new server cookie) for a client at address client, timestamped now. clientCookie
// holds at least the 8-byte client cookie; anything after it (the rest of the
// query's COOKIE option) is ignored. Generate returns nil when clientCookie is
// shorter than 8 bytes.
func (c *Cookies) Generate(clientCookie []byte, client netip.Addr, now time.Time) []byte {
	if len(clientCookie) < clientCookieLen {
		return nil
	}
	return c.appendCookie(make([]byte, 0, cookieLen), clientCookie, client, now)
}

// appendCookie is Generate appending the cookie to dst; it does not allocate when
// dst has room for cookieLen more bytes. It returns dst unchanged when clientCookie is
// shorter than 8 bytes.
func (c *Cookies) appendCookie(dst, clientCookie []byte, client netip.Addr, now time.Time) []byte {
	if len(clientCookie) < clientCookieLen {
		return dst
	}
	var in [clientCookieLen + 8 + 16]byte
	copy(in[:clientCookieLen], clientCookie)
	in[8] = cookieVersion // version; reserved bytes 9..11 stay zero
	binary.BigEndian.PutUint32(in[12:16], uint32(now.Unix()))
	h := c.keys.Load().current.hash(&in, client)
	dst = append(dst, in[:16]...)
	return binary.LittleEndian.AppendUint64(dst, h)
}

// hash computes the RFC 9018 hash of in, whose first 16 bytes hold the client cookie,
// version, reserved bytes and timestamp, for client. SipHash's result is laid out
// little-endian in the cookie, as the RFC's test vectors show.
func (k sipKey) hash(in *[32]byte, client netip.Addr) uint64 {
	n := 16
	if client.Is4() || client.Is4In6() {
		// An IPv4 client is hashed as 4 bytes whether it reached an IPv4 or a
		// dual-stack socket, or the cookie would depend on the socket.
		a := client.Unmap().As4()
		n += copy(in[16:], a[:])
	} else if client.Is6() {
		a := client.As16()
		n += copy(in[16:], a[:])
	}
	return siphash.Hash(k.k0, k.k1, in[:n])
}

// Verify judges the content of a query's COOKIE option, cookie (as returned by
// cookieFromMsg), from client at time now. A nil cookie means the query had no
// COOKIE option; an empty non-nil one is an option of length 0, which is malformed.
//
// The lengths RFC 7873 allows are 8 (client cookie only) and 16 to 40 (client and
// server cookie); any other is CookieMalformed. A server cookie that is not 16 bytes,
// not version 1 or whose hash matches neither secret is CookieBad. A cookie this
// server made is CookieExpired when its timestamp is more than 3600 s in the past or
// more than 300 s in the future, CookieValidReissue when it is more than 1800 s old or
// was made with the previous secret, and CookieValid otherwise.
//
// The reserved bytes are hashed as received rather than required to be zero (RFC
// 9018 Appendix A.3 verifies a cookie whose reserved bytes are 0xabcdef).
func (c *Cookies) Verify(cookie []byte, client netip.Addr, now time.Time) CookieResult {
	switch n := len(cookie); {
	case cookie == nil:
		return CookieNone
	case n == clientCookieLen:
		return CookieClientOnly
	case n < clientCookieLen+minServerCookieLen || n > clientCookieLen+maxServerCookieLen:
		return CookieMalformed
	case n != cookieLen:
		return CookieBad // a valid size, but not a server cookie of ours
	}
	if cookie[8] != cookieVersion {
		return CookieBad
	}
	var in [32]byte
	copy(in[:16], cookie[:16])
	keys := c.keys.Load()
	reissue := false
	if !keys.current.matches(&in, client, cookie[16:24]) {
		if !keys.hasPrev || !keys.previous.matches(&in, client, cookie[16:24]) {
			return CookieBad
		}
		reissue = true
	}
	// Serial-number arithmetic: the difference of two 32-bit timestamps read as
	// a signed number is the age, across the 2106 wrap too.
	age := int32(uint32(now.Unix()) - binary.BigEndian.Uint32(cookie[12:16]))
	switch {
	case age > cookieMaxAge || age < -cookieMaxFuture:
		return CookieExpired
	case reissue || age > cookieReissueAge:
		return CookieValidReissue
	}
	return CookieValid
}

// matches reports whether want is the hash of in for client under k, comparing in
// constant time so that the comparison leaks nothing about the expected hash.
func (k sipKey) matches(in *[32]byte, client netip.Addr, want []byte) bool {
	var got [8]byte
	binary.LittleEndian.PutUint64(got[:], k.hash(in, client))
	return subtle.ConstantTimeCompare(got[:], want) == 1
}

// cookieFromMsg returns the content of m's first COOKIE option and whether it has one.
func cookieFromMsg(m *dns.Msg) ([]byte, bool) { return dnscookie.FromMsg(m) }

// setCookie puts cookie into m's first COOKIE option, adding one as needed.
func setCookie(m *dns.Msg, cookie []byte) { dnscookie.Set(m, cookie) }

// rawCookie returns the content of the first COOKIE option of the first OPT record
// in a DNS message as it came off the wire, and whether there was one, without
// unpacking the message or allocating: the reader of a Protection's server looks for
// it in every datagram it holds to the request limits. It skips the question and any
// answer and authority records, then walks the additional records; a message cut
// short, a name with a label type other than a plain label or a compression pointer,
// or an option running past its OPT record ends the search with nothing found, as
// does an OPT record without a COOKIE option. The content is a slice of msg.
func rawCookie(msg []byte) ([]byte, bool) {
	const headerLen = 12
	if len(msg) < headerLen {
		return nil, false
	}
	count := func(i int) int { return int(msg[i])<<8 | int(msg[i+1]) }
	qd, an, ns, ar := count(4), count(6), count(8), count(10)
	off := headerLen
	// skipName returns the offset after the name at off, or -1.
	skipName := func(off int) int {
		for off < len(msg) {
			l := int(msg[off])
			switch {
			case l == 0:
				return off + 1
			case l&0xc0 == 0xc0:
				if off+2 > len(msg) {
					return -1
				}
				return off + 2
			case l&0xc0 != 0:
				return -1
			}
			off += 1 + l
		}
		return -1
	}
	for range qd {
		if off = skipName(off); off < 0 || off+4 > len(msg) {
			return nil, false
		}
		off += 4
	}
	for i := range an + ns + ar {
		if off = skipName(off); off < 0 || off+10 > len(msg) {
			return nil, false
		}
		rtype, rdlen := count(off), count(off+8)
		off += 10
		end := off + rdlen
		if end > len(msg) {
			return nil, false
		}
		if i < an+ns || rtype != int(dns.TypeOPT) {
			off = end
			continue
		}
		for o := off; o+4 <= end; {
			code, olen := count(o), count(o+2)
			o += 4
			if o+olen > end {
				return nil, false
			}
			if code == dns.EDNS0COOKIE {
				return msg[o : o+olen : o+olen], true
			}
			o += olen
		}
		return nil, false
	}
	return nil, false
}
