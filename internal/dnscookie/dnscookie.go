// Package dnscookie reads and writes the EDNS0 COOKIE option (RFC 7873) of a DNS
// message, for the rrl package and for the test clients and demo resolvers around it.
package dnscookie

import (
	"encoding/hex"

	"github.com/miekg/dns"
)

// Cookie lengths.
const (
	ClientLen = 8                     // a client cookie is exactly 8 bytes
	ServerLen = 16                    // an RFC 9018 server cookie: version, reserved, timestamp, hash
	Len       = ClientLen + ServerLen // a full cookie of this package's servers
)

// FromMsg returns the content of the first EDNS0 COOKIE option of m (RFC 7873
// section 5.2 processes only the first) and whether there was one. The content is
// returned whatever its length, non-nil even when empty, so that a verifier can tell a
// malformed option from a missing one. An option that is not valid hex (possible
// only for a message built in code, never for one unpacked from the wire) is
// returned as empty, hence malformed.
func FromMsg(m *dns.Msg) ([]byte, bool) {
	opt := m.IsEdns0()
	if opt == nil {
		return nil, false
	}
	for _, o := range opt.Option {
		if c, ok := o.(*dns.EDNS0_COOKIE); ok {
			b, err := hex.DecodeString(c.Cookie)
			if err != nil || b == nil {
				b = []byte{}
			}
			return b, true
		}
	}
	return nil, false
}

// Set puts cookie into m's first EDNS0 COOKIE option, adding the option, and an OPT
// record advertising a 1232-byte payload when m has none, as needed.
func Set(m *dns.Msg, cookie []byte) {
	opt := m.IsEdns0()
	if opt == nil {
		m.SetEdns0(1232, false)
		opt = m.IsEdns0()
	}
	s := hex.EncodeToString(cookie)
	for _, o := range opt.Option {
		if c, ok := o.(*dns.EDNS0_COOKIE); ok {
			c.Cookie = s
			return
		}
	}
	opt.Option = append(opt.Option, &dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: s})
}
