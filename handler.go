package rrl

import (
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
)

// requestGate is what a Handler asks, per UDP query, of the Protection it serves:
// the Limiter that must still judge the query, or nil when it was held to the
// request limits already (in the kernel, or by a server of the Protection).
type requestGate interface {
	requestLimiter(w dns.ResponseWriter) *Limiter
	// observeResponse teaches the Protection's name learners from a response
	// the inner handler computed, and the wildcard origin it reported.
	observeResponse(m *dns.Msg, wildcard string)
}

// Handler is middleware for github.com/miekg/dns servers: it lets the inner
// handler answer, debits the answer with an RRL and sends it, withholds it or slips
// it (a truncated response, or BADCOOKIE to a client that sent a cookie), as BIND 9
// does. With Cookies (WithCookies) it verifies and issues DNS server cookies, and
// sends answers to UDP queries with a valid server cookie unlimited. As a
// Protection's Handler it also holds UDP queries the kernel filter did not judge to
// the request limits in Go, once. Malformed queries get their error response
// without reaching the inner handler. docs/handler.md lists each step.
//
// The inner handler's messages are never modified, and its ResponseWriter is valid
// only until its ServeDNS returns (later writes fail with ErrLateWrite). An inner
// handler that synthesises an answer from a wildcard says so with
// SetWildcardOrigin. A Handler is safe for concurrent use; Stats returns its
// counters.
type Handler struct {
	next    dns.Handler
	rrl     *RRL
	cookies *Cookies
	limiter *Limiter // the Go request limiter of withLimiter, for tests
	filter  *Filter  // the Filter of WithFilter, taught from the responses
	// core is the Protection whose Handler this is: it says, per query, whether the
	// Go request limits still apply; UDP queries are then always held to them once.
	core    requestGate
	now     func() time.Time
	writers sync.Pool

	responses    [ActionLast][AllowanceLast]atomic.Uint64
	badCookie    atomic.Uint64
	cookieExempt atomic.Uint64
	limited      atomic.Uint64
	cookieCounts [cookieResultLast]atomic.Uint64
	malformed    [malformedLast]atomic.Uint64
	configured   sync.Map // *dns.Server: ConfigureServer was called for it
}

// NewHandler returns next wrapped in rate limiting by r. r must not be nil. Of the
// options it heeds WithCookies (the Handler has no cookies unless given them) and
// WithFilter (the Filter it teaches what exists).
func NewHandler(next dns.Handler, r *RRL, opts ...Option) *Handler {
	var o options
	for _, f := range opts {
		f(&o)
	}
	return newHandler(next, r, &o)
}

func newHandler(next dns.Handler, r *RRL, o *options) *Handler {
	h := &Handler{next: next, rrl: r, now: time.Now, limiter: o.limiter, filter: o.filter}
	if o.now != nil {
		h.now = o.now
	}
	if !o.noCookies {
		h.cookies = o.cookies
	}
	h.writers.New = func() any { return new(responseWriter) }
	return h
}

// Cookies returns the Cookies the Handler verifies and issues server cookies with
// (WithCookies), or nil when it has none.
func (h *Handler) Cookies() *Cookies { return h.cookies }

// wildcardReporter is implemented by the ResponseWriter a Handler gives to the inner
// handler. An inner handler that synthesises an answer from a wildcard calls
// SetWildcardOrigin before writing it, with the name the wildcard hangs from (for
// "*.wild.example." that is "wild.example.").
type wildcardReporter interface {
	SetWildcardOrigin(origin string)
}

// SetWildcardOrigin tells the Handler behind w, if there is one, that the response
// about to be written was synthesised from the wildcard below origin. It reports
// whether w took the information. Inner handlers call it instead of a type
// assertion, so that they work with or without the Handler in front.
func SetWildcardOrigin(w dns.ResponseWriter, origin string) bool {
	if wr, ok := w.(wildcardReporter); ok {
		wr.SetWildcardOrigin(origin)
		return true
	}
	return false
}

