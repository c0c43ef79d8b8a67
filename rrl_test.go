package rrl

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeClock is the clock of an RRL under test.
type fakeClock struct{ now time.Time }

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// newTestRRL returns an RRL on a fake clock reading t0, configured with keyword,
// value pairs.
func newTestRRL(t testing.TB, kv ...string) (*RRL, *fakeClock) {
	t.Helper()
	c := &fakeClock{now: t0}
	cfg := NewConfig()
	cfg.SetNowFunc(func() time.Time { return c.now })
	for i := 0; i+1 < len(kv); i += 2 {
		if err := cfg.SetValue(kv[i], kv[i+1]); err != nil {
			t.Fatal(err)
		}
	}
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r, c
}

func udp(s string) *net.UDPAddr { return &net.UDPAddr{IP: net.ParseIP(s), Port: 5353} }
func tcp(s string) *net.TCPAddr { return &net.TCPAddr{IP: net.ParseIP(s), Port: 5353} }

func answer(qtype uint16, name string) ResponseTuple {
	return ResponseTuple{Class: 1, Type: qtype, AllowanceCategory: AllowanceAnswer, SalientName: name}
}

var www = answer(1, "www.example.test.")

// letters maps actions to the letters of timeline rows: S Send, D Drop, L sLip.
var letters = map[Action]byte{Send: 'S', Drop: 'D', Slip: 'L'}

// debitAt is one row of a timeline: at time t0+at, Debit once per letter of want,
// each expected to return that action and, when reasons is set, ipr and rtr.
type debitAt struct {
	at      time.Duration
	src     net.Addr
	tuple   ResponseTuple
	want    string
	reasons bool
	ipr     IPReason
	rtr     RTReason
}

func runTimeline(t *testing.T, r *RRL, c *fakeClock, rows []debitAt) {
	t.Helper()
	for i, row := range rows {
		c.now = t0.Add(row.at)
		src := row.src
		if src == nil {
			src = udp("192.0.2.1")
		}
		var got []byte
		for range len(row.want) {
			tuple := row.tuple
			act, ipr, rtr := r.Debit(src, &tuple)
			got = append(got, letters[act])
			if row.reasons && (ipr != row.ipr || rtr != row.rtr) {
				t.Errorf("row %d (at %v): reasons %d/%d, want %d/%d", i, row.at, ipr, rtr, row.ipr, row.rtr)
			}
		}
		if string(got) != row.want {
			t.Errorf("row %d (at %v, %v): got %s, want %s", i, row.at, src, got, row.want)
		}
	}
}

func TestBIND918Burst(t *testing.T) {
	// BIND 9.18 at 5 responses per second answers a burst of 60 identical queries
	// with 5 answers, 28 slips and 27 drops, slipping first.
	r, c := newTestRRL(t, "responses-per-second", "5")
	runTimeline(t, r, c, []debitAt{
		{at: 0, tuple: www, want: "SSSSS" + strings.Repeat("LD", 27) + "L"},
	})
	st := r.GetStats(false)
	if st.Actions != [ActionLast]int64{Send: 5, Drop: 27, Slip: 28} {
		t.Errorf("actions %v", st.Actions)
	}
	if st.RTReasons[RTOk] != 5 || st.RTReasons[RTRateLimit] != 55 || st.RPS[AllowanceAnswer] != 60 {
		t.Errorf("stats %v", st)
	}
}

func TestCredit(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		name string
		kv   []string
		rows []debitAt
	}{
		{"initial one second of credit", []string{"responses-per-second", "4"}, []debitAt{
			{at: 0, tuple: www, want: "SSSSD"},
		}},
		{"allowance 1", []string{"responses-per-second", "1"}, []debitAt{
			{at: 0, tuple: www, want: "SD"},
			{at: 999 * ms, tuple: www, want: "D"},  // -1 + 0.999 - 1 = -1.001
			{at: 2999 * ms, tuple: www, want: "D"}, // -1.001 + 2 - 1 = -0.001
			{at: 4999 * ms, tuple: www, want: "S"}, // -0.001 + 2 = 1.999, clamped to 1, - 1 = 0
		}},
		{"credit accrues with time", []string{"responses-per-second", "4"}, []debitAt{
			{at: 0, tuple: www, want: "SSSS"}, // balance 0
			{at: 250 * ms, tuple: www, want: "SD"},
			{at: 1000 * ms, tuple: www, want: "SSD"},
		}},
		{"balance clamped at one second", []string{"responses-per-second", "2"}, []debitAt{
			{at: 0, tuple: www, want: "S"},
			{at: 10 * time.Second, tuple: www, want: "SSD"},
		}},
		{"balance clamped at minus window", []string{"responses-per-second", "2", "window", "3"}, []debitAt{
			{at: 0, tuple: www, want: "SS" + strings.Repeat("D", 98)}, // -3, not -49
			{at: 3500 * ms, tuple: www, want: "SD"},                   // 0.5 left
		}},
		{"minus window holds when the window is long", []string{"responses-per-second", "2", "window", "60"}, []debitAt{
			{at: 0, tuple: www, want: "SS" + strings.Repeat("D", 98)}, // -49
			{at: 3500 * ms, tuple: www, want: "D"},                    // -45.5 - 0.5 = -46
			{at: 10 * time.Second, tuple: www, want: "D"},             // -39.5 - 0.5: not clamped at -15
			{at: 50500 * ms, tuple: www, want: "SD"},                  // -40 + 40.5 = 0.5

		}},
		{"allowance below one", []string{"responses-per-second", "0.5"}, []debitAt{
			// The credit cap is raised to one response's cost (2 s): one response
			// every two seconds.
			{at: 0, tuple: www, want: "SD"},                 // 2 - 2 = 0, then -2
			{at: 3900 * ms, tuple: www, want: "D"},          // -2 + 3.9 - 2 = -0.1
			{at: 6 * time.Second, tuple: www, want: "SD"},   // -0.1 + 2.1 = 2, - 2 = 0
			{at: 100 * time.Second, tuple: www, want: "SD"}, // capped at 2 s of credit
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, c := newTestRRL(t, append(tc.kv, "slip-ratio", "0")...)
			runTimeline(t, r, c, tc.rows)
		})
	}
}

