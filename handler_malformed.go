package rrl

import (
	"errors"
	"strings"

	"github.com/miekg/dns"
)

// ConfigureServer sets up srv so that no reply leaves it outside h's rate limits.
// miekg/dns answers malformed queries itself before any handler runs (FORMERR for a
// bad question count or a message that does not unpack, NOTIMP for an unknown
// opcode); ConfigureServer installs a DecorateWriter that sends those replies
// through the limits of h as error responses (errors-per-second; over the
// allowance they are dropped, never slipped, as BIND 9 does), with the query's TC
// bit cleared, and a
// MsgAcceptFunc and MsgInvalidFunc that count them in HandlerStats.Malformed by
// reason. A refused one over TCP closes the connection, as in ServeDNS.
//
// What srv already had is kept: its MsgAcceptFunc (or dns.DefaultMsgAcceptFunc)
// still decides, its MsgInvalidFunc is still called, and its DecorateWriter still
// wraps the server's writer, under the one ConfigureServer adds. Error replies of
// the same shape that other handlers of srv write with WriteMsg are limited too;
// the Handler writes its own such replies with Write, past the DecorateWriter, so
// that they are not debited twice. Call ConfigureServer before the server starts;
// calling it again for the same server does nothing. srv.Handler is left alone (it
// is normally h, or leads to it). The servers of a Protection are configured
// already.
func (h *Handler) ConfigureServer(srv *dns.Server) {
	if _, done := h.configured.LoadOrStore(srv, struct{}{}); done {
		return
	}
	accept := srv.MsgAcceptFunc
	if accept == nil {
		accept = dns.DefaultMsgAcceptFunc
	}
	srv.MsgAcceptFunc = func(dh dns.Header) dns.MsgAcceptAction {
		act := accept(dh)
		if act != dns.MsgAccept {
			h.malformed[headerReason(dh)].Add(1)
		}
		return act
	}
	invalid := srv.MsgInvalidFunc
	srv.MsgInvalidFunc = func(m []byte, err error) {
		h.malformed[unpackReason(err)].Add(1)
		if invalid != nil {
			invalid(m, err)
		}
	}
	decorate := srv.DecorateWriter
	srv.DecorateWriter = func(w dns.Writer) dns.Writer {
		next := w
		if decorate != nil {
			next = decorate(w)
		}
		return &errorGuard{next: next, resp: w, h: h}
	}
}

// headerReason returns why a MsgAcceptFunc turned a query down, judged by the
// rules of dns.DefaultMsgAcceptFunc.
func headerReason(dh dns.Header) malformedReason {
	const qr = 1 << 15
	switch op := int(dh.Bits>>11) & 0xF; {
	case dh.Bits&qr != 0:
		return malformedResponse
	case op != dns.OpcodeQuery && op != dns.OpcodeNotify:
		return malformedOpcode
	case dh.Qdcount != 1:
		return malformedQuestionCount
	}
	return malformedSectionCount
}

// unpackReason returns the reason for an error miekg/dns's unpacking returned.
func unpackReason(err error) malformedReason {
	switch {
	case errors.Is(err, dns.ErrShortRead):
		return malformedShort
	case errors.Is(err, dns.ErrBuf):
		return malformedTruncated
	case errors.Is(err, dns.ErrLongDomain), errors.Is(err, dns.ErrRdata):
		return malformedName
	case err != nil && strings.Contains(err.Error(), "compression pointer"):
		return malformedName
	}
	return malformedOther
}

// errorGuard is the dns.Writer ConfigureServer puts under each response of the
// server: it passes everything through except miekg/dns's own replies to malformed
// queries, which it judges first.
type errorGuard struct {
	next dns.Writer // the writer to write to
	resp dns.Writer // the server's response, for its addresses
	h    *Handler
}

// Write writes b unless it is a reply to a malformed query that the limits refuse.
func (g *errorGuard) Write(b []byte) (int, error) {
	if !isErrorReply(b) {
		return g.next.Write(b)
	}
	rw, _ := g.resp.(dns.ResponseWriter)
	if rw == nil {
		return g.next.Write(b)
	}
	h := g.h
	src, udp := remoteAddrPort(rw.RemoteAddr())
	t := ResponseTuple{AllowanceCategory: AllowanceError}
	if act := h.debit(src, udp, &t); act != Send {
		h.responses[Drop][AllowanceError].Add(1)
		if !udp {
			rw.Close()
		}
		return len(b), nil
	}
	h.responses[Send][AllowanceError].Add(1)
	b[2] &^= 0x02 // TC: the query's bit, which miekg/dns copies
	return g.next.Write(b)
}

// isErrorReply reports whether b has the shape of miekg/dns's reply to a malformed
// query: a response with rcode FORMERR or NOTIMP and no answer, authority or
// additional record (it may have a question).
func isErrorReply(b []byte) bool {
	if len(b) < 12 || b[2]&0x80 == 0 {
		return false
	}
	if rc := b[3] & 0x0F; rc != dns.RcodeFormatError && rc != dns.RcodeNotImplemented {
		return false
	}
	return b[6]|b[7]|b[8]|b[9]|b[10]|b[11] == 0
}