// HandlerStats are a Handler's counters since it was made.
type HandlerStats struct {
	// Responses counts what the Handler did with the inner handler's responses, by
	// action and by the category of the response: Send (written, cookie-exempt ones
	// included), Drop (withheld, slipped errors included) and Slip (truncated or
	// BADCOOKIE). FORMERR responses to malformed cookies count as errors.
	Responses [ActionLast][AllowanceLast]uint64
	// SlippedBadCookie counts the slips written as BADCOOKIE; the other slips were
	// truncated responses.
	SlippedBadCookie uint64
	// CookieExempt counts UDP responses sent without a Debit because the query had a
	// valid server cookie (they are also in Responses[Send]).
	CookieExempt uint64
	// RequestsLimited counts UDP queries the Limiter refused: no response at all.
	RequestsLimited uint64
	// Cookies counts the verdicts on the queries' COOKIE options, by CookieResult
	// (with WithCookies only).
	Cookies [cookieResultLast]uint64
	// Malformed counts queries answered with an error rcode (or not at all)
	// because of their form, by reason, every reason present: "short" (no reply),
	// "response" (QR set: no reply), "opcode" (NOTIMP), "question-count",
	// "section-count", "truncated", "name", "other" and "opt-count" (FORMERR),
	// "edns-version" (BADVERS). Their replies are also in
	// Responses[...][AllowanceError]. The first eight are found by miekg/dns before
	// the Handler runs and counted only on a server set up with ConfigureServer.
	Malformed map[string]uint64
}

// Stats returns the Handler's counters.
func (h *Handler) Stats() HandlerStats {
	var s HandlerStats
	for a := range s.Responses {
		for c := range s.Responses[a] {
			s.Responses[a][c] = h.responses[a][c].Load()
		}
	}
	s.SlippedBadCookie = h.badCookie.Load()
	s.CookieExempt = h.cookieExempt.Load()
	s.RequestsLimited = h.limited.Load()
	for i := range s.Cookies {
		s.Cookies[i] = h.cookieCounts[i].Load()
	}
	s.Malformed = make(map[string]uint64, malformedLast)
	for r := range malformedLast {
		s.Malformed[r.String()] = h.malformed[r].Load()
	}
	return s
}

// ServeDNS implements dns.Handler.
func (h *Handler) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	src, udp := remoteAddrPort(w.RemoteAddr())
	var limiter *Limiter
	if udp {
		limiter = h.limiter
		if h.core != nil {
			limiter = h.core.requestLimiter(w)
		}
	}
	rw := h.writers.Get().(*responseWriter)
	rw.ResponseWriter, rw.h, rw.src, rw.udp = w, h, src, udp
	if h.cookies != nil {
		rw.cookie, rw.hasCookie = cookieOption(req, &rw.cookieBuf)
		if rw.hasCookie {
			rw.cookieResult = h.cookies.Verify(rw.cookie, src.Addr(), h.now())
		}
	}
	// The cookie first: a query that proves its address with a valid server
	// cookie is judged at that address only, as the kernel filter judges it.
	if limiter != nil && !allowQuery(limiter, src, rw.cookieResult.Valid(), req, nil) {
		h.limited.Add(1)
		h.release(rw)
		return
	}
	l := rw.lease()
	defer h.release(rw)

	// A query the server would answer FORMERR or NOTIMP itself when the
	// Handler's ConfigureServer is not in use, and the EDNS errors of RFC 6891:
	// answered here as error responses, under the errors-per-second allowance.
	if rcode, reason := queryError(req); rcode != dns.RcodeSuccess {
		h.malformed[reason].Add(1)
		rw.writeMsg(errorReply(req, rcode))
		return
	}
	if h.cookies != nil {
		h.cookieCounts[rw.cookieResult].Add(1)
		if rw.cookieResult == CookieMalformed {
			// RFC 7873 section 5.2.2: a malformed COOKIE option is a format error.
			m := new(dns.Msg)
			m.SetRcode(req, dns.RcodeFormatError)
			m.SetEdns0(responseUDPSize, false) // the query had one: its cookie
			rw.writeMsg(m)
			return
		}
	}
	h.next.ServeDNS(l, req)
}

