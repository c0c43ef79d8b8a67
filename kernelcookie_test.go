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
	if err := objs.Settings.Put(uint32(0), kernelSettings(cfg, 7)); err != nil {
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
	var perCPU []filterCounters
	if err := r.objs.Counters.Lookup(uint32(0), &perCPU); err != nil {
		r.t.Fatal(err)
	}
	var sum [counterMax]uint64
	for _, c := range perCPU {
		for i, v := range c.Value {
			sum[i] += v
		}
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
