package rrl

// AllowanceCategory is the kind of response being accounted, each with its own
// allowance (the *-per-second keywords). NewAllowanceCategory derives it from the
// response's rcode and section counts; ResponseTupleFromMsg derives it from the
// message itself.
//
//	AllowanceCategory   keyword                rcode  answers  authority
//	AllowanceAnswer     responses-per-second   0      >0
//	AllowanceReferral   referrals-per-second   0      0        >0
//	AllowanceNoData     nodata-per-second      0      0        0
//	AllowanceNXDomain   nxdomains-per-second   3
//	AllowanceError      errors-per-second      anything else
type AllowanceCategory uint8

// The response categories, in markdingo/rrl's order.
const (
	AllowanceAnswer AllowanceCategory = iota
	AllowanceReferral
	AllowanceNoData
	AllowanceNXDomain
	AllowanceError
	AllowanceLast // number of categories; not a category
)

// NewAllowanceCategory returns the category of a response from its rcode and the
// number of records in its answer and authority sections, by the count-based rule of
// markdingo/rrl (kept for compatibility). The rule cannot tell a NODATA response that
// carries the zone's SOA in its authority section from a referral; prefer
// ResponseTupleFromMsg, which looks at the records.
func NewAllowanceCategory(rcode, answerCount, nsCount int) AllowanceCategory {
	switch {
	case rcode == 0 && answerCount > 0:
		return AllowanceAnswer
	case rcode == 0 && nsCount > 0:
		return AllowanceReferral
	case rcode == 0:
		return AllowanceNoData
	case rcode == 3:
		return AllowanceNXDomain
	}
	return AllowanceError
}

// Action is what Debit tells the caller to do with a response.
type Action int

// The actions.
const (
	Send       Action = iota // send the response
	Drop                     // send nothing
	Slip                     // send a truncated response (TC=1) or BADCOOKIE instead
	ActionLast               // number of actions; not an action
)

// IPReason says how the per-client-network limits (requests-per-second,
// all-per-second, exempt-clients) judged a Debit call. It is for statistics and logs.
type IPReason int

// The IP reasons. IPOk to IPCacheFull are markdingo/rrl's; IPExempt and
// IPAllRateLimit are this package's.
const (
	IPOk            IPReason = iota // within requests-per-second
	IPNotConfigured                 // requests-per-second is 0
	IPNotReached                    // not evaluated
	IPRateLimit                     // over requests-per-second
	IPCacheFull                     // kept for compatibility; never returned (the table evicts instead)
	IPExempt                        // the client is in exempt-clients
	IPAllRateLimit                  // over all-per-second
	IPLast                          // number of IP reasons; not a reason
)

// RTReason says how the response account of the response tuple judged a Debit call.
type RTReason int

// The response tuple reasons. RTOk to RTCacheFull are markdingo/rrl's.
const (
	RTOk            RTReason = iota // the account is in credit
	RTNotConfigured                 // the category's allowance is 0
	RTNotReached                    // not evaluated (an IP limit decided first)
	RTRateLimit                     // the account is out of credit
	RTNotUDP                        // not UDP: response accounts do not apply
	RTCacheFull                     // kept for compatibility; never returned (the table evicts instead)
	RTLast                          // number of RT reasons; not a reason
)

// ResponseTuple identifies the response account a response is debited from, together
// with the client network. Fill it from the response about to be sent:
//
//   - Class and Type: the question's class and type.
//   - AllowanceCategory: the response's category (see NewAllowanceCategory).
//   - SalientName: for NXDOMAIN and referrals, the owner of the first authority
//     record (empty when there is none); for answers synthesised from a wildcard,
//     "*." followed by the wildcard's origin; otherwise the question name.
//     Names compare case-insensitively.
//
// A response that carries only a COOKIE option (RFC 7873 section 5.4) has only its
// category set.
type ResponseTuple struct {
	Class uint16
	Type  uint16
	AllowanceCategory
	SalientName string
}
