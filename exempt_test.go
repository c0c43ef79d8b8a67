package rrl

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
	"testing/quick"
)

// containsRef is the reference: a linear scan with netip.Prefix.Contains.
func containsRef(prefixes []netip.Prefix, a netip.Addr) bool {
	for _, p := range prefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// randomPrefix returns a prefix of a random family and length; long lengths are as
// likely as short ones, and /0 happens.
func randomPrefix(r *rand.Rand) netip.Prefix {
	if r.IntN(2) == 0 {
		var b [4]byte
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		return netip.PrefixFrom(netip.AddrFrom4(b), r.IntN(33))
	}
	var b [16]byte
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	if r.IntN(8) == 0 { // a 4in6 prefix stays IPv6 for Contains
		b = netip.AddrFrom4([4]byte{b[0], b[1], b[2], b[3]}).As16()
	}
	return netip.PrefixFrom(netip.AddrFrom16(b), r.IntN(129))
}

// nearAddr returns an address in or just outside p: p's address with a random bit
// flipped, often the first bit past the prefix, sometimes one inside it.
func nearAddr(r *rand.Rand, p netip.Prefix) netip.Addr {
	a := p.Addr()
	b := a.As16()
	off := 0
	if a.Is4() {
		off = 96
	}
	bit := p.Bits() + r.IntN(3) - 1
	if bit < 0 || bit >= a.BitLen() {
		bit = r.IntN(a.BitLen())
	}
	b[(off+bit)/8] ^= 0x80 >> ((off + bit) % 8)
	// Randomise the bits past the flipped one.
	for i := off + bit + 1; i < 128; i++ {
		if r.IntN(2) == 0 {
			b[i/8] ^= 0x80 >> (i % 8)
		}
	}
	out := netip.AddrFrom16(b)
	if a.Is4() {
		out = out.Unmap()
	}
	return out
}

// TestPrefixSetMatchesLinearScan: for random sets of random prefixes (some masked,
// some not), the trie answers as the linear scan does for random addresses, for
// addresses at the edges of the prefixes, for IPv4-mapped and zoned addresses and
// for the zero Addr.
func TestPrefixSetMatchesLinearScan(t *testing.T) {
	r := rand.New(rand.NewPCG(14, 2))
	for _, n := range []int{0, 1, 2, 5, 30, 300, 2000} {
		for trial := range 20 {
			prefixes := make([]netip.Prefix, n)
			for i := range prefixes {
				prefixes[i] = randomPrefix(r)
				if r.IntN(2) == 0 {
					prefixes[i] = prefixes[i].Masked()
				}
				if r.IntN(4) != 0 && prefixes[i].Bits() < 8 { // keep most sets selective
					prefixes[i] = netip.PrefixFrom(prefixes[i].Addr(), prefixes[i].Addr().BitLen())
				}
			}
			s := newPrefixSet(prefixes)
			check := func(a netip.Addr) {
				if got, want := s.contains(a), containsRef(prefixes, a); got != want {
					t.Fatalf("%d prefixes (trial %d): contains(%v) = %v, linear scan %v", n, trial, a, got, want)
				}
			}
			check(netip.Addr{})
			for range 200 {
				check(randomPrefix(r).Addr())
				if n > 0 {
					p := prefixes[r.IntN(n)]
					a := nearAddr(r, p)
					check(a)
					check(p.Addr())
					if a.Is4() {
						check(netip.AddrFrom16(a.As16())) // mapped: IPv6 for Contains
					} else {
						check(a.WithZone("eth0"))
					}
				}
			}
		}
	}
}

// TestPrefixSetQuick: testing/quick over one prefix per family and an address.
func TestPrefixSetQuick(t *testing.T) {
	f := func(p4 [4]byte, l4 uint8, p6 [16]byte, l6 uint8, a4 [4]byte, a6 [16]byte) bool {
		prefixes := []netip.Prefix{
			netip.PrefixFrom(netip.AddrFrom4(p4), int(l4%33)),
			netip.PrefixFrom(netip.AddrFrom16(p6), int(l6%129)),
		}
		s := newPrefixSet(prefixes)
		for _, a := range []netip.Addr{netip.AddrFrom4(a4), netip.AddrFrom16(a6), netip.AddrFrom4(p4), netip.AddrFrom16(p6)} {
			if s.contains(a) != containsRef(prefixes, a) {
				return false
			}
		}
		return true
	}
	if err := quick.Check(f, &quick.Config{MaxCount: 20000}); err != nil {
		t.Fatal(err)
	}
}

// TestExemptManyPrefixes: Debit and the Limiter exempt exactly the sources the
// linear scan finds in a list of 1,000 prefixes parsed from exempt-clients.
func TestExemptManyPrefixes(t *testing.T) {
	r := rand.New(rand.NewPCG(17, 14))
	list, prefixes := exemptList(r, 1000)
	rl, _ := newTestRRL(t, "responses-per-second", "1", "exempt-clients", list)
	lim := testLimiter(t, 1, "exempt-clients", list)
	for i := range 5000 {
		var a netip.Addr
		if i%2 == 0 {
			a = nearAddr(r, prefixes[r.IntN(len(prefixes))])
		} else {
			a = randomPrefix(r).Addr()
		}
		want := containsRef(prefixes, a.Unmap())
		if _, ipr, _ := rl.DebitAddrPort(netip.AddrPortFrom(a, 53), true, &www); (ipr == IPExempt) != want {
			t.Fatalf("Debit(%v): %v, exempt by the linear scan: %v", a, ipr, want)
		}
		if v := lim.decideAt(netip.AddrPortFrom(a, 53), 1e9, 0); v.Exempt != want {
			t.Fatalf("Limiter(%v): exempt %v, by the linear scan: %v", a, v.Exempt, want)
		}
	}
}

// exemptList returns n random prefixes of realistic lengths (IPv4 /16 to /32, IPv6
// /32 to /128) as an exempt-clients value and as the Config parses them.
func exemptList(r *rand.Rand, n int) (string, []netip.Prefix) {
	var sb strings.Builder
	for range n {
		p := randomPrefix(r)
		if p.Addr().Is4() {
			p = netip.PrefixFrom(p.Addr(), 16+r.IntN(17))
		} else {
			p = netip.PrefixFrom(p.Addr(), 32+r.IntN(97))
		}
		fmt.Fprintf(&sb, "%v ", p.Masked())
	}
	cfg := NewConfig()
	if err := cfg.SetValue("exempt-clients", sb.String()); err != nil {
		panic(err)
	}
	return sb.String(), cfg.exempt
}

// BenchmarkExempt: Debit and the Limiter with 1,000 exempt-clients prefixes, for a
// source outside them all (the common case: every packet pays the lookup).
func BenchmarkExempt(b *testing.B) {
	list, _ := exemptList(rand.New(rand.NewPCG(1, 1000)), 1000)
	src := netip.MustParseAddrPort("192.0.2.77:5353")
	for _, n := range []struct {
		name, list string
	}{{"none", ""}, {"1000-prefixes", list}} {
		b.Run("Debit/"+n.name, func(b *testing.B) {
			rl, _ := newTestRRL(b, "responses-per-second", "10000000", "exempt-clients", n.list)
			b.ReportAllocs()
			for b.Loop() {
				rl.DebitAddrPort(src, true, &www)
			}
		})
		b.Run("Limiter/"+n.name, func(b *testing.B) {
			l := testLimiter(b, 1e6, "exempt-clients", n.list)
			b.ReportAllocs()
			now := int64(0)
			for b.Loop() {
				now += 1000
				l.allowAt(src, now, 0)
			}
		})
	}
}
