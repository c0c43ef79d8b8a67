package rrl

import (
	"strings"

	"github.com/miekg/dns"
)

// ResponseTupleFromMsg returns the ResponseTuple of resp, the response a server is
// about to send, for Debit: its category from the rcode and the records themselves
// (an SOA in the authority section makes NODATA, NS records without AA a referral),
// and its salient name by the ResponseTuple rules, lower-cased so that a client
// randomising the case of its queries opens no new accounts.
//
// For an answer synthesised from a wildcard, wildcardOrigin is the name the
// wildcard hangs from (for "*.wild.example." that is "wild.example."); otherwise it
// is "". All names synthesised from one wildcard share one account, so a flood of
// random names below it cannot spread over unlimited accounts.
// docs/response-accounts.md has the rules in full.
func ResponseTupleFromMsg(resp *dns.Msg, wildcardOrigin string) ResponseTuple {
	cat := responseCategory(resp)
	t := ResponseTuple{AllowanceCategory: cat}
	if len(resp.Question) == 0 {
		return t
	}
	q := &resp.Question[0]
	t.Class, t.Type = q.Qclass, q.Qtype
	switch {
	case cat == AllowanceNXDomain || cat == AllowanceReferral:
		if len(resp.Ns) > 0 && resp.Ns[0] != nil {
			t.SalientName = lowerName(resp.Ns[0].Header().Name)
		}
	case wildcardOrigin != "":
		t.SalientName = wildcardName(wildcardOrigin)
	default:
		t.SalientName = lowerName(q.Name)
	}
	return t
}

// responseCategory classifies resp by its rcode and section contents (see
// ResponseTupleFromMsg).
func responseCategory(resp *dns.Msg) AllowanceCategory {
	switch resp.Rcode {
	case dns.RcodeSuccess:
	case dns.RcodeNameError:
		return AllowanceNXDomain
	default:
		return AllowanceError
	}
	if len(resp.Answer) > 0 {
		return AllowanceAnswer
	}
	// An SOA in the authority section makes a negative answer whatever else is
	// there; NS records make a delegation only when the server does not claim
	// authority for the answer (a zone apex's own NS records in an
	// authoritative answer are not a referral).
	hasNS := false
	for _, rr := range resp.Ns {
		if rr == nil {
			continue
		}
		switch rr.Header().Rrtype {
		case dns.TypeSOA:
			return AllowanceNoData
		case dns.TypeNS:
			hasNS = true
		}
	}
	if hasNS && !resp.Authoritative {
		return AllowanceReferral
	}
	return AllowanceNoData
}

// wildcardName returns the lower-case, fully qualified owner of the wildcard that
// hangs from origin ("*." + origin). It allocates only when origin is not already
// in that form.
func wildcardName(origin string) string {
	if strings.HasPrefix(origin, "*.") {
		return lowerName(dns.Fqdn(origin)) // already the wildcard's owner
	}
	if origin == "." {
		return "*."
	}
	return lowerName("*." + dns.Fqdn(origin))
}

// lowerName returns s with ASCII upper-case letters mapped to lower case. Bytes
// outside A-Z are kept: DNS names compare case-insensitively in ASCII only, and
// Unicode case mapping would change names that are not valid UTF-8.
func lowerName(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; 'A' <= c && c <= 'Z' {
			return lowerFrom(s, i)
		}
	}
	return s
}

// lowerFrom lower-cases s, whose first upper-case byte is at i.
func lowerFrom(s string, i int) string {
	var b strings.Builder
	b.Grow(len(s))
	b.WriteString(s[:i])
	for ; i < len(s); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		b.WriteByte(c)
	}
	return b.String()
}