// observe teaches the learners of the limits the Handler's queries are held to
// from m, a response the inner handler computed, with wildcard the origin it
// reported ("" for none).
func (h *Handler) observe(m *dns.Msg, wildcard string) {
	if h.core != nil { // a Protection's: it teaches its own, and ignores WithFilter
		h.core.observeResponse(m, wildcard)
		return
	}
	if h.limiter != nil {
		h.limiter.observe(m, wildcard)
	}
	if h.filter != nil {
		h.filter.observe(m, wildcard)
	}
}

// allowQuery holds a query from src to the request limits of l: at its own address
// only when proven (a valid server cookie), else at every node.
// The query's name is judged too when the names judge is on (docs/names.md): read
// from req when not nil, else from raw, the datagram as read.
func allowQuery(l *Limiter, src netip.AddrPort, proven bool, req *dns.Msg, raw []byte) bool {
	var q qname
	var qp *qname
	if req != nil && l.readQuestion(req, &q) || raw != nil && l.readName(raw, &q) {
		qp = &q
	}
	return l.decideQueryAt(src, qp, proven, coarseNanos(), rand.Uint32()).Allowed
}

// allowRaw is allowQuery for a datagram as read, b, whose server cookie it looks
// for in the wire format.
func (h *Handler) allowRaw(l *Limiter, b []byte, src netip.AddrPort) bool {
	proven := false
	if h.cookies != nil {
		if c, ok := rawCookie(b); ok {
			proven = h.cookies.Verify(c, src.Addr().Unmap(), h.now()).Valid()
		}
	}
	return allowQuery(l, src, proven, nil, b)
}

// release ends rw's lease, so that the inner handler's later calls fail instead of
// reaching the next query's client, and returns rw to the pool.
func (h *Handler) release(rw *responseWriter) {
	rw.mu.Lock()
	rw.gen++
	rw.queryState = queryState{} // the pool keeps no request alive
	rw.mu.Unlock()
	h.writers.Put(rw)
}

// malformedReason says why a query got an error reply (or none) instead of an
// answer; HandlerStats.Malformed counts queries by its name.
type malformedReason uint8

// The reasons. Those up to malformedOther are found by miekg/dns before the Handler
// runs and counted only on a server set up with ConfigureServer; the Handler finds
// the others itself.
const (
	malformedShort         malformedReason = iota // shorter than a DNS header: no reply
	malformedResponse                             // QR set, a response: no reply
	malformedOpcode                               // an opcode other than QUERY and NOTIFY: NOTIMP
	malformedQuestionCount                        // a QUERY without exactly one question: FORMERR
	malformedSectionCount                         // more answer, authority or additional records than a query has: FORMERR
	malformedTruncated                            // a record or question runs past the end: FORMERR
	malformedName                                 // a reserved label type (a length over 63; miekg/dns reports some bad record data alike), a name over 255 octets, a compression loop: FORMERR
	malformedOther                                // any other record that does not unpack: FORMERR
	malformedOPTCount                             // more than one OPT record: FORMERR
	malformedEDNSVersion                          // an EDNS version above 0: BADVERS
	malformedLast                                 // number of reasons
)

var malformedNames = [malformedLast]string{"short", "response", "opcode", "question-count",
	"section-count", "truncated", "name", "other", "opt-count", "edns-version"}

// String returns the reason's name as the metrics label it: "short", "opcode",
// "question-count", "name", "edns-version", ...
func (r malformedReason) String() string {
	if r < malformedLast {
		return malformedNames[r]
	}
	return fmt.Sprintf("malformedReason(%d)", uint8(r))
}