func TestSlipRatio(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		ratio string
		rows  []debitAt
	}{
		{"0", []debitAt{{at: 0, tuple: www, want: "SSDDDDDD"}}},
		{"1", []debitAt{{at: 0, tuple: www, want: "SSLLLLLL"}}},
		{"2", []debitAt{
			{at: 0, tuple: www, want: "SSLDLDL"},
			// The countdown carries over into the next burst (the L above left it
			// at 1: the next limited response drops)...
			{at: 1000 * ms, tuple: www, want: "DLDL"},
			// ...and a balance of exactly zero is not limited and does not count
			// down: -3 (the window) + 3.5 = 0.5, - 0.5 = 0 (S), then D as it
			// would have been.
			{at: 4500 * ms, tuple: www, want: "SDL"},
			// Full recovery resets it: the first limited response slips again.
			{at: 60 * time.Second, tuple: www, want: "SSL"},
		}},
		{"10", []debitAt{{at: 0, tuple: www, want: "SS" + "L" + strings.Repeat("D", 9) + "L" + "DD"}}},
	} {
		t.Run("slip-ratio="+tc.ratio, func(t *testing.T) {
			r, c := newTestRRL(t, "responses-per-second", "2", "slip-ratio", tc.ratio, "window", "3")
			runTimeline(t, r, c, tc.rows)
		})
	}
}

// sameAccount reports whether the Debit of b after one of a in a fresh RRL with an
// allowance of one response per second is charged to a's account.
func sameAccount(t *testing.T, kv []string, srcA net.Addr, a ResponseTuple, srcB net.Addr, b ResponseTuple) bool {
	t.Helper()
	kv = append([]string{"responses-per-second", "1", "slip-ratio", "0"}, kv...)
	r, _ := newTestRRL(t, kv...)
	if act, _, _ := r.Debit(srcA, &a); act != Send {
		t.Fatalf("first debit: %v", act)
	}
	act, _, _ := r.Debit(srcB, &b)
	return act == Drop
}

