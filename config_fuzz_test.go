package rrl

import (
	"errors"
	"net"
	"net/netip"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

// FuzzSetValue feeds arbitrary values to every keyword: SetValue never panics, a
// refused value leaves the Config exactly as it was, and an accepted one gives a
// Config that New accepts and whose RRL debits.
func FuzzSetValue(f *testing.F) {
	for _, seed := range []struct{ kw, v string }{
		{"window", "15"}, {"window", "0x10"}, {"responses-per-second", "1e-300"},
		{"responses-per-second", "1e7"}, {"qps-scale", "0.0000001"}, {"slip-ratio", "+3"},
		{"exempt-clients", "::ffff:192.0.2.0/120,10.0.0.0/8"}, {"report-only", "T"},
		{"ipv4-request-levels", "32:1 16:16"}, {"max-table-size", "1"}, {"ipv6-prefix-length", "057"},
		{"cookie-secret", "0123456789abcdef0123456789abcdef"}, {"cookie-secret", "0123456789abcdef0123456789abcdeg"},
	} {
		f.Add(uint8(slicesIndex(ConfigKeywords(), seed.kw)), seed.v)
	}
	f.Fuzz(func(t *testing.T, k uint8, value string) {
		kws := ConfigKeywords()
		kw := kws[int(k)%len(kws)]
		c := NewConfig()
		c.SetValue("responses-per-second", "3")
		before := c.clone()
		if err := c.SetValue(kw, value); err != nil {
			var ce *ConfigError
			want := value
			if kw == "cookie-secret" {
				// A secret is never shown, even a refused one.
				want = redacted
				if len(value) >= 4 && strings.Contains(err.Error(), value) {
					t.Fatalf("error %v shows the secret", err)
				}
			}
			if !errors.As(err, &ce) || ce.Keyword != kw || ce.Value != want {
				t.Fatalf("error %v does not name %q and %q", err, kw, want)
			}
			if !reflect.DeepEqual(c, before) {
				t.Fatalf("refused %s=%q changed the Config", kw, value)
			}
			return
		}
		r, err := New(c)
		if err != nil {
			t.Fatalf("accepted %s=%q, then New: %v", kw, value, err)
		}
		for range 3 {
			act, ipr, rtr := r.Debit(&net.UDPAddr{IP: net.IPv4(192, 0, 2, 1)}, &ResponseTuple{SalientName: strings.ToUpper(value)})
			if act >= ActionLast || ipr >= IPLast || rtr >= RTLast || act < 0 {
				t.Fatalf("%s=%q: Debit returned %v %v %v", kw, value, act, ipr, rtr)
			}
		}
	})
}

func slicesIndex(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return 0
}

// FuzzDebit debits arbitrary sources and tuples: Debit never panics, returns
// values in range, treats a name and its upper-case form as one account, and in
// report-only mode always sends.
func FuzzDebit(f *testing.F) {
	f.Add([]byte{192, 0, 2, 1}, uint16(53), true, uint16(1), uint8(0), "www.example.test.", false, uint8(2))
	f.Add(netip.MustParseAddr("::ffff:192.0.2.1").AsSlice(), uint16(0), true, uint16(28), uint8(3), "", false, uint8(0))
	f.Add(netip.MustParseAddr("2001:db8::1").AsSlice(), uint16(1), false, uint16(0), uint8(4), "\xff\x00A", true, uint8(1))
	f.Add([]byte{1, 2, 3}, uint16(9), true, uint16(255), uint8(200), strings.Repeat("Ab", 200), false, uint8(10))
	f.Fuzz(func(t *testing.T, ip []byte, port uint16, isUDP bool, qtype uint16, cat uint8, name string, report bool, slipRatio uint8) {
		c := &fakeClock{now: t0}
		cfg := NewConfig()
		cfg.SetNowFunc(func() time.Time { return c.now })
		cfg.SetValue("responses-per-second", "1")
		cfg.SetValue("requests-per-second", "50")
		cfg.SetValue("all-per-second", "30")
		cfg.SetValue("max-table-size", "8")
		cfg.SetValue("slip-ratio", strconv.Itoa(int(slipRatio%11)))
		if report {
			cfg.SetValue("report-only", "true")
		}
		r := NewRRL(cfg)
		tuple := ResponseTuple{Class: 1, Type: qtype, AllowanceCategory: AllowanceCategory(cat), SalientName: name}
		upper := tuple
		upper.SalientName = asciiUpper(name)
		var src net.Addr = &net.TCPAddr{IP: ip, Port: int(port)}
		if isUDP {
			src = &net.UDPAddr{IP: ip, Port: int(port)}
		}
		var acts []Action
		for i := range 4 {
			tp := &tuple
			if i%2 == 1 {
				tp = &upper
			}
			act, ipr, rtr := r.Debit(src, tp)
			if act < 0 || act >= ActionLast || ipr < 0 || ipr >= IPLast || rtr < 0 || rtr >= RTLast {
				t.Fatalf("out of range: %v %v %v", act, ipr, rtr)
			}
			if report && act != Send {
				t.Fatalf("report-only returned %v", act)
			}
			acts = append(acts, act)
		}
		// One response per second per account: the upper-case name shares it.
		if !report && isUDP && cat < uint8(AllowanceLast) && acts[1] == Send {
			t.Fatalf("second debit of one account sent: %v", acts)
		}
		addr, _ := netip.AddrFromSlice(ip)
		r.DebitAddrPort(netip.AddrPortFrom(addr, port), isUDP, &tuple)
		st := r.GetStats(false)
		if st.CacheLength > 8 || st.Actions[Send]+st.Actions[Drop]+st.Actions[Slip] != 5 {
			t.Fatalf("stats %v", st)
		}
	})
}

// asciiUpper upper-cases the ASCII letters of s and nothing else (strings.ToUpper
// would also rewrite invalid UTF-8, which makes another name).
func asciiUpper(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'a' <= c && c <= 'z' {
			b[i] = c - 'a' + 'A'
		}
	}
	return string(b)
}