// queryError returns the rcode a query gets instead of an answer, and why, or
// RcodeSuccess: NOTIMP for an opcode other than QUERY and NOTIFY, FORMERR for a
// QUERY without exactly one question or with more than one OPT record, BADVERS for
// an EDNS version above 0 (RFC 6891 section 6.1.3).
func queryError(req *dns.Msg) (int, malformedReason) {
	switch req.Opcode {
	case dns.OpcodeQuery:
		if len(req.Question) != 1 {
			return dns.RcodeFormatError, malformedQuestionCount
		}
	case dns.OpcodeNotify:
	default:
		return dns.RcodeNotImplemented, malformedOpcode
	}
	var opt *dns.OPT
	for _, rr := range req.Extra {
		if o, ok := rr.(*dns.OPT); ok {
			if opt != nil {
				return dns.RcodeFormatError, malformedOPTCount
			}
			opt = o
		}
	}
	if opt != nil && opt.Version() != 0 {
		return dns.RcodeBadVers, malformedEDNSVersion
	}
	return dns.RcodeSuccess, 0
}

// errorReply returns the reply with rcode to req: its question (for QUERY), the
// server's OPT record (version 0) when the query had one, and neither the query's
// TC bit nor any record besides.
func errorReply(req *dns.Msg, rcode int) *dns.Msg {
	m := new(dns.Msg)
	m.SetRcode(req, rcode)
	if req.Opcode != dns.OpcodeQuery || len(req.Question) != 1 {
		m.Question = nil
	}
	var do bool
	hasOPT := false
	for _, rr := range req.Extra {
		if o, ok := rr.(*dns.OPT); ok {
			hasOPT, do = true, do || o.Do()
		}
	}
	if hasOPT || rcode > 0xF {
		m.SetEdns0(responseUDPSize, do)
	}
	return m
}

// responseUDPSize is the EDNS payload size advertised in OPT records the Handler
// adds (the DNS flag day 2020 value, safe from fragmentation).
const responseUDPSize = 1232

// remoteAddrPort returns the query's source and whether it came over UDP, without
// allocating for the address types miekg/dns uses.
func remoteAddrPort(a net.Addr) (netip.AddrPort, bool) {
	switch a := a.(type) {
	case *net.UDPAddr:
		if a != nil {
			ap := a.AddrPort()
			return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), true
		}
	case *net.TCPAddr:
		if a != nil {
			ap := a.AddrPort()
			return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), false
		}
	case nil:
	default:
		udp := strings.HasPrefix(a.Network(), "udp")
		if ap, err := netip.ParseAddrPort(a.String()); err == nil {
			return netip.AddrPortFrom(ap.Addr().Unmap().WithZone(""), ap.Port()), udp
		}
		return netip.AddrPortFrom(parseAddr(a.String()).Unmap(), 0), udp
	}
	return netip.AddrPort{}, false
}

// cookieOption returns the content of the first COOKIE option of m decoded into buf,
// and whether there was one, as cookieFromMsg does but without allocating. Content
// longer than buf, or not valid hex, is returned as empty: malformed.
func cookieOption(m *dns.Msg, buf *[clientCookieLen + maxServerCookieLen]byte) ([]byte, bool) {
	// m.IsEdns0 scans Extra from its end; the OPT record is normally last.
	opt := m.IsEdns0()
	if opt == nil {
		return nil, false
	}
	for _, o := range opt.Option {
		c, ok := o.(*dns.EDNS0_COOKIE)
		if !ok {
			continue
		}
		s := c.Cookie
		if len(s)%2 != 0 || len(s)/2 > len(buf) {
			return buf[:0], true
		}
		for i := 0; i < len(s); i += 2 {
			hi, ok1 := unhex(s[i])
			lo, ok2 := unhex(s[i+1])
			if !ok1 || !ok2 {
				return buf[:0], true
			}
			buf[i/2] = hi<<4 | lo
		}
		return buf[:len(s)/2], true
	}
	return nil, false
}

// responseWriter holds back the first response of the inner handler until the
// Handler has judged it. It is pooled: the inner handler gets a lease on it, which
// stops working when ServeDNS returns.
type responseWriter struct {
	mu     sync.Mutex // held by every lease call, and by release
	gen    uint64     // the current lease's; release increments it
	leases *[leaseBatch]lease
	next   int // leases[next:] are unused

	queryState // zeroed by release
}