func TestAccountKeys(t *testing.T) {
	v4, v6 := udp("192.0.2.1"), udp("2001:db8:0:1::1")
	tuple := func(cat AllowanceCategory, qtype uint16, name string) ResponseTuple {
		return ResponseTuple{Class: 1, Type: qtype, AllowanceCategory: cat, SalientName: name}
	}
	for _, tc := range []struct {
		name       string
		kv         []string
		srcA, srcB net.Addr
		a, b       ResponseTuple
		same       bool
	}{
		{"answer: same qtype and name", nil, v4, v4, tuple(AllowanceAnswer, 1, "a.test."), tuple(AllowanceAnswer, 1, "a.test."), true},
		{"answer: qtype differs", nil, v4, v4, tuple(AllowanceAnswer, 1, "a.test."), tuple(AllowanceAnswer, 28, "a.test."), false},
		{"answer: name differs", nil, v4, v4, tuple(AllowanceAnswer, 1, "a.test."), tuple(AllowanceAnswer, 1, "b.test."), false},
		{"answer: case folds", nil, v4, v4, tuple(AllowanceAnswer, 1, "WwW.ExAmPlE.tEsT."), tuple(AllowanceAnswer, 1, "www.example.test."), true},
		{"answer: long names fold", nil, v4, v4,
			tuple(AllowanceAnswer, 1, strings.Repeat("ABCDEFGHIJKLMNOPQRSTUVWXYZ.", 9)),
			tuple(AllowanceAnswer, 1, strings.Repeat("abcdefghijklmnopqrstuvwxyz.", 9)), true},
		{"answer: only ASCII folds", nil, v4, v4, tuple(AllowanceAnswer, 1, "\xc9.test."), tuple(AllowanceAnswer, 1, "\xe9.test."), false},
		{"answer: class is not part of the key", nil, v4, v4,
			ResponseTuple{Class: 1, Type: 1, SalientName: "a.test."}, ResponseTuple{Class: 3, Type: 1, SalientName: "a.test."}, true},
		{"nodata: qtype ignored", nil, v4, v4, tuple(AllowanceNoData, 1, "a.test."), tuple(AllowanceNoData, 28, "a.test."), true},
		{"nodata: name differs", nil, v4, v4, tuple(AllowanceNoData, 1, "a.test."), tuple(AllowanceNoData, 1, "b.test."), false},
		{"nxdomain: qtype ignored", nil, v4, v4, tuple(AllowanceNXDomain, 1, "test."), tuple(AllowanceNXDomain, 16, "TEST."), true},
		{"nxdomain: name differs", nil, v4, v4, tuple(AllowanceNXDomain, 1, "a.test."), tuple(AllowanceNXDomain, 1, "b.test."), false},
		{"referral: same", nil, v4, v4, tuple(AllowanceReferral, 1, "sub.test."), tuple(AllowanceReferral, 1, "sub.test."), true},
		{"referral: qtype differs", nil, v4, v4, tuple(AllowanceReferral, 1, "sub.test."), tuple(AllowanceReferral, 2, "sub.test."), false},
		{"referral: name differs", nil, v4, v4, tuple(AllowanceReferral, 1, "a.test."), tuple(AllowanceReferral, 1, "b.test."), false},
		{"error: name and qtype ignored", nil, v4, v4, tuple(AllowanceError, 1, "a.test."), tuple(AllowanceError, 16, "b.test."), true},
		{"categories are separate", nil, v4, v4, tuple(AllowanceAnswer, 1, "a.test."), tuple(AllowanceNoData, 1, "a.test."), false},
		{"nxdomain and nodata are separate", nil, v4, v4, tuple(AllowanceNXDomain, 1, "a.test."), tuple(AllowanceNoData, 1, "a.test."), false},

		{"ipv4 /24: same network", nil, udp("192.0.2.1"), udp("192.0.2.254"), www, www, true},
		{"ipv4 /24: next network", nil, udp("192.0.2.1"), udp("192.0.3.1"), www, www, false},
		{"ipv4 /32", []string{"ipv4-prefix-length", "32"}, udp("192.0.2.1"), udp("192.0.2.2"), www, www, false},
		{"ipv4 /8", []string{"ipv4-prefix-length", "8"}, udp("10.1.2.3"), udp("10.200.0.1"), www, www, true},
		{"ipv6 /56: same network", nil, v6, udp("2001:db8:0:ff:ffff::9"), www, www, true},
		{"ipv6 /56: next network", nil, v6, udp("2001:db8:0:100::1"), www, www, false},
		{"ipv6 /64", []string{"ipv6-prefix-length", "64"}, udp("2001:db8::1"), udp("2001:db8:0:1::1"), www, www, false},
		{"ipv6 /96", []string{"ipv6-prefix-length", "96"}, udp("2001:db8::1:0:1"), udp("2001:db8::1:0:ffff"), www, www, true},
		{"ipv6 /128", []string{"ipv6-prefix-length", "128"}, udp("2001:db8::1"), udp("2001:db8::2"), www, www, false},
		{"ipv4 and ipv6 never share", []string{"ipv6-prefix-length", "8"}, udp("192.0.2.1"), udp("::c000:201"), www, www, false},
		{"4-byte and 16-byte forms of one IPv4 address", nil,
			&net.UDPAddr{IP: net.IPv4(192, 0, 2, 1).To4()}, &net.UDPAddr{IP: net.IPv4(192, 0, 2, 9).To16()}, www, www, true},
		{"distinct IPv4-mapped networks are not lumped together", nil, udp("::ffff:192.0.2.1"), udp("::ffff:198.51.100.1"), www, www, false},
		{"ports are not part of the key", nil, &net.UDPAddr{IP: net.ParseIP("192.0.2.1"), Port: 1}, &net.UDPAddr{IP: net.ParseIP("192.0.2.1"), Port: 2}, www, www, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := sameAccount(t, tc.kv, tc.srcA, tc.a, tc.srcB, tc.b); got != tc.same {
				t.Errorf("same account: %v, want %v", got, tc.same)
			}
		})
	}
}

