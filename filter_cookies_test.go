package rrl

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Kernel verdicts on a query's cookie, as the program's counters show them.
type kernelVerdict int

const (
	verdictNone    kernelVerdict = iota // no server cookie of RFC 9018 size: judged as today
	verdictProven                       // a valid server cookie: judged in its address's node only
	verdictInvalid                      // a server cookie that does not verify
)

func (v kernelVerdict) String() string { return [...]string{"none", "proven", "invalid"}[v] }

// verdictOf is the kernel verdict Cookies.Verify's result corresponds to.
func verdictOf(r CookieResult) kernelVerdict {
	switch {
	case r.Valid():
		return verdictProven
	case r == CookieBad || r == CookieExpired:
		return verdictInvalid
	}
	return verdictNone
}

// ednsOption is one EDNS option in wire format.
func ednsOption(code uint16, data []byte) []byte {
	b := binary.BigEndian.AppendUint16(nil, code)
	b = binary.BigEndian.AppendUint16(b, uint16(len(data)))
	return append(b, data...)
}

// wireName is name ("a.b.c", "" for the root) in uncompressed wire format.
func wireName(labels ...string) []byte {
	var b []byte
	for _, l := range labels {
		b = append(b, byte(len(l)))
		b = append(b, l...)
	}
	return append(b, 0)
}

// cookieQuery is a query for name (wire format), type A, with one OPT record as the
// only additional record holding options.
func cookieQuery(id uint16, name []byte, options ...[]byte) []byte {
	q := []byte{byte(id >> 8), byte(id), 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 1}
	q = append(q, name...)
	q = append(q, 0, 1, 0, 1)
	var rdata []byte
	for _, o := range options {
		rdata = append(rdata, o...)
	}
	q = append(q, 0, 0, 41, 0x04, 0xd0, 0, 0, 0, 0)
	q = binary.BigEndian.AppendUint16(q, uint16(len(rdata)))
	return append(q, rdata...)
}

// cookiePacket is an Ethernet frame from src carrying payload, as test-run takes it:
// IPv4 for IPv4 sources, IPv6 for IPv6 and IPv4-mapped ones (a dual-stack socket).
func cookiePacket(src netip.AddrPort, payload []byte) []byte {
	if src.Addr().Is4() {
		return ethFrame(unix.ETH_P_IP, ipv4Packet(src, netip.MustParseAddrPort("127.0.0.1:53"), nil, payload))
	}
	return ethFrame(unix.ETH_P_IPV6, ipv6Packet(src, netip.MustParseAddrPort("[fd00::53]:53"), false, payload))
}

// cookieRig runs packets through the test program with cookie secrets and reads the
// program's verdict from its counters.
type cookieRig struct {
	t    testing.TB
	objs *testObjects
	mono uint64 // the program's clock at every run
}

func newCookieRig(t testing.TB, cfg *Config) *cookieRig {
	objs := loadTestObjects(t)
	if cfg == nil {
		cfg = NewConfig()
		if err := cfg.SetValue("requests-per-second", "10000000"); err != nil {
			t.Fatal(err)
		}
	}
	if err := objs.settingsMaps().apply(cfg, 7, nil); err != nil {
		t.Fatal(err)
	}
	r := &cookieRig{t: t, objs: objs, mono: 5e12}
	if err := objs.TestInput.Put(uint32(0), &filterTestInput{Now: r.mono}); err != nil {
		t.Fatal(err)
	}
	return r
}

// setKeys gives the program c's secrets (nil: none) and makes its wall clock read
// wall at the rig's clock.
func (r *cookieRig) setKeys(c *Cookies, wall time.Time) {
	r.t.Helper()
	var k *cookieKeys
	if c != nil {
		k = c.keys.Load()
	}
	if err := r.objs.Secrets.Put(uint32(0), cookieSecretsValue(k, wall.UnixNano()-int64(r.mono))); err != nil {
		r.t.Fatal(err)
	}
}

