package rrl

import (
	"fmt"
)

// The names below are the constants' own, as markdingo/rrl prints them, so logs and
// tests written against it keep working.

func (c AllowanceCategory) String() string {
	if int(c) < len(categoryNames) {
		return categoryNames[c]
	}
	return fmt.Sprintf("AllowanceCategory(%d)", uint8(c))
}

var categoryNames = [...]string{"AllowanceAnswer", "AllowanceReferral", "AllowanceNoData", "AllowanceNXDomain", "AllowanceError"}

func (a Action) String() string {
	if a >= 0 && int(a) < len(actionNames) {
		return actionNames[a]
	}
	return fmt.Sprintf("Action(%d)", int(a))
}

var actionNames = [...]string{"Send", "Drop", "Slip"}

func (r IPReason) String() string {
	if r >= 0 && int(r) < len(ipReasonNames) {
		return ipReasonNames[r]
	}
	return fmt.Sprintf("IPReason(%d)", int(r))
}

var ipReasonNames = [...]string{"IPOk", "IPNotConfigured", "IPNotReached", "IPRateLimit", "IPCacheFull", "IPExempt", "IPAllRateLimit"}

func (r RTReason) String() string {
	if r >= 0 && int(r) < len(rtReasonNames) {
		return rtReasonNames[r]
	}
	return fmt.Sprintf("RTReason(%d)", int(r))
}

var rtReasonNames = [...]string{"RTOk", "RTNotConfigured", "RTNotReached", "RTRateLimit", "RTNotUDP", "RTCacheFull"}

// String formats the tuple as class/type, category and salient name.
func (t *ResponseTuple) String() string {
	return fmt.Sprintf("%d/%d %s sn=%s", t.Class, t.Type, t.AllowanceCategory, t.SalientName)
}

// The name tables must cover every constant.
var (
	_ [AllowanceLast]struct{} = [len(categoryNames)]struct{}{}
	_ [ActionLast]struct{}    = [len(actionNames)]struct{}{}
	_ [IPLast]struct{}        = [len(ipReasonNames)]struct{}{}
	_ [RTLast]struct{}        = [len(rtReasonNames)]struct{}{}
)