func TestAddrForms(t *testing.T) {
	// The same client through every form of source reaches the same account.
	ap := netip.MustParseAddrPort("[::ffff:192.0.2.7]:53")
	r, c := newTestRRL(t, "responses-per-second", "3", "slip-ratio", "0")
	var got []byte
	for _, f := range []func() Action{
		func() Action { a, _, _ := r.Debit(udp("192.0.2.1"), &www); return a },
		func() Action { a, _, _ := r.DebitAddrPort(ap, true, &www); return a },
		func() Action { a, _, _ := r.Debit(fakeAddr{"udp", "192.0.2.9:53"}, &www); return a },
		func() Action { a, _, _ := r.Debit(&net.UDPAddr{IP: net.ParseIP("192.0.2.3").To4()}, &www); return a },
	} {
		got = append(got, letters[f()])
	}
	if string(got) != "SSSD" {
		t.Errorf("got %s, want SSSD", got)
	}
	c.now = c.now.Add(time.Hour)
	// Other transports, unknown address types and nil never panic.
	for _, src := range []net.Addr{nil, (*net.UDPAddr)(nil), (*net.TCPAddr)(nil), (*net.IPAddr)(nil),
		&net.IPAddr{IP: net.ParseIP("192.0.2.1")}, &net.UnixAddr{Name: "/x", Net: "unixgram"},
		fakeAddr{"udp", "garbage"}, fakeAddr{"udp6", "[fe80::1%eth0]:53"}, fakeAddr{"udp", "192.0.2.1"},
		&net.UDPAddr{IP: net.IP{1, 2, 3}}} {
		act, _, rtr := r.Debit(src, &www)
		if act >= ActionLast || rtr >= RTLast {
			t.Errorf("%v: %v %v", src, act, rtr)
		}
	}
	// A nil tuple is the zero tuple: an answer for the empty name.
	if act, _, rtr := r.Debit(udp("203.0.113.1"), nil); act != Send || rtr != RTOk {
		t.Errorf("nil tuple: %v %v", act, rtr)
	}
}

// fakeAddr is a net.Addr of a type Debit does not know.
type fakeAddr struct{ network, s string }

func (a fakeAddr) Network() string { return a.network }
func (a fakeAddr) String() string  { return a.s }