// queryState is the state of a responseWriter for one query.
type queryState struct {
	dns.ResponseWriter
	h   *Handler
	src netip.AddrPort
	udp bool

	cookieBuf    [clientCookieLen + maxServerCookieLen]byte
	cookie       []byte // the query's COOKIE option content, in cookieBuf
	hasCookie    bool
	cookieResult CookieResult

	wildcard string
	judged   bool // the first response was judged
	withheld bool // ... and withheld: later ones are too
}

// leaseBatch is how many leases are allocated at once. Each is handed out once,
// so a lease kept past its query never aliases a later one.
const leaseBatch = 32

// lease returns a new lease on rw for the current generation.
func (rw *responseWriter) lease() *lease {
	if rw.leases == nil || rw.next == len(rw.leases) {
		rw.leases, rw.next = new([leaseBatch]lease), 0
	}
	l := &rw.leases[rw.next]
	rw.next++
	*l = lease{rw: rw, gen: rw.gen}
	return l
}

// ErrLateWrite is returned by the ResponseWriter a Handler gives its inner handler
// when it is used after the Handler's ServeDNS returned.
var ErrLateWrite = errors.New("rrl: response writer used after ServeDNS returned")

// lease is the dns.ResponseWriter the inner handler gets: a responseWriter for one
// query. Every call checks that the query is still being served; after that, writes
// fail with ErrLateWrite and nothing reaches the writer that serves other queries.
type lease struct {
	rw  *responseWriter
	gen uint64
}

// acquire locks the responseWriter and returns it, or nil (unlocked) when the
// lease has ended.
func (l *lease) acquire() *responseWriter {
	rw := l.rw
	rw.mu.Lock()
	if rw.gen != l.gen {
		rw.mu.Unlock()
		return nil
	}
	return rw
}

// WriteMsg judges the first response and writes what the verdict says; later
// responses follow its fate. A withheld response is not an error for the caller.
func (l *lease) WriteMsg(m *dns.Msg) error {
	rw := l.acquire()
	if rw == nil {
		return ErrLateWrite
	}
	defer rw.mu.Unlock()
	return rw.writeMsg(m)
}

// Write unpacks a raw response to judge it; bytes that do not unpack are judged as
// an error response and, if sent, sent as they are.
func (l *lease) Write(b []byte) (int, error) {
	rw := l.acquire()
	if rw == nil {
		return 0, ErrLateWrite
	}
	defer rw.mu.Unlock()
	return rw.write(b)
}

// LocalAddr implements dns.ResponseWriter; after the lease it returns an empty
// address.
func (l *lease) LocalAddr() net.Addr {
	rw := l.acquire()
	if rw == nil {
		return endedAddr{}
	}
	defer rw.mu.Unlock()
	return rw.ResponseWriter.LocalAddr()
}

// RemoteAddr implements dns.ResponseWriter; after the lease it returns an empty
// address.
func (l *lease) RemoteAddr() net.Addr {
	rw := l.acquire()
	if rw == nil {
		return endedAddr{}
	}
	defer rw.mu.Unlock()
	return rw.ResponseWriter.RemoteAddr()
}

// Close implements dns.ResponseWriter.
func (l *lease) Close() error {
	rw := l.acquire()
	if rw == nil {
		return ErrLateWrite
	}
	defer rw.mu.Unlock()
	return rw.ResponseWriter.Close()
}

// TsigStatus implements dns.ResponseWriter.
func (l *lease) TsigStatus() error {
	rw := l.acquire()
	if rw == nil {
		return ErrLateWrite
	}
	defer rw.mu.Unlock()
	return rw.ResponseWriter.TsigStatus()
}

// TsigTimersOnly implements dns.ResponseWriter.
func (l *lease) TsigTimersOnly(b bool) {
	if rw := l.acquire(); rw != nil {
		rw.ResponseWriter.TsigTimersOnly(b)
		rw.mu.Unlock()
	}
}

// Hijack implements dns.ResponseWriter.
func (l *lease) Hijack() {
	if rw := l.acquire(); rw != nil {
		rw.ResponseWriter.Hijack()
		rw.mu.Unlock()
	}
}