func (r *cookieRig) counters() [counterMax]uint64 {
	r.t.Helper()
	sum, err := sumCounters(r.objs.Counters)
	if err != nil {
		r.t.Fatal(err)
	}
	return sum
}

// run returns the program's verdict on the frame's cookie and whether it passed.
func (r *cookieRig) run(frame []byte) (kernelVerdict, bool) {
	r.t.Helper()
	before := r.counters()
	ret, err := r.objs.FilterTest.Run(&ebpf.RunOptions{Data: frame})
	if err != nil {
		r.t.Fatal(err)
	}
	after := r.counters()
	passed, invalid := after[counterCookiePassed]-before[counterCookiePassed], after[counterCookieInvalid]-before[counterCookieInvalid]
	if after[counterError] != before[counterError] {
		r.t.Fatalf("program counted an internal error")
	}
	switch {
	case passed == 1 && invalid == 0:
		return verdictProven, ret != 0
	case passed == 0 && invalid == 1:
		return verdictInvalid, ret != 0
	case passed == 0 && invalid == 0:
		return verdictNone, ret != 0
	}
	r.t.Fatalf("cookie counters moved by %d passed, %d invalid", passed, invalid)
	return 0, false
}

var (
	testSecretA = CookieSecret{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	testSecretB = CookieSecret{0xe5, 0xe9, 0x73, 0xe5, 0xa6, 0xb2, 0xa4, 0x3f, 0x48, 0xe7, 0xdc, 0x84, 0x9e, 0x37, 0xbf, 0xcf}
	testSecretC = CookieSecret{0xff, 0xfe, 0xfd}
)

// TestKernelCookiesMatchVerify: for generated cookies (IPv4, IPv6 and IPv4-mapped
// sources; current, previous and unknown secrets; timestamps at and just past both
// ends of the freshness window; every byte of the cookie and of the address flipped)
// the program and Cookies.Verify agree on every one.
func TestKernelCookiesMatchVerify(t *testing.T) {
	rig := newCookieRig(t, nil)
	wall := time.Unix(1_750_000_000, 0)
	cookies := NewCookies(testSecretB)
	cookies.Rotate(testSecretA) // A current, B previous
	rig.setKeys(cookies, wall)
	makers := []struct {
		name string
		c    *Cookies
	}{{"current", NewCookies(testSecretA)}, {"previous", NewCookies(testSecretB)}, {"unknown", NewCookies(testSecretC)}}
	ages := []int64{0, 1, 1799, 1800, 1801, 3000, 3599, 3600, 3601, 7200, -1, -100, -299, -300, -301, -3600, 1 << 31}
	rng := rand.New(rand.NewPCG(11, 12))
	randAddr := func(kind int) netip.Addr {
		var b [16]byte
		for i := range b {
			b[i] = byte(rng.UintN(256))
		}
		switch kind {
		case 0:
			return netip.AddrFrom4([4]byte(b[:4]))
		case 1:
			b[0] = 0xfd // not IPv4-mapped
			return netip.AddrFrom16(b)
		}
		return netip.AddrFrom16(netip.AddrFrom4([4]byte(b[:4])).As16())
	}
	var n int
	seen := map[[2]kernelVerdict]int{}
	check := func(cookie []byte, src netip.Addr, desc string) {
		t.Helper()
		want := verdictOf(cookies.Verify(cookie, src, wall))
		frame := cookiePacket(netip.AddrPortFrom(src, 40000), cookieQuery(uint16(n), wireName("www", "example", "com"), ednsOption(10, cookie)))
		got, pass := rig.run(frame)
		if got != want || !pass {
			t.Fatalf("%s: cookie %x from %s: kernel %v (passed %v), Verify %v", desc, cookie, src, got, pass, cookies.Verify(cookie, src, wall))
		}
		seen[[2]kernelVerdict{want, got}]++
		n++
	}
	for _, m := range makers {
		for kind := range 3 {
			for _, age := range ages {
				for rep := 0; rep < 3; rep++ {
					src := randAddr(kind)
					client := make([]byte, 8)
					for i := range client {
						client[i] = byte(rng.UintN(256))
					}
					cookie := m.c.Generate(client, src, wall.Add(-time.Duration(age)*time.Second))
					desc := fmt.Sprintf("%s secret, kind %d, age %d", m.name, kind, age)
					check(cookie, src, desc)
					if rep > 1 {
						continue
					}
					for i := range cookie {
						flipped := append([]byte(nil), cookie...)
						flipped[i] ^= byte(1 + rng.UintN(255))
						check(flipped, src, fmt.Sprintf("%s, cookie byte %d flipped", desc, i))
					}
					a := src.AsSlice()
					for i := range a {
						b := append([]byte(nil), a...)
						b[i] ^= byte(1 + rng.UintN(255))
						other, _ := netip.AddrFromSlice(b)
						check(cookie, other, fmt.Sprintf("%s, address byte %d flipped", desc, i))
					}
				}
			}
		}
	}
	t.Logf("%d cookies; verdicts %v", n, seen)
	if n < 10000 {
		t.Fatalf("only %d cookies checked", n)
	}
	if seen[[2]kernelVerdict{verdictProven, verdictProven}] < 100 || seen[[2]kernelVerdict{verdictInvalid, verdictInvalid}] < 100 {
		t.Fatalf("too few valid or invalid cookies: %v", seen)
	}
}

// randomName is a question name of wire length n (3..255: labels and the root byte;
// 1: the root) with random label lengths and contents.
func randomName(rng *rand.Rand, n int) []byte {
	var b []byte
	left := n - 1
	for left > 0 {
		most := min(63, left-1)
		l := 1 + rng.IntN(most)
		if left-(l+1) == 1 { // a single byte cannot hold a label
			if l < most {
				l++
			} else {
				l--
			}
		}
		b = append(b, byte(l))
		for range l {
			b = append(b, 'a'+byte(rng.IntN(26)))
		}
		left -= l + 1
	}
	return append(b, 0)
}

// TestKernelCookieParser: where the program finds a query's cookie and where it
// does not, for question names of every length and label shape, options around the
// cookie, truncations, cookie lengths, section counts and compression.
func TestKernelCookieParser(t *testing.T) {
	rig := newCookieRig(t, nil)
	wall := time.Unix(1_760_000_000, 0)
	c := NewCookies(testSecretA)
	rig.setKeys(c, wall)
	src4 := netip.MustParseAddrPort("192.0.2.9:5353")
	src6 := netip.MustParseAddrPort("[2001:db8::9]:5353")
	client := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	cookie := c.Generate(client, src4.Addr(), wall)
	opt := ednsOption(10, cookie)
	root, www := wireName(), wireName("www", "example", "com")
	pad := func(n int) []byte { return ednsOption(12, make([]byte, n)) }
	set := func(q []byte, off int, b ...byte) []byte { copy(q[off:], b); return q }

	type tc struct {
		name    string
		payload []byte
		want    kernelVerdict
	}
	cases := []tc{
		{"root name", cookieQuery(1, root, opt), verdictProven},
		{"www.example.com", cookieQuery(1, www, opt), verdictProven},
		{"NSID and ECS before", cookieQuery(1, www, ednsOption(3, nil), ednsOption(8, []byte{0, 1, 24, 0, 192, 0, 2}), opt), verdictProven},
		{"five options before", cookieQuery(1, www, pad(1), pad(0), ednsOption(3, nil), pad(100), ednsOption(15, []byte{0, 3}), opt), verdictProven},
		{"options after", cookieQuery(1, www, opt, pad(20), ednsOption(3, nil)), verdictProven},
		{"31 options before", cookieQuery(1, www, slicesRepeat(ednsOption(3, nil), 31), opt), verdictProven},
		{"32 options before: not looked at", cookieQuery(1, www, slicesRepeat(ednsOption(3, nil), 32), opt), verdictNone},
		{"cookie after byte 512", cookieQuery(1, www, pad(480), opt), verdictProven},
		{"cookie early in an OPT ending after byte 512", cookieQuery(1, www, opt, pad(600)), verdictProven},
		{"cookie early in an OPT ending after byte 1400", cookieQuery(1, www, pad(3), opt, pad(1400)), verdictProven},
		{"cookie after a 1400-byte padding", cookieQuery(1, www, pad(1400), opt), verdictProven},
		{"cookie after byte 512, OPT longer than the packet", func() []byte {
			q := cookieQuery(1, www, pad(480), opt)
			rdlen := 12 + len(www) + 4 + 9
			binary.BigEndian.PutUint16(q[rdlen:], uint16(4+480+len(opt)+1))
			return q
		}(), verdictNone},
		{"no OPT, ARCOUNT 0", dnsQuery(1, false), verdictNone},
		{"OPT without options", cookieQuery(1, www), verdictNone},
		{"ARCOUNT 0 with an OPT", set(cookieQuery(1, www, opt), 11, 0), verdictNone},
		{"ARCOUNT 2, OPT first", append(set(cookieQuery(1, www, opt), 11, 2), 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 4, 1, 2, 3, 4), verdictProven},
		{"ARCOUNT 2, OPT second", func() []byte {
			q := cookieQuery(1, www, opt)
			q[11] = 2
			at := 12 + len(www) + 4
			a := []byte{0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 4, 1, 2, 3, 4}
			return append(append(append([]byte(nil), q[:at]...), a...), q[at:]...)
		}(), verdictNone},
		{"QDCOUNT 2", set(cookieQuery(1, www, opt), 5, 2), verdictNone},
		{"ANCOUNT 1", set(cookieQuery(1, www, opt), 7, 1), verdictNone},
		{"NSCOUNT 1", set(cookieQuery(1, www, opt), 9, 1), verdictNone},
		{"compression pointer", cookieQuery(1, []byte{3, 'w', 'w', 'w', 0xc0, 12}, opt), verdictNone},
		{"extended label type", cookieQuery(1, []byte{0x41, 0}, opt), verdictNone},
		{"OPT owner not the root", cookieQuery(1, www, opt)[:0], verdictNone},
		{"not an OPT record", set(cookieQuery(1, www, opt), 12+len(www)+4+2, 42), verdictNone},
		{"option longer than the OPT data", func() []byte {
			q := cookieQuery(1, www, opt)
			rdlen := 12 + len(www) + 4 + 9
			binary.BigEndian.PutUint16(q[rdlen:], uint16(len(opt)-1))
			return q
		}(), verdictNone},
		{"OPT data longer than the packet", func() []byte {
			q := cookieQuery(1, www, opt)
			rdlen := 12 + len(www) + 4 + 9
			binary.BigEndian.PutUint16(q[rdlen:], uint16(len(opt)+1))
			return q
		}(), verdictNone},
		{"cut inside the cookie", cookieQuery(1, www, opt)[:12+len(www)+4+11+4+20], verdictNone},
		{"cut inside the option header", cookieQuery(1, www, pad(4), opt)[:12+len(www)+4+11+8+2], verdictNone},
		{"length 0", cookieQuery(1, www, ednsOption(10, nil)), verdictNone},
		{"length 8", cookieQuery(1, www, ednsOption(10, cookie[:8])), verdictNone},
		{"length 16", cookieQuery(1, www, ednsOption(10, cookie[:16])), verdictInvalid},
		{"length 23", cookieQuery(1, www, ednsOption(10, cookie[:23])), verdictInvalid},
		{"length 25", cookieQuery(1, www, ednsOption(10, append(cookie[:24:24], 0))), verdictInvalid},
		{"length 40", cookieQuery(1, www, ednsOption(10, append(cookie[:24:24], make([]byte, 16)...))), verdictInvalid},
		{"length 41", cookieQuery(1, www, ednsOption(10, append(cookie[:24:24], make([]byte, 17)...))), verdictNone},
		{"client cookie first, valid second", cookieQuery(1, www, ednsOption(10, client), opt), verdictNone},
		{"version 2", cookieQuery(1, www, ednsOption(10, set(append([]byte(nil), cookie...), 8, 2))), verdictInvalid},
	}
	verify := c.Verify
	// The "OPT owner not the root" case: a one-label owner name.
	cases[22].payload = func() []byte {
		q := cookieQuery(1, www, opt)
		at := 12 + len(www) + 4
		return append(append(append([]byte(nil), q[:at]...), 1, 'x'), q[at+1:]...)
	}()
	rng := rand.New(rand.NewPCG(5, 6))
	for n := 1; n <= 255; n++ {
		if n == 2 { // no name is two bytes long
			continue
		}
		cases = append(cases, tc{fmt.Sprintf("random name of %d bytes", n), cookieQuery(uint16(n), randomName(rng, n), opt), verdictProven})
	}
	for l := 1; l <= 63; l++ {
		var name []byte
		for len(name)+l+1 <= 254 {
			name = append(name, byte(l))
			name = append(name, make([]byte, l)...)
		}
		cases = append(cases, tc{fmt.Sprintf("labels of %d bytes", l), cookieQuery(1, append(name, 0), opt), verdictProven})
	}
	for _, n := range []int{256, 257} {
		long := append(randomName(rng, n-2)[:n-3], 1, 'x', 0)
		cases = append(cases, tc{fmt.Sprintf("name of %d bytes", n), cookieQuery(1, long, opt), verdictNone})
	}
	for _, c := range cases {
		frame := cookiePacket(src4, c.payload)
		got, pass := rig.run(frame)
		if got != c.want || !pass {
			t.Errorf("%s: kernel %v (passed %v), want %v", c.name, got, pass, c.want)
		}
		// Where the kernel proves a query, so does the Go reader (rawCookie and
		// Verify), which looks for the cookie anywhere in the message.
		if c.want == verdictProven {
			if ck, ok := rawCookie(c.payload); !ok || !verify(ck, src4.Addr(), wall).Valid() {
				t.Errorf("%s: the kernel proves it, the Go reader does not", c.name)
			}
		}
	}

	// Other header shapes: IPv4 options, an IPv6 extension header (the general
	// parser), IPv6.
	cookie6 := c.Generate(client, src6.Addr(), wall)
	for _, h := range []struct {
		name  string
		frame []byte
	}{
		{"IPv4 options", ethFrame(unix.ETH_P_IP, ipv4Packet(src4, netip.MustParseAddrPort("127.0.0.1:53"), []byte{1, 1, 1, 0}, cookieQuery(1, www, opt)))},
		{"IPv6", cookiePacket(src6, cookieQuery(1, www, ednsOption(10, cookie6)))},
		{"IPv6 destination options", ethFrame(unix.ETH_P_IPV6, ipv6Packet(src6, netip.MustParseAddrPort("[fd00::53]:53"), true, cookieQuery(1, www, ednsOption(10, cookie6))))},
	} {
		if got, pass := rig.run(h.frame); got != verdictProven || !pass {
			t.Errorf("%s: kernel %v (passed %v), want proven", h.name, got, pass)
		}
	}
}

func slicesRepeat(b []byte, n int) []byte {
	var out []byte
	for range n {
		out = append(out, b...)
	}
	return out
}

// FuzzKernelCookieNeverDrops: two copies of the program with the same settings and
// the same clock and draws, one using cookies and one not, judge the same packets:
// the one using cookies never drops a packet the other passes.
func FuzzKernelCookieNeverDrops(f *testing.F) {
	c := NewCookies(testSecretA)
	wall := time.Unix(1_770_000_000, 0)
	sources := []netip.AddrPort{
		netip.MustParseAddrPort("192.0.2.1:4000"), netip.MustParseAddrPort("192.0.2.2:4001"),
		netip.MustParseAddrPort("[2001:db8::1]:4000"), netip.MustParseAddrPort("[::ffff:192.0.2.3]:4002"),
	}
	client := []byte("fuzzclie")
	www := wireName("www", "example", "com")
	for i, src := range sources {
		cookie := c.Generate(client, src.Addr().Unmap(), wall)
		f.Add(uint8(i), uint32(0), cookieQuery(1, www, ednsOption(10, cookie)))
		f.Add(uint8(i), uint32(1<<31), cookieQuery(2, wireName(), ednsOption(3, nil), ednsOption(10, cookie)))
		f.Add(uint8(i), ^uint32(0), cookieQuery(3, www, ednsOption(10, client)))
		f.Add(uint8(i), uint32(12345), dnsQuery(4, true))
		f.Add(uint8(i), uint32(99), cookieQuery(5, www, ednsOption(10, cookie))[:40])
	}
	cfg := NewConfig()
	for _, kv := range [][2]string{{"requests-per-second", "20"}, {"total-requests-per-second", "100"}} {
		if err := cfg.SetValue(kv[0], kv[1]); err != nil {
			f.Fatal(err)
		}
	}
	with, without := newCookieRig(f, cfg), newCookieRig(f, cfg)
	with.setKeys(c, wall)
	without.setKeys(nil, wall)
	now := with.mono
	f.Fuzz(func(t *testing.T, which uint8, rnd uint32, payload []byte) {
		if len(payload) > 1400 { // test-run takes a frame within a page
			return
		}
		now += 1e6
		frame := cookiePacket(sources[int(which)%len(sources)], payload)
		var pass [2]bool
		for i, r := range []*cookieRig{with, without} {
			r.t = t
			if err := r.objs.TestInput.Put(uint32(0), &filterTestInput{Now: now, Rnd: rnd}); err != nil {
				t.Fatal(err)
			}
			_, pass[i] = r.run(frame)
		}
		if pass[1] && !pass[0] {
			t.Fatalf("dropped with cookies, passed without: %x", payload)
		}
	})
}

// TestKernelCookieOwnAddressLevel: a proven query is judged in its address's node
// only when the finest level is the whole address; with a coarser finest level (or
// a port node first) there is no node of its own, and it is judged as without a
// cookie. Without any limit it passes on its cookie.
func TestKernelCookieOwnAddressLevel(t *testing.T) {
	wall := time.Unix(1_780_000_000, 0)
	c := NewCookies(testSecretA)
	src4 := netip.MustParseAddrPort("192.0.2.44:3000")
	src6 := netip.MustParseAddrPort("[2001:db8:1::44]:3000")
	for _, tc := range []struct {
		name   string
		values [][2]string
		want   kernelVerdict
	}{
		{"defaults", [][2]string{{"requests-per-second", "1000000"}}, verdictProven},
		{"finest levels /24 and /64", [][2]string{{"requests-per-second", "1000000"}, {"ipv4-request-levels", "16:16"}, {"ipv6-request-levels", "48:4"}}, verdictNone},
		{"no limits", [][2]string{{"requests-per-second", "0"}}, verdictProven},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := NewConfig()
			for _, kv := range tc.values {
				if err := cfg.SetValue(kv[0], kv[1]); err != nil {
					t.Fatal(err)
				}
			}
			rig := newCookieRig(t, cfg)
			rig.setKeys(c, wall)
			for _, src := range []netip.AddrPort{src4, src6} {
				q := cookieQuery(1, wireName("a"), ednsOption(10, c.Generate([]byte("levelcli"), src.Addr(), wall)))
				if got, pass := rig.run(cookiePacket(src, q)); got != tc.want || !pass {
					t.Errorf("%s: kernel %v (passed %v), want %v", src, got, pass, tc.want)
				}
			}
		})
	}
}