func TestTransportsAndLimits(t *testing.T) {
	v4 := udp("192.0.2.1")
	for _, tc := range []struct {
		name string
		kv   []string
		rows []debitAt
	}{
		{"TCP is not response-limited", []string{"responses-per-second", "1"}, []debitAt{
			{src: tcp("192.0.2.1"), tuple: www, want: "SSSS", reasons: true, ipr: IPNotConfigured, rtr: RTNotUDP},
			{src: v4, tuple: www, want: "S", reasons: true, ipr: IPNotConfigured, rtr: RTOk},
			{src: v4, tuple: www, want: "L", reasons: true, ipr: IPNotConfigured, rtr: RTRateLimit},
		}},
		{"requests-per-second comes first, on every transport", []string{"responses-per-second", "100", "requests-per-second", "2"}, []debitAt{
			{src: v4, tuple: www, want: "S", reasons: true, ipr: IPOk, rtr: RTOk},
			{src: tcp("192.0.2.77"), tuple: www, want: "S", reasons: true, ipr: IPOk, rtr: RTNotUDP},
			{src: tcp("192.0.2.1"), tuple: www, want: "D", reasons: true, ipr: IPRateLimit, rtr: RTNotReached},
			{src: v4, tuple: www, want: "DDDD", reasons: true, ipr: IPRateLimit, rtr: RTNotReached}, // never slipped
			{src: udp("192.0.3.1"), tuple: www, want: "SS", reasons: true, ipr: IPOk, rtr: RTOk},
			// The response account was charged once only: 100 per second stays in credit.
			{at: 10 * time.Second, src: v4, tuple: www, want: "SS", reasons: true, ipr: IPOk, rtr: RTOk},
		}},
		{"disabled categories", []string{"responses-per-second", "0", "nxdomains-per-second", "1"}, []debitAt{
			{src: v4, tuple: www, want: "SSSS", reasons: true, ipr: IPNotConfigured, rtr: RTNotConfigured},
			{src: v4, tuple: ResponseTuple{AllowanceCategory: AllowanceNoData, SalientName: "a."}, want: "SSS", reasons: true, ipr: IPNotConfigured, rtr: RTNotConfigured},
			{src: v4, tuple: ResponseTuple{AllowanceCategory: AllowanceNXDomain, SalientName: "a."}, want: "SL"},
			{src: v4, tuple: ResponseTuple{AllowanceCategory: AllowanceLast}, want: "SS", reasons: true, ipr: IPNotConfigured, rtr: RTNotConfigured},
		}},
		{"unset categories follow responses-per-second", []string{"responses-per-second", "1", "errors-per-second", "0"}, []debitAt{
			{src: v4, tuple: ResponseTuple{AllowanceCategory: AllowanceReferral, SalientName: "a."}, want: "SL"},
			{src: v4, tuple: ResponseTuple{AllowanceCategory: AllowanceError}, want: "SSS", reasons: true, ipr: IPNotConfigured, rtr: RTNotConfigured},
		}},
		{"all-per-second limits every UDP response of a network, never slipped", []string{"responses-per-second", "100", "all-per-second", "2", "slip-ratio", "1"}, []debitAt{
			{src: v4, tuple: answer(1, "a."), want: "S", reasons: true, ipr: IPNotConfigured, rtr: RTOk},
			{src: udp("192.0.2.200"), tuple: answer(28, "b."), want: "S", reasons: true, ipr: IPNotConfigured, rtr: RTOk},
			{src: v4, tuple: answer(1, "c."), want: "DD", reasons: true, ipr: IPAllRateLimit, rtr: RTNotReached},
			{src: v4, tuple: ResponseTuple{AllowanceCategory: AllowanceError}, want: "D", reasons: true, ipr: IPAllRateLimit, rtr: RTNotReached},
			{src: tcp("192.0.2.1"), tuple: answer(1, "c."), want: "S", reasons: true, ipr: IPNotConfigured, rtr: RTNotUDP},
			{src: udp("192.0.3.1"), tuple: answer(1, "a."), want: "S", reasons: true, ipr: IPNotConfigured, rtr: RTOk},
			{at: 3 * time.Second, src: v4, tuple: answer(1, "a."), want: "SS"},
		}},
		{"all-per-second applies to disabled categories too", []string{"all-per-second", "1", "slip-ratio", "1"}, []debitAt{
			{src: v4, tuple: www, want: "S", reasons: true, ipr: IPNotConfigured, rtr: RTNotConfigured},
			{src: v4, tuple: www, want: "D", reasons: true, ipr: IPAllRateLimit, rtr: RTNotReached},
		}},
		{"exempt clients", []string{"responses-per-second", "1", "requests-per-second", "1", "exempt-clients", "192.0.2.0/25, 2001:db8::1"}, []debitAt{
			{src: v4, tuple: www, want: "SSSS", reasons: true, ipr: IPExempt, rtr: RTNotReached},
			{src: tcp("192.0.2.2"), tuple: www, want: "SS", reasons: true, ipr: IPExempt, rtr: RTNotReached},
			{src: udp("::ffff:192.0.2.3"), tuple: www, want: "SS", reasons: true, ipr: IPExempt, rtr: RTNotReached},
			{src: udp("2001:db8::1"), tuple: www, want: "SS", reasons: true, ipr: IPExempt, rtr: RTNotReached},
			// Same /24 client network, outside the exempt /25: limited.
			{src: udp("192.0.2.200"), tuple: www, want: "SD"},
			{src: udp("2001:db8::2"), tuple: www, want: "SD"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, c := newTestRRL(t, tc.kv...)
			runTimeline(t, r, c, tc.rows)
		})
	}
}

func TestReportOnly(t *testing.T) {
	r, c := newTestRRL(t, "responses-per-second", "1", "requests-per-second", "3", "report-only", "")
	runTimeline(t, r, c, []debitAt{
		{tuple: www, want: "S", reasons: true, ipr: IPOk, rtr: RTOk},
		{tuple: www, want: "SS", reasons: true, ipr: IPOk, rtr: RTRateLimit},
		{tuple: www, want: "SS", reasons: true, ipr: IPRateLimit, rtr: RTNotReached},
	})
	st := r.GetStats(false)
	if st.Actions != [ActionLast]int64{Send: 5} {
		t.Errorf("actions %v", st.Actions)
	}
	if st.ReportOnly != [ActionLast]int64{Send: 1, Slip: 1, Drop: 3} {
		t.Errorf("report-only counts %v", st.ReportOnly)
	}
}

func TestQPSScale(t *testing.T) {
	ms := time.Millisecond
	r, c := newTestRRL(t, "responses-per-second", "10", "qps-scale", "10", "slip-ratio", "0")
	var rows []debitAt
	// Second 0: 100 queries from 100 networks, each with a full allowance of 10.
	for i := range 100 {
		rows = append(rows, debitAt{at: time.Duration(i) * ms, src: udp(fmt.Sprintf("10.0.%d.1", i)), tuple: www, want: "S"})
	}
	rows = append(rows,
		// Second 1: 100 queries per second is 10 times qps-scale: allowances are
		// divided by 10, to 1 per second.
		debitAt{at: 1000 * ms, src: udp("192.0.2.1"), tuple: www, want: "SD"},
		// Second 3: second 2 had no queries: no scaling.
		debitAt{at: 3000 * ms, src: udp("198.51.100.1"), tuple: www, want: "SSSSSSSSSSD"},
	)
	runTimeline(t, r, c, rows)

	// Without qps-scale the same load changes nothing.
	r, c = newTestRRL(t, "responses-per-second", "10", "slip-ratio", "0")
	runTimeline(t, r, c, append(rows[:100:100], debitAt{at: 1000 * ms, src: udp("192.0.2.1"), tuple: www, want: "SSSSSSSSSSD"}))
}

// TestQPSScaleExtremeSaturates: with the longest window, an allowance whose cost is
// 2048 s and 2^21 queries in the previous second against a qps-scale of 1, the scaled
// cost is 2^32 s. Mul saturates it (then maxCost caps it) instead of wrapping it to 0,
// which would have sent every response.
func TestQPSScaleExtremeSaturates(t *testing.T) {
	r, c := newTestRRL(t, "window", "3600", "responses-per-second", "0.00048828125",
		"qps-scale", "1", "slip-ratio", "0")
	p := r.state.Load()
	if got, want := p.costs[AllowanceAnswer], fixedFromInt(2048); got != want {
		t.Fatalf("cost %v, want %v", got.Float64(), want.Float64())
	}
	src := tcp("203.0.113.1") // TCP: counted for qps-scale, no response account
	for range 1 << 21 {
		r.Debit(src, &www)
	}
	c.now = t0.Add(time.Second)
	runTimeline(t, r, c, []debitAt{{at: time.Second, src: udp("192.0.2.1"), tuple: www, want: "SDD"}})
	if got := p.scaled(fixedFromInt(2048), fixedFromInt(1<<21)); got != p.maxCost {
		t.Errorf("scaled(2048 s, 2^21) = %v, want maxCost %v", got.Float64(), p.maxCost.Float64())
	}
}

func TestTimeSteppingBackwards(t *testing.T) {
	for _, back := range []time.Time{t0.Add(-5 * time.Second), {}, time.Unix(0, 0), t0.Add(-100 * 365 * 24 * time.Hour)} {
		r, c := newTestRRL(t, "responses-per-second", "1", "slip-ratio", "0", "requests-per-second", "1000")
		var got []byte
		debit := func(at time.Time, n int) {
			c.now = at
			for range n {
				act, _, _ := r.Debit(udp("192.0.2.1"), &www)
				got = append(got, letters[act])
			}
		}
		debit(t0.Add(10*time.Second), 2) // S (0), D (-1)
		debit(back, 1)                   // time stands still: D (-2), no credit
		debit(t0.Add(10*time.Second), 1) // still no credit: D (-3)
		debit(t0.Add(12*time.Second), 1) // -1 - 1: D
		debit(t0.Add(14*time.Second), 1) // 0 - 1: D
		debit(t0.Add(16*time.Second), 1) // 1 - 1 = 0: S
		if string(got) != "SDDDDDS" {
			t.Errorf("back to %v: got %s, want SDDDDDS", back, got)
		}
	}
	// Jumps far forward, beyond what a fixed holds, neither panic nor overflow.
	r, c := newTestRRL(t, "responses-per-second", "2", "slip-ratio", "0")
	runTimeline(t, r, c, []debitAt{
		{at: 0, tuple: www, want: "SSD"},
		{at: 200 * 365 * 24 * time.Hour, tuple: www, want: "SSD"},
		{at: 290 * 365 * 24 * time.Hour, tuple: www, want: "D"}, // stands still at 68 years
		{at: 0, tuple: www, want: "D"},
	})
	// An RRL whose clock reads the zero Time works too.
	var zero time.Time
	cfg := NewConfig()
	cfg.SetNowFunc(func() time.Time { return zero })
	cfg.SetValue("responses-per-second", "1")
	cfg.SetValue("slip-ratio", "0")
	r = NewRRL(cfg)
	var got []byte
	for _, at := range []time.Duration{0, 0, time.Second, 1500 * time.Millisecond, 4 * time.Second} {
		zero = time.Time{}.Add(at)
		act, _, _ := r.Debit(udp("192.0.2.1"), &www)
		got = append(got, letters[act])
	}
	if string(got) != "SDDDS" { // balances 0, -1, -1, -1.5, 0
		t.Errorf("zero clock: got %s, want SDDDS", got)
	}
}

func TestGetStats(t *testing.T) {
	r, _ := newTestRRL(t, "responses-per-second", "1", "slip-ratio", "0")
	r.Debit(udp("192.0.2.1"), &www)
	r.Debit(udp("192.0.2.1"), &www)
	r.Debit(udp("198.51.100.1"), &ResponseTuple{AllowanceCategory: AllowanceNXDomain})
	r.Debit(tcp("198.51.100.1"), &www)
	want := Stats{CacheLength: 2}
	want.RPS[AllowanceAnswer], want.RPS[AllowanceNXDomain] = 3, 1
	want.Actions[Send], want.Actions[Drop] = 3, 1
	want.IPReasons[IPNotConfigured] = 4
	want.RTReasons[RTOk], want.RTReasons[RTRateLimit], want.RTReasons[RTNotUDP] = 2, 1, 1
	if got := r.GetStats(true); got != want {
		t.Errorf("GetStats(true) = %v, want %v", got, want)
	}
	if got := r.GetStats(false); got != (Stats{CacheLength: 2}) {
		t.Errorf("after zeroing: %v", got)
	}
}

// TestTableFull floods a small table with spoofed sources, ten times its size,
// while one client network's name is attacked and new legitimate clients arrive.
func TestTableFull(t *testing.T) {
	const size = 1000
	r, c := newTestRRL(t, "responses-per-second", "5", "max-table-size", fmt.Sprint(size), "slip-ratio", "2")
	rng := rand.New(rand.NewPCG(1, 2))
	victim, attacked := udp("198.51.100.7"), answer(255, "victim.test.")
	var attackSent, attackCalls, legitSent, legitCalls int
	step := 100 * time.Microsecond
	for i := range 10 * size {
		c.now = t0.Add(time.Duration(i) * step)
		ip := net.IP(make([]byte, 4))
		putUint32(ip, rng.Uint32())
		r.Debit(&net.UDPAddr{IP: ip, Port: 1234}, &www) // spoofed flood
		for range 3 {                                   // the attack: 30000 queries per second
			attackCalls++
			if act, _, _ := r.Debit(victim, &attacked); act == Send {
				attackSent++
			}
		}
		if i%50 == 0 { // a new legitimate client every 5 ms, asking twice
			src := udp(fmt.Sprintf("2001:db8:%x::1", i))
			for range 2 {
				legitCalls++
				if act, _, _ := r.Debit(src, &www); act == Send {
					legitSent++
				}
			}
		}
		if n := r.GetStats(false).CacheLength; n > size {
			t.Fatalf("table holds %d accounts, more than %d", n, size)
		}
	}
	elapsed := time.Duration(10*size) * step // 1 s
	if max := 5*int(elapsed/time.Second) + 5; attackSent > max {
		t.Errorf("the attack got %d of %d responses sent, want at most %d", attackSent, attackCalls, max)
	}
	if legitSent != legitCalls {
		t.Errorf("legitimate clients got %d of %d responses sent", legitSent, legitCalls)
	}
	st := r.GetStats(false)
	if st.Evictions < 8*size {
		t.Errorf("%d evictions, want at least %d", st.Evictions, 8*size)
	}
	t.Logf("attack %d/%d sent, legitimate %d/%d, %v", attackSent, attackCalls, legitSent, legitCalls, st)
}

func putUint32(b []byte, v uint32) {
	b[0], b[1], b[2], b[3] = byte(v>>24), byte(v>>16), byte(v>>8), byte(v)
}

func TestConcurrentDebit(t *testing.T) {
	r, _ := newTestRRL(t, "responses-per-second", "5", "requests-per-second", "50", "all-per-second", "20",
		"qps-scale", "1000", "max-table-size", "500")
	const workers, calls = 4, 2000
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for range calls {
				src := &net.UDPAddr{IP: net.IPv4(10, byte(rng.IntN(4)), byte(rng.IntN(200)), 1)}
				tuple := ResponseTuple{Type: uint16(rng.IntN(3)), AllowanceCategory: AllowanceCategory(rng.IntN(5)),
					SalientName: fmt.Sprintf("n%d.test.", rng.IntN(20))}
				r.Debit(src, &tuple)
				if rng.IntN(100) == 0 {
					r.GetStats(false)
				}
			}
		})
	}
	wg.Wait()
	st := r.GetStats(false)
	var n int64
	for _, v := range st.Actions {
		n += v
	}
	if n != workers*calls || st.CacheLength > 500 {
		t.Errorf("%d calls counted, want %d; %d accounts", n, workers*calls, st.CacheLength)
	}
}