// Unwrap returns the ResponseWriter the Handler was given, so that an inner handler
// can reach what its caller put there (the CoreDNS plugin passes the request's
// context this way); nil after the lease. Writing to it directly bypasses the
// Handler.
func (l *lease) Unwrap() dns.ResponseWriter {
	rw := l.acquire()
	if rw == nil {
		return nil
	}
	defer rw.mu.Unlock()
	return rw.ResponseWriter
}

// SetWildcardOrigin implements wildcardReporter.
func (l *lease) SetWildcardOrigin(origin string) {
	if rw := l.acquire(); rw != nil {
		rw.wildcard = origin
		rw.mu.Unlock()
	}
}

// ConnectionState returns the TLS state of the connection when the underlying
// ResponseWriter has one (dns.ConnectionStater), nil otherwise.
func (l *lease) ConnectionState() *tls.ConnectionState {
	rw := l.acquire()
	if rw == nil {
		return nil
	}
	defer rw.mu.Unlock()
	if cs, ok := rw.ResponseWriter.(dns.ConnectionStater); ok {
		return cs.ConnectionState()
	}
	return nil
}

// endedAddr is the address an ended lease reports.
type endedAddr struct{}

func (endedAddr) Network() string { return "" }
func (endedAddr) String() string  { return "" }

// writeMsg is lease.WriteMsg with rw held.
func (rw *responseWriter) writeMsg(m *dns.Msg) error {
	if rw.judged {
		if rw.withheld {
			return nil
		}
		return rw.forward(m)
	}
	rw.judged = true
	return rw.judge(m)
}

// write is lease.Write with rw held.
func (rw *responseWriter) write(b []byte) (int, error) {
	if rw.judged {
		if rw.withheld {
			return len(b), nil
		}
		return rw.ResponseWriter.Write(b)
	}
	m := new(dns.Msg)
	if err := m.Unpack(b); err == nil {
		if err := rw.writeMsg(m); err != nil {
			return 0, err
		}
		return len(b), nil
	}
	rw.judged = true
	t := ResponseTuple{AllowanceCategory: AllowanceError}
	if act := rw.h.debit(rw.src, rw.udp, &t); act != Send {
		rw.h.responses[Drop][AllowanceError].Add(1)
		rw.withhold()
		return len(b), nil
	}
	rw.h.responses[Send][AllowanceError].Add(1)
	return rw.ResponseWriter.Write(b)
}

// debit debits t for a response to src, without requests-per-second when UDP
// queries passed a request limiter already (in a Protection, always).
func (h *Handler) debit(src netip.AddrPort, udp bool, t *ResponseTuple) Action {
	var act Action
	if udp && (h.limiter != nil || h.core != nil) {
		act, _, _ = h.rrl.debitResponse(src, t)
	} else {
		act, _, _ = h.rrl.DebitAddrPort(src, udp, t)
	}
	return act
}

// withhold marks the query's responses withheld. Over TCP it also closes the
// connection: a client refused by requests-per-second (the only limit on TCP) gets
// no silence to wait out, and its connection slot is free at once.
func (rw *responseWriter) withhold() {
	rw.withheld = true
	if !rw.udp {
		rw.ResponseWriter.Close()
	}
}

// forward writes m as it is. A message shaped like miekg/dns's own replies to
// malformed queries (see ConfigureServer) is packed and written raw, past the
// server's DecorateWriter, so that it is not judged a second time.
func (rw *responseWriter) forward(m *dns.Msg) error {
	if (m.Rcode == dns.RcodeFormatError || m.Rcode == dns.RcodeNotImplemented) &&
		len(m.Answer) == 0 && len(m.Ns) == 0 && len(m.Extra) == 0 {
		b, err := m.Pack()
		if err != nil {
			return err
		}
		_, err = rw.ResponseWriter.Write(b)
		return err
	}
	return rw.ResponseWriter.WriteMsg(m)
}

