package rrl

import "testing"

func TestStatsCopyAdd(t *testing.T) {
	var a Stats
	a.RPS[AllowanceNXDomain] = 2
	a.Actions[Slip] = 3
	a.IPReasons[IPExempt] = 4
	a.RTReasons[RTNotUDP] = 5
	a.ReportOnly[Drop] = 6
	a.CacheLength = 7
	a.Evictions = 8

	c := a.Copy(false)
	if c != a {
		t.Fatalf("Copy(false) = %v, want %v", c, a)
	}
	b := a
	if c = b.Copy(true); c != a || b != (Stats{}) {
		t.Fatalf("Copy(true) = %v and left %v", c, b)
	}

	b = a
	b.CacheLength = 1
	b.Add(&a)
	want := Stats{CacheLength: 7, Evictions: 16}
	want.RPS[AllowanceNXDomain] = 4
	want.Actions[Slip] = 6
	want.IPReasons[IPExempt] = 8
	want.RTReasons[RTNotUDP] = 10
	want.ReportOnly[Drop] = 12
	if b != want {
		t.Errorf("Add = %v, want %v", b, want)
	}
}

func TestStatsString(t *testing.T) {
	var s Stats
	s.RPS[AllowanceAnswer] = 10
	s.Actions = [ActionLast]int64{7, 2, 1}
	s.IPReasons[IPNotConfigured] = 10
	s.RTReasons[RTOk], s.RTReasons[RTRateLimit] = 7, 3
	s.CacheLength, s.Evictions = 4, 5
	const want = "RPS 10/0/0/0/0 Actions 7/2/1 IPR 0/10/0/0/0/0/0 RTR 7/0/0/3/0/0 L=4/5"
	if got := s.String(); got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	s.ReportOnly = [ActionLast]int64{1, 2, 3}
	if got := (&s).String(); got != want+" RO=1/2/3" {
		t.Errorf("report-only String() = %q", got)
	}
}