func TestDebitAllocations(t *testing.T) {
	r, _ := newTestRRL(t, "responses-per-second", "5", "requests-per-second", "50", "all-per-second", "20", "qps-scale", "1000", "max-table-size", "100")
	srcs := []net.Addr{udp("192.0.2.1"), tcp("192.0.2.1"), &net.IPAddr{IP: net.ParseIP("2001:db8::1")}}
	tuple := answer(1, "Mixed.CASE.name.that.is.longer.than.sixty-four.bytes.example.test.")
	i := uint32(0)
	allocs := testing.AllocsPerRun(1000, func() {
		i++
		ip := srcs[0].(*net.UDPAddr).IP
		putUint32(ip[12:], i) // a new client network each time: inserts and evictions
		for _, s := range srcs {
			r.Debit(s, &tuple)
		}
		r.DebitAddrPort(netip.AddrPortFrom(netip.IPv6Loopback(), 53), true, &tuple)
	})
	if allocs != 0 {
		t.Errorf("%v allocations per run", allocs)
	}
}

func TestNew(t *testing.T) {
	if _, err := New(nil); err == nil {
		t.Error("New(nil): no error")
	}
	_, err := New(&Config{})
	var ce *ConfigError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "window") || !strings.Contains(err.Error(), "max-table-size") {
		t.Errorf("New(&Config{}) = %v", err)
	}
	// NewRRL accepts what New refuses, with defaults, and nil.
	for _, cfg := range []*Config{nil, {}} {
		r := NewRRL(cfg)
		if act, _, _ := r.Debit(udp("192.0.2.1"), &www); act != Send || len(r.state.Load().shards) == 0 {
			t.Errorf("NewRRL(%v): %v", cfg, act)
		}
	}
	// The RRL copies the Config.
	cfg := NewConfig()
	cfg.SetValue("responses-per-second", "1")
	cfg.SetValue("slip-ratio", "0")
	r := NewRRL(cfg)
	cfg.SetValue("responses-per-second", "0")
	r.Debit(udp("192.0.2.1"), &www)
	if act, _, _ := r.Debit(udp("192.0.2.1"), &www); act != Drop {
		t.Errorf("a later change to the Config reached the RRL")
	}
}