// judge decides the fate of m, the first response, and writes accordingly.
func (rw *responseWriter) judge(m *dns.Msg) error {
	h := rw.h
	// What exists is learnt from every response computed, whatever response
	// rate limiting then does with it (docs/names.md).
	h.observe(m, rw.wildcard)
	var act Action
	var cat AllowanceCategory
	if rw.udp && rw.cookieResult.Valid() {
		act, cat = Send, responseCategory(m)
		h.cookieExempt.Add(1)
	} else {
		t := ResponseTupleFromMsg(m, rw.wildcard)
		act = h.debit(rw.src, rw.udp, &t)
		cat = t.AllowanceCategory
	}
	if act == Slip && cat == AllowanceError {
		act = Drop // BIND 9 never slips error responses
	}
	h.responses[act][cat].Add(1)
	switch act {
	case Drop:
		rw.withhold()
		return nil
	case Slip:
		if rw.hasCookie && len(rw.cookie) >= clientCookieLen {
			h.badCookie.Add(1)
			return rw.ResponseWriter.WriteMsg(rw.badCookie(m))
		}
		m = truncated(m)
	}
	if m.Truncated && (m.Rcode == dns.RcodeFormatError || m.Rcode == dns.RcodeNotImplemented) {
		// An error reply has nothing to retry over TCP for: a TC bit there is
		// the query's, copied.
		cp := *m
		cp.Truncated = false
		m = &cp
	}
	if rw.hasCookie && len(rw.cookie) >= clientCookieLen {
		m = rw.withCookie(m)
	}
	return rw.forward(m)
}

// withCookie returns a shallow copy of m carrying a fresh full cookie for the
// client, in a copy of m's OPT record (or a new one).
func (rw *responseWriter) withCookie(m *dns.Msg) *dns.Msg {
	var buf [cookieLen]byte
	full := rw.h.cookies.appendCookie(buf[:0], rw.cookie, rw.src.Addr(), rw.h.now())
	cp := *m
	cp.Extra = make([]dns.RR, 0, len(m.Extra)+1)
	var opt *dns.OPT
	for _, rr := range m.Extra {
		if o, ok := rr.(*dns.OPT); ok && opt == nil {
			c := *o
			c.Option = make([]dns.EDNS0, 0, len(o.Option)+1)
			for _, e := range o.Option {
				if _, isCookie := e.(*dns.EDNS0_COOKIE); !isCookie {
					c.Option = append(c.Option, e)
				}
			}
			opt = &c
			rr = opt
		}
		cp.Extra = append(cp.Extra, rr)
	}
	if opt == nil {
		opt = &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT, Class: responseUDPSize}}
		cp.Extra = append(cp.Extra, opt)
	}
	opt.Option = append(opt.Option, &dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: hexString(full)})
	return &cp
}

// badCookie returns the BADCOOKIE slip for the query whose response was m: the
// question and an OPT record with a fresh server cookie, nothing else (RFC 7873
// section 5.2.3 lets the client retry with the cookie).
func (rw *responseWriter) badCookie(m *dns.Msg) *dns.Msg {
	r := new(dns.Msg)
	r.MsgHdr = m.MsgHdr
	r.Authoritative, r.AuthenticatedData, r.Truncated = false, false, false
	r.Rcode = dns.RcodeBadCookie
	r.Question = m.Question
	if opt := m.IsEdns0(); opt != nil {
		r.Extra = []dns.RR{opt}
	}
	return rw.withCookie(r)
}

// truncated returns the slip of m without a cookie: a shallow copy with TC set and
// only the question and the OPT record, keeping the rcode (NOERROR or NXDOMAIN), as
// BIND 9 does.
func truncated(m *dns.Msg) *dns.Msg {
	cp := *m
	cp.Truncated = true
	cp.Answer, cp.Ns, cp.Extra = nil, nil, nil
	for i, rr := range m.Extra {
		if _, ok := rr.(*dns.OPT); ok {
			cp.Extra = m.Extra[i : i+1 : i+1]
			break
		}
	}
	return &cp
}

