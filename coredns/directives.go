package coredns

import "slices"

// After is the plugin that rrl follows in the chain: rrl comes after the plugins
// that observe traffic (prometheus, errors, log, dnstap), so that their metrics and
// logs show what rrl let out, and before every plugin that answers (local, any,
// chaos, acl, cache, file, forward, ...), so that every response passes through it,
// cached ones included. In plugin.cfg: "rrl:github.com/dnsrake/rrl/coredns" on the
// line after "dnstap:dnstap".
const After = "dnstap"

// Directives returns CoreDNS's directive list d with rrl inserted after After (at
// the front, where coredns/rrl puts itself, when d has no After). d is not changed.
func Directives(d []string) []string {
	if slices.Contains(d, Name) {
		return slices.Clone(d)
	}
	i := slices.Index(d, After) + 1
	return slices.Insert(slices.Clone(d), i, Name)
}
