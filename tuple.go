package rrl

import (
	"strings"

	"github.com/miekg/dns"
)

// ResponseTupleFromMsg returns the ResponseTuple of resp, the response a server is
// about to send, for Debit.
//
// wildcardOrigin says whether the answer was synthesised from a wildcard: it is the
// name the wildcard hangs from (for "*.wild.example." that is "wild.example."), or ""
// when the answer was not synthesised. The owner of the wildcard itself
// ("*.wild.example.") is accepted too. All names synthesised from one wildcard share
// one account, answers and NODATA alike, so a flood of random names below a
// wildcard cannot spread over unlimited accounts.
//
// The category comes from the rcode and the records themselves, not only their
// counts:
//
//   - NOERROR with records in the answer section: AllowanceAnswer;
//   - NOERROR, empty answer section, an SOA in the authority section: AllowanceNoData
//     (a negative answer, even though the authority section is not empty);
//   - NOERROR, empty answer section, not authoritative (AA=0), NS records in the
//     authority section: AllowanceReferral (a delegation);
//   - any other NOERROR: AllowanceNoData;
//   - NXDOMAIN: AllowanceNXDomain;
//   - any other rcode, extended rcodes such as BADCOOKIE included: AllowanceError.
//
// The salient name follows the ResponseTuple rules: the owner of the first
// authority record for NXDOMAIN and referrals (empty when there is none), the
// wildcard ("*." and the origin) for synthesised answers, otherwise the question
// name. Class and Type are the first question's. A response without a question (RFC
// 7873 section 5.4: a reply carrying only a COOKIE option) has only its category
// set.
//
// Names are lower-cased (ASCII only, as DNS compares names) so that a client
// randomising the case of its queries (the "0x20" defence) does not open a new
// account per spelling. A name that is already lower case is used as is, without
// allocating; the wildcard origin is made fully qualified.
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