func TestDefaultClock(t *testing.T) {
	// Without SetNowFunc the coarse clock runs: an account with an allowance of
	// 1000 per second, overdrawn by 0.05 s, earns credit back within a few ticks.
	cfg := NewConfig()
	cfg.SetValue("responses-per-second", "1000")
	cfg.SetValue("slip-ratio", "0")
	r := NewRRL(cfg)
	for range 1050 {
		r.Debit(udp("192.0.2.1"), &www)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		time.Sleep(20 * time.Millisecond)
		if act, _, _ := r.Debit(udp("192.0.2.1"), &www); act == Send {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no credit earned in 5 s")
		}
	}
}

// debitResponse leaves the requests-per-second account alone: a request limiter in
// front of the server already enforced it.
func TestDebitResponseSkipsRequestAccount(t *testing.T) {
	cfg := NewConfig()
	cfg.SetValue("requests-per-second", "1")
	cfg.SetValue("responses-per-second", "100")
	clock := time.Unix(1000, 0)
	cfg.SetNowFunc(func() time.Time { return clock })
	r := NewRRL(cfg)
	src := netip.MustParseAddrPort("192.0.2.1:5353")
	tuple := &ResponseTuple{Class: 1, Type: 1, AllowanceCategory: AllowanceAnswer, SalientName: "a.example."}
	for i := 0; i < 10; i++ {
		if act, ipr, rtr := r.debitResponse(src, tuple); act != Send || ipr != IPNotReached || rtr != RTOk {
			t.Fatalf("debitResponse %d: %v %v %v, want Send IPNotReached RTOk", i, act, ipr, rtr)
		}
	}
	// The same client through DebitAddrPort meets its requests-per-second account,
	// which the calls above did not touch: one second of credit, then limited.
	if act, ipr, _ := r.DebitAddrPort(src, true, tuple); act != Send || ipr != IPOk {
		t.Fatalf("first DebitAddrPort: %v %v, want Send IPOk", act, ipr)
	}
	if act, ipr, _ := r.DebitAddrPort(src, true, tuple); act != Drop || ipr != IPRateLimit {
		t.Fatalf("second DebitAddrPort: %v %v, want Drop IPRateLimit", act, ipr)
	}
}