// hexString is hex.EncodeToString for a cookie, lower case as miekg/dns writes it.
func hexString(b []byte) string {
	const digits = "0123456789abcdef"
	var s strings.Builder
	s.Grow(2 * len(b))
	for _, c := range b {
		s.WriteByte(digits[c>>4])
		s.WriteByte(digits[c&15])
	}
	return s.String()
}

// decorateLimit returns a miekg/dns Server.DecorateReader that holds UDP queries to
// the limits of l as soon as they are read, as the servers of a Protection do where
// the eBPF filter is not in force; for tests of the reader alone.
func decorateLimit(l *Limiter) dns.DecorateReader {
	return func(r dns.Reader) dns.Reader {
		return newLimitReader(r, nil, func(_ []byte, src netip.AddrPort) bool { return l.Allow(src) })
	}
}

// newLimitReader returns r holding every UDP datagram to allow, which gets the
// datagram and its source; refusals count in h's RequestsLimited (h may be nil).
//
// A query refused is discarded before the server unpacks it or starts a goroutine
// for it, which costs less CPU per dropped packet than refusing it in the Handler
// (BenchmarkLimiterDrop). The datagram after a refused one is read into the refused
// one's buffer (the server takes buffers from a pool of its own, which a reader
// cannot give them back to), so a flood of refused packets allocates no buffers.
// That needs the server's own reader underneath; over another reader it calls that
// reader for every datagram, and each refused one costs its buffer.
func newLimitReader(r dns.Reader, h *Handler, allow func(b []byte, src netip.AddrPort) bool) *limitReader {
	t := reflect.TypeOf(r)
	own := t != nil && t.PkgPath() == "github.com/miekg/dns" && t.Name() == "defaultReader"
	return &limitReader{Reader: r, allow: allow, h: h, own: own}
}

// limitReader is the dns.Reader of a Protection's servers.
type limitReader struct {
	dns.Reader
	allow func(b []byte, src netip.AddrPort) bool
	h     *Handler // nil, or the Handler whose RequestsLimited counts refusals
	own   bool     // Reader is miekg/dns's: its buffers may be read into again
}

// refused counts a query l refused.
func (r *limitReader) refused() {
	if r.h != nil {
		r.h.limited.Add(1)
	}
}

// ReadUDP returns the next query l allows. After a refused datagram it reads the
// next one itself into the same buffer, under the read deadline the server's
// reader set; when that passes it returns the timeout, as the server's reader does,
// and the server calls again.
func (r *limitReader) ReadUDP(conn *net.UDPConn, timeout time.Duration) ([]byte, *dns.SessionUDP, error) {
	b, s, err := r.Reader.ReadUDP(conn, timeout)
	for err == nil && s != nil {
		if ua, ok := s.RemoteAddr().(*net.UDPAddr); !ok || r.allow(b, ua.AddrPort()) {
			break
		}
		r.refused()
		if !r.own {
			b, s, err = r.Reader.ReadUDP(conn, timeout)
			continue
		}
		var n int
		if n, s, err = dns.ReadFromSessionUDP(conn, b[:cap(b)]); err != nil {
			return nil, nil, err
		}
		b = b[:n]
	}
	return b, s, err
}

// ReadPacketConn returns the next query l allows, for servers on a net.PacketConn
// that is not a *net.UDPConn, reusing buffers as ReadUDP does.
func (r *limitReader) ReadPacketConn(conn net.PacketConn, timeout time.Duration) ([]byte, net.Addr, error) {
	pr, ok := r.Reader.(dns.PacketConnReader)
	if !ok {
		return nil, nil, errors.New("rrl: request limits in the reader: the decorated reader cannot read a net.PacketConn")
	}
	b, a, err := pr.ReadPacketConn(conn, timeout)
	for err == nil {
		if src, udp := remoteAddrPort(a); !udp || r.allow(b, src) {
			break
		}
		r.refused()
		if !r.own {
			b, a, err = pr.ReadPacketConn(conn, timeout)
			continue
		}
		var n int
		if n, a, err = conn.ReadFrom(b[:cap(b)]); err != nil {
			return nil, nil, err
		}
		b = b[:n]
	}
	return b, a, err
}
