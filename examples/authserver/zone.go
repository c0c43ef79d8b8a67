package main

import (
	_ "embed"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/dnsrake/rrl"
	"github.com/miekg/dns"
)

//go:embed example.test.zone
var demoZone string

// zone is one authoritative zone held in memory: enough of RFC 1034 section 4.3.2
// for answers, NODATA, NXDOMAIN, referrals with glue, wildcards and CNAMEs.
type zone struct {
	origin string                         // lower case, fully qualified
	soa    dns.RR                         // the apex SOA, for negative answers
	rrs    map[string]map[uint16][]dns.RR // owner (lower case) -> type -> records
	names  map[string]bool                // owners and the empty non-terminals above them
	cuts   map[string]bool                // delegation points: NS records below the apex
}

// loadZone reads a zone in master file format. origin may be empty when the file
// sets $ORIGIN; the zone's origin is the owner of its SOA record.
func loadZone(r io.Reader, origin, file string) (*zone, error) {
	if origin != "" {
		origin = dns.Fqdn(origin)
	}
	zp := dns.NewZoneParser(r, origin, file)
	var all []dns.RR
	for rr, ok := zp.Next(); ok; rr, ok = zp.Next() {
		all = append(all, rr)
	}
	if err := zp.Err(); err != nil {
		return nil, err
	}
	z := &zone{rrs: map[string]map[uint16][]dns.RR{}, names: map[string]bool{}, cuts: map[string]bool{}}
	for _, rr := range all {
		if soa, ok := rr.(*dns.SOA); ok {
			if z.soa != nil {
				return nil, fmt.Errorf("%s: more than one SOA record", file)
			}
			z.soa = soa
			z.origin = strings.ToLower(soa.Hdr.Name)
		}
	}
	if z.soa == nil {
		return nil, fmt.Errorf("%s: no SOA record", file)
	}
	for _, rr := range all {
		h := rr.Header()
		owner := strings.ToLower(h.Name)
		if !dns.IsSubDomain(z.origin, owner) {
			return nil, fmt.Errorf("%s: %s is outside the zone %s", file, h.Name, z.origin)
		}
		h.Name = owner
		if z.rrs[owner] == nil {
			z.rrs[owner] = map[uint16][]dns.RR{}
		}
		z.rrs[owner][h.Rrtype] = append(z.rrs[owner][h.Rrtype], rr)
		if h.Rrtype == dns.TypeNS && owner != z.origin {
			z.cuts[owner] = true
		}
		for n := owner; ; {
			z.names[n] = true
			if n == z.origin {
				break
			}
			n = parent(n)
		}
	}
	if len(z.rrs[z.origin][dns.TypeNS]) == 0 {
		return nil, fmt.Errorf("%s: no NS records at the apex %s", file, z.origin)
	}
	return z, nil
}

// parent returns the name one label up ("." for a top-level name).
func parent(name string) string {
	if i, end := dns.NextLabel(name, 0); !end {
		return name[i:]
	}
	return "."
}

// ServeDNS answers from the zone. It reports answers synthesised from a wildcard
// to the rrl.Handler in front of it, so that they are accounted to the wildcard.
func (z *zone) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	m, origin := z.answer(req)
	if origin != "" {
		rrl.SetWildcardOrigin(w, origin)
	}
	if opt := req.IsEdns0(); opt != nil {
		m.SetEdns0(ednsPayload, false)
	}
	if _, udp := w.RemoteAddr().(*net.UDPAddr); udp {
		size := dns.MinMsgSize
		if opt := req.IsEdns0(); opt != nil {
			size = int(min(max(opt.UDPSize(), dns.MinMsgSize), ednsPayload))
		}
		m.Truncate(size)
	}
	w.WriteMsg(m)
}

// ednsPayload is the largest UDP response the server sends (DNS flag day 2020).
const ednsPayload = 1232

// answer returns the response to req and, for a response synthesised from a
// wildcard, the wildcard's origin.
func (z *zone) answer(req *dns.Msg) (*dns.Msg, string) {
	m := new(dns.Msg)
	m.SetReply(req)
	if req.Opcode != dns.OpcodeQuery || len(req.Question) != 1 {
		m.Rcode = dns.RcodeNotImplemented
		return m, ""
	}
	q := req.Question[0]
	name := strings.ToLower(q.Name)
	if q.Qclass != dns.ClassINET || !dns.IsSubDomain(z.origin, name) {
		m.Rcode = dns.RcodeRefused
		return m, ""
	}
	if cut := z.cutAbove(name, q.Qtype); cut != "" {
		z.referral(m, cut)
		return m, ""
	}
	m.Authoritative = true
	if set, ok := z.rrs[name]; ok {
		z.fill(m, set, q, "")
		return m, ""
	}
	if z.names[name] { // an empty non-terminal: the name exists, with no data
		m.Ns = append(m.Ns, z.soa)
		return m, ""
	}
	// RFC 4592: the closest encloser's wildcard, if it has one, answers.
	ce := parent(name)
	for !z.names[ce] {
		ce = parent(ce)
	}
	if set, ok := z.rrs["*."+ce]; ok {
		z.fill(m, set, q, q.Name)
		return m, ce
	}
	m.Rcode = dns.RcodeNameError
	m.Ns = append(m.Ns, z.soa)
	return m, ""
}

// cutAbove returns the highest delegation point at or above name, or "". A DS
// query at the cut itself belongs to the parent (RFC 4035 section 3.1.4.1).
func (z *zone) cutAbove(name string, qtype uint16) string {
	cut := ""
	for n := name; n != z.origin; n = parent(n) {
		if z.cuts[n] && !(n == name && qtype == dns.TypeDS) {
			cut = n
		}
	}
	return cut
}

// referral fills m with the delegation at cut: its NS records and their glue.
func (z *zone) referral(m *dns.Msg, cut string) {
	m.Authoritative = false
	for _, rr := range z.rrs[cut][dns.TypeNS] {
		m.Ns = append(m.Ns, rr)
		target := strings.ToLower(rr.(*dns.NS).Ns)
		for _, t := range []uint16{dns.TypeA, dns.TypeAAAA} {
			m.Extra = append(m.Extra, z.rrs[target][t]...)
		}
	}
}

// fill answers q from the records of one owner: the records of the type asked for,
// a CNAME, or NODATA. synthesised is the name to give wildcard records, "" for
// records answered as they are.
func (z *zone) fill(m *dns.Msg, set map[uint16][]dns.RR, q dns.Question, synthesised string) {
	rrs := set[q.Qtype]
	if len(rrs) == 0 {
		rrs = set[dns.TypeCNAME]
	}
	if len(rrs) == 0 {
		m.Ns = append(m.Ns, z.soa)
		return
	}
	for _, rr := range rrs {
		if synthesised != "" {
			rr = dns.Copy(rr)
			rr.Header().Name = synthesised
		}
		m.Answer = append(m.Answer, rr)
	}
}