// TestStatsExactAcrossProcessors counts Debit calls from more Ps than the RRL made
// statistics stripes for (GOMAXPROCS raised after New, so some calls count in the
// spill stripe), while another goroutine keeps taking and zeroing the statistics:
// the snapshots together must account for every call exactly once.
func TestStatsExactAcrossProcessors(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	r, _ := newTestRRL(t, "responses-per-second", "5")
	runtime.GOMAXPROCS(runtime.NumCPU() + 3)
	if len(r.stripes.perP) >= runtime.GOMAXPROCS(0) {
		t.Fatalf("%d stripes for %d Ps: the spill stripe is not exercised", len(r.stripes.perP), runtime.GOMAXPROCS(0))
	}
	const workers, calls = 8, 3000
	var total Stats
	done := make(chan struct{})
	collected := make(chan struct{})
	go func() {
		defer close(collected)
		for {
			select {
			case <-done:
				return
			default:
				st := r.GetStats(true)
				total.Add(&st)
				runtime.Gosched()
			}
		}
	}()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			src := &net.UDPAddr{IP: net.IPv4(10, 1, byte(w), 1)}
			for range calls {
				r.Debit(src, &www)
			}
		})
	}
	wg.Wait()
	close(done)
	<-collected
	st := r.GetStats(true)
	total.Add(&st)
	var actions int64
	for _, v := range total.Actions {
		actions += v
	}
	if actions != workers*calls || total.RPS[AllowanceAnswer] != workers*calls || total.RTReasons[RTOk]+total.RTReasons[RTRateLimit] != workers*calls {
		t.Errorf("counted %d actions, %d answers, %v RT reasons; want %d each", actions, total.RPS[AllowanceAnswer], total.RTReasons, workers*calls)
	}
	if total.Actions[Send] != workers*5 {
		t.Errorf("%d sent, want %d (5 per client network in its first second)", total.Actions[Send], workers*5)
	}
}
