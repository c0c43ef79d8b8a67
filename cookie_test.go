package rrl

import (
	"bytes"
	"encoding/hex"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

func mustHex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatalf("bad hex %q: %v", s, err)
	}
	return b
}

func mustSecret(t testing.TB, s string) CookieSecret {
	t.Helper()
	var k CookieSecret
	if b := mustHex(t, s); len(b) != len(k) {
		t.Fatalf("secret %q is %d bytes", s, len(b))
	} else {
		copy(k[:], b)
	}
	return k
}

// RFC 9018 Appendix A: the secrets, clients, cookies and times of the examples.
const (
	rfcSecret    = "e5e973e5a6b2a43f48e7dc849e37bfcf"
	rfcOldSecret = "dd3bdf9344b678b185a6f5cb60fca715" // A.4, before the rollover
	rfcNewSecret = "445536bcd2513298075a5d379663c962" // A.4, after the rollover
)

func TestCookiesRFC9018Vectors(t *testing.T) {
	tests := []struct {
		name     string
		current  string // secret new cookies are made with
		previous string // secret also accepted; "" for none
		client   string
		query    string // content of the query's COOKIE option
		now      int64
		verdict  CookieResult
		reply    string // full cookie the server returns
	}{
		{
			name:    "A.1 learning a new server cookie",
			current: rfcSecret, client: "198.51.100.100",
			query: "2464c4abcf10c957", now: 1559731985,
			verdict: CookieClientOnly,
			reply:   "2464c4abcf10c957010000005cf79f111f8130c3eee29480",
		},
		{
			// 2400 s after A.1: still valid, but past the re-issue age.
			name:    "A.2 the same client learning a renewed server cookie",
			current: rfcSecret, client: "198.51.100.100",
			query: "2464c4abcf10c957010000005cf79f111f8130c3eee29480", now: 1559734385,
			verdict: CookieValidReissue,
			reply:   "2464c4abcf10c957010000005cf7a871d4a564a1442aca77",
		},
		{
			// The query's cookie (non-zero reserved bytes) is 6715 s old: made
			// by this server, but expired.
			name:    "A.3 another client learning a renewed server cookie",
			current: rfcSecret, client: "203.0.113.203",
			query: "fc93fc62807ddb8601abcdef5cf78f71a314227b6679ebf5", now: 1559734700,
			verdict: CookieExpired,
			reply:   "fc93fc62807ddb86010000005cf7a9acf73a7810aca2381e",
		},
		{
			name:    "A.3 the expired cookie verified at its own time",
			current: rfcSecret, client: "203.0.113.203",
			query: "fc93fc62807ddb8601abcdef5cf78f71a314227b6679ebf5", now: 1559727985,
			verdict: CookieValid,
			// The query had non-zero reserved bytes, the reply has zeros, so
			// only the reply's prefix is known; its hash is checked by Verify.
			reply: "fc93fc62807ddb86010000005cf78f71",
		},
		{
			name:    "A.4 IPv6 query with a rolled-over secret",
			current: rfcNewSecret, previous: rfcOldSecret, client: "2001:db8:220:1:59de:d0f4:8769:82b8",
			query: "22681ab97d52c298010000005cf7c57926556bd0934c72f8", now: 1559741961,
			verdict: CookieValidReissue,
			reply:   "22681ab97d52c298010000005cf7c609a6bb79d16625507a",
		},
		{
			name:    "A.4 without the previous secret",
			current: rfcNewSecret, client: "2001:db8:220:1:59de:d0f4:8769:82b8",
			query: "22681ab97d52c298010000005cf7c57926556bd0934c72f8", now: 1559741961,
			verdict: CookieBad,
			reply:   "22681ab97d52c298010000005cf7c609a6bb79d16625507a",
		},
		{
			name:    "A.4 before the rollover, old secret current",
			current: rfcOldSecret, client: "2001:db8:220:1:59de:d0f4:8769:82b8",
			query: "22681ab97d52c298", now: 1559741817,
			verdict: CookieClientOnly,
			reply:   "22681ab97d52c298010000005cf7c57926556bd0934c72f8",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := NewCookies(mustSecret(t, tt.current))
			if tt.previous != "" {
				c.SetPrevious(mustSecret(t, tt.previous))
			}
			client := netip.MustParseAddr(tt.client)
			now := time.Unix(tt.now, 0)
			query := mustHex(t, tt.query)
			if got := c.Verify(query, client, now); got != tt.verdict {
				t.Errorf("Verify = %v, want %v", got, tt.verdict)
			}
			got := c.Generate(query, client, now)
			if len(tt.reply) == 2*cookieLen {
				if want := mustHex(t, tt.reply); !bytes.Equal(got, want) {
					t.Errorf("Generate = %x, want %x", got, want)
				}
			} else if !bytes.HasPrefix(got, mustHex(t, tt.reply)) {
				t.Errorf("Generate = %x, want prefix %s", got, tt.reply)
			}
			// What the server returns verifies as fresh and valid.
			if v := c.Verify(got, client, now); v != CookieValid {
				t.Errorf("Verify(reply) = %v, want valid", v)
			}
		})
	}
}

// TestCookiesRotation follows RFC 9018's rollover: the new secret is first only
// accepted, then current, then the old one is forgotten.
func TestCookiesRotation(t *testing.T) {
	oldS, newS := mustSecret(t, rfcOldSecret), mustSecret(t, rfcNewSecret)
	client := netip.MustParseAddr("2001:db8:220:1:59de:d0f4:8769:82b8")
	now := time.Unix(1559741961, 0)
	cc := mustHex(t, "22681ab97d52c298")

	c := NewCookies(oldS)
	other := NewCookies(newS) // an anycast peer that rotated first
	fromOld, fromNew := c.Generate(cc, client, now), other.Generate(cc, client, now)
	steps := []struct {
		name             string
		do               func()
		wantOld, wantNew CookieResult
	}{
		{"old secret only", func() {}, CookieValid, CookieBad},
		{"new secret accepted", func() { c.SetPrevious(newS) }, CookieValid, CookieValidReissue},
		{"rotated", func() { c.Rotate(newS) }, CookieValidReissue, CookieValid},
		{"old secret forgotten", c.ClearPrevious, CookieBad, CookieValid},
	}
	for _, s := range steps {
		s.do()
		if got := c.Verify(fromOld, client, now); got != s.wantOld {
			t.Errorf("%s: cookie from old secret: %v, want %v", s.name, got, s.wantOld)
		}
		if got := c.Verify(fromNew, client, now); got != s.wantNew {
			t.Errorf("%s: cookie from new secret: %v, want %v", s.name, got, s.wantNew)
		}
	}
	if got := c.Generate(cc, client, now); !bytes.Equal(got, fromNew) {
		t.Errorf("after rotation Generate = %x, want the new secret's %x", got, fromNew)
	}
}

// TestCookiesTimeline checks the lifetime boundaries, including across the 32-bit
// timestamp wrap in 2106.
func TestCookiesTimeline(t *testing.T) {
	c := NewCookies(mustSecret(t, rfcSecret))
	client := netip.MustParseAddr("192.0.2.53")
	cc := mustHex(t, "0102030405060708")
	for _, made := range []int64{1559731985, 1<<32 - 100, 1<<32 + 5} {
		cookie := c.Generate(cc, client, time.Unix(made, 0))
		steps := []struct {
			after int64
			want  CookieResult
		}{
			{-100000, CookieExpired},
			{-301, CookieExpired},
			{-300, CookieValid},
			{0, CookieValid},
			{1800, CookieValid},
			{1801, CookieValidReissue},
			{3600, CookieValidReissue},
			{3601, CookieExpired},
			{100000, CookieExpired},
		}
		for _, s := range steps {
			now := time.Unix(made+s.after, 999999999) // sub-second part is ignored
			if got := c.Verify(cookie, client, now); got != s.want {
				t.Errorf("made at %d, verified %+d s later: %v, want %v", made, s.after, got, s.want)
			}
		}
	}
}

func TestCookiesBad(t *testing.T) {
	c := NewCookies(mustSecret(t, rfcSecret))
	client := netip.MustParseAddr("198.51.100.100")
	now := time.Unix(1559731985, 0)
	good := mustHex(t, "2464c4abcf10c957010000005cf79f111f8130c3eee29480")
	if got := c.Verify(good, client, now); got != CookieValid {
		t.Fatalf("RFC cookie: %v, want valid", got)
	}
	flip := func(i int, bit byte) []byte {
		b := bytes.Clone(good)
		b[i] ^= bit
		return b
	}
	tests := []struct {
		name   string
		cookie []byte
		client netip.Addr
		want   CookieResult
	}{
		{"other client address", good, netip.MustParseAddr("198.51.100.101"), CookieBad},
		{"IPv4-mapped address is the same client", good, netip.MustParseAddr("::ffff:198.51.100.100"), CookieValid},
		{"IPv6 address", good, netip.MustParseAddr("2001:db8::1"), CookieBad},
		{"client cookie changed", flip(0, 0x01), client, CookieBad},
		{"version 2", flip(8, 0x03), client, CookieBad},
		{"version 0", flip(8, 0x01), client, CookieBad},
		{"reserved byte changed", flip(10, 0x80), client, CookieBad},
		{"timestamp changed", flip(15, 0x01), client, CookieBad},
		{"hash bit flipped", flip(23, 0x80), client, CookieBad},
		{"8-byte server cookie", good[:16], client, CookieBad},
		{"32-byte server cookie", append(bytes.Clone(good), make([]byte, 16)...), client, CookieBad},
		{"17-byte server cookie", append(bytes.Clone(good), 0), client, CookieBad},
		{"other secret", NewCookies(mustSecret(t, rfcNewSecret)).Generate(good, client, now), client, CookieBad},
	}
	for _, tt := range tests {
		if got := c.Verify(tt.cookie, tt.client, now); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}

// wantForLength is what Verify must say of a COOKIE option of n bytes whose first 24
// bytes (when it has them) are a valid cookie.
func wantForLength(n int) CookieResult {
	switch {
	case n == 8:
		return CookieClientOnly
	case n == 24:
		return CookieValid
	case n >= 16 && n <= 40:
		return CookieBad
	}
	return CookieMalformed
}

// TestCookieOptionLengths sends COOKIE options of every length from 0 to 48 bytes
// through the wire and back.
func TestCookieOptionLengths(t *testing.T) {
	c := NewCookies(mustSecret(t, rfcSecret))
	client := netip.MustParseAddr("203.0.113.203")
	now := time.Unix(1559734700, 0)
	valid := c.Generate(mustHex(t, "fc93fc62807ddb86"), client, now)
	for n := 0; n <= 48; n++ {
		content := make([]byte, n)
		copy(content, valid)
		for i := len(valid); i < n; i++ {
			content[i] = byte(i)
		}
		q := new(dns.Msg)
		q.SetQuestion("www.example.test.", dns.TypeA)
		setCookie(q, content)
		wire, err := q.Pack()
		if err != nil {
			t.Fatalf("length %d: pack: %v", n, err)
		}
		var back dns.Msg
		if err := back.Unpack(wire); err != nil {
			t.Fatalf("length %d: unpack: %v", n, err)
		}
		got, ok := cookieFromMsg(&back)
		if !ok || got == nil || !bytes.Equal(got, content) {
			t.Fatalf("length %d: cookieFromMsg = %x, %v; want %x, true", n, got, ok, content)
		}
		if v := c.Verify(got, client, now); v != wantForLength(n) {
			t.Errorf("length %d: %v, want %v", n, v, wantForLength(n))
		}
	}
}

func TestCookieFromMsg(t *testing.T) {
	q := new(dns.Msg)
	q.SetQuestion("www.example.test.", dns.TypeA)
	if b, ok := cookieFromMsg(q); ok || b != nil {
		t.Errorf("no OPT: %x, %v", b, ok)
	}
	q.SetEdns0(1232, false)
	if b, ok := cookieFromMsg(q); ok || b != nil {
		t.Errorf("OPT without cookie: %x, %v", b, ok)
	}
	if got := NewCookies(CookieSecret{}).Verify(nil, netip.Addr{}, time.Unix(0, 0)); got != CookieNone {
		t.Errorf("Verify(nil) = %v, want none", got)
	}
	opt := q.IsEdns0()
	opt.Option = append(opt.Option,
		&dns.EDNS0_NSID{Code: dns.EDNS0NSID},
		&dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0102030405060708"},
		&dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "ff"})
	if b, ok := cookieFromMsg(q); !ok || hex.EncodeToString(b) != "0102030405060708" {
		t.Errorf("first of two cookies: %x, %v", b, ok)
	}
	setCookie(q, mustHex(t, "0102030405060708aabbccddeeff00112233445566778899"))
	if b, _ := cookieFromMsg(q); hex.EncodeToString(b) != "0102030405060708aabbccddeeff00112233445566778899" {
		t.Errorf("setCookie did not replace the first cookie: %x", b)
	}
	if n := len(q.IsEdns0().Option); n != 3 {
		t.Errorf("setCookie changed the option count to %d", n)
	}
	opt.Option[1].(*dns.EDNS0_COOKIE).Cookie = "zz" // only possible in code
	if b, ok := cookieFromMsg(q); !ok || b == nil || len(b) != 0 {
		t.Errorf("invalid hex: %x, %v; want empty, true", b, ok)
	}
}

func TestCookieResultString(t *testing.T) {
	seen := map[string]bool{}
	for r := CookieNone; r < cookieResultLast; r++ {
		s := r.String()
		if s == "" || seen[s] {
			t.Errorf("%d: name %q empty or repeated", r, s)
		}
		seen[s] = true
		if r.Valid() != (r == CookieValid || r == CookieValidReissue) {
			t.Errorf("%v.Valid() = %v", r, r.Valid())
		}
	}
	if got := cookieResultLast.String(); got != "CookieResult(7)" {
		t.Errorf("cookieResultLast.String() = %q", got)
	}
}

func TestCookiesNoAlloc(t *testing.T) {
	c := NewCookies(mustSecret(t, rfcSecret))
	c.SetPrevious(mustSecret(t, rfcOldSecret))
	v4, v6 := netip.MustParseAddr("198.51.100.100"), netip.MustParseAddr("2001:db8::1")
	now := time.Unix(1559731985, 0)
	buf := make([]byte, 0, cookieLen)
	cc := mustHex(t, "2464c4abcf10c957")
	full := c.Generate(cc, v6, now)
	allocs := testing.AllocsPerRun(100, func() {
		buf = c.appendCookie(buf[:0], cc, v4, now)
		if c.Verify(buf, v4, now) != CookieValid || c.Verify(full, v6, now) != CookieValid {
			panic("not valid")
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per appendCookie+Verify, want 0", allocs)
	}
	if got := c.appendCookie(buf[:0], cc[:7], v4, now); len(got) != 0 {
		t.Errorf("appendCookie with a 7-byte client cookie appended %x", got)
	}
	if got := c.Generate(nil, v4, now); got != nil {
		t.Errorf("Generate(nil) = %x, want nil", got)
	}
}

// TestCookiesConcurrentRotate runs rotations against verification; under -race it
// checks that readers need no lock.
func TestCookiesConcurrentRotate(t *testing.T) {
	a, b := mustSecret(t, rfcOldSecret), mustSecret(t, rfcNewSecret)
	c := NewCookies(a)
	client := netip.MustParseAddr("192.0.2.1")
	now := time.Unix(1559731985, 0)
	cc := mustHex(t, "0102030405060708")
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if i%2 == 0 {
				c.Rotate(b)
			} else {
				c.Rotate(a)
			}
		}
	}()
	for i := 0; i < 2000; i++ {
		// Both secrets are current or previous at every moment, so every
		// cookie made by either verifies.
		if got := c.Verify(c.Generate(cc, client, now), client, now); !got.Valid() {
			t.Fatalf("iteration %d: %v", i, got)
		}
	}
	close(stop)
	wg.Wait()
}

// FuzzCookieVerify checks that Verify never panics, that its verdict on the length
// follows RFC 7873, and that every cookie Generate makes verifies.
func FuzzCookieVerify(f *testing.F) {
	f.Add(mustHex(f, "2464c4abcf10c957010000005cf79f111f8130c3eee29480"), []byte{198, 51, 100, 100}, int64(1559731985))
	f.Add(mustHex(f, "22681ab97d52c298010000005cf7c57926556bd0934c72f8"),
		netip.MustParseAddr("2001:db8:220:1:59de:d0f4:8769:82b8").AsSlice(), int64(1559741961))
	f.Add([]byte{}, []byte{}, int64(0))
	f.Add(make([]byte, 41), []byte{127, 0, 0, 1}, int64(-1))
	c := NewCookies(mustSecret(f, rfcSecret))
	f.Fuzz(func(t *testing.T, cookie, ip []byte, unix int64) {
		client, _ := netip.AddrFromSlice(ip)
		now := time.Unix(unix, 0)
		got := c.Verify(cookie, client, now)
		n := len(cookie)
		switch {
		case got >= cookieResultLast:
			t.Fatalf("result %d out of range", got)
		case (got == CookieMalformed) != (n != 8 && (n < 16 || n > 40)):
			t.Fatalf("length %d: %v", n, got)
		case n == 8 && got != CookieClientOnly:
			t.Fatalf("length 8: %v", got)
		case n != 24 && got.Valid():
			t.Fatalf("length %d accepted", n)
		}
		if n < 8 {
			return
		}
		made := c.Generate(cookie, client, now)
		if len(made) != cookieLen || !bytes.Equal(made[:8], cookie[:8]) {
			t.Fatalf("Generate = %x", made)
		}
		if v := c.Verify(made, client, now); v != CookieValid {
			t.Fatalf("fresh cookie %x: %v", made, v)
		}
	})
}

func BenchmarkCookies(b *testing.B) {
	c := NewCookies(mustSecret(b, rfcSecret))
	c.SetPrevious(mustSecret(b, rfcOldSecret))
	now := time.Unix(1559731985, 0)
	cc := mustHex(b, "2464c4abcf10c957")
	for _, addr := range []string{"198.51.100.100", "2001:db8:220:1:59de:d0f4:8769:82b8"} {
		client := netip.MustParseAddr(addr)
		name := "v4"
		if client.Is6() {
			name = "v6"
		}
		full := c.Generate(cc, client, now)
		b.Run("Generate/"+name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				full = c.Generate(cc, client, now)
			}
		})
		b.Run("appendCookie/"+name, func(b *testing.B) {
			b.ReportAllocs()
			buf := make([]byte, 0, cookieLen)
			for b.Loop() {
				buf = c.appendCookie(buf[:0], cc, client, now)
			}
		})
		b.Run("Verify/"+name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if c.Verify(full, client, now) != CookieValid {
					b.Fatal("not valid")
				}
			}
		})
		bad := bytes.Clone(full)
		bad[23] ^= 1
		b.Run("VerifyBad/"+name, func(b *testing.B) {
			// A forged cookie costs both secrets' hashes.
			b.ReportAllocs()
			for b.Loop() {
				if c.Verify(bad, client, now) != CookieBad {
					b.Fatal("not bad")
				}
			}
		})
	}
	q := new(dns.Msg)
	q.SetQuestion("www.example.test.", dns.TypeA)
	setCookie(q, c.Generate(cc, netip.MustParseAddr("198.51.100.100"), now))
	b.Run("cookieFromMsg", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := cookieFromMsg(q); !ok {
				b.Fatal("no cookie")
			}
		}
	})
}

// FuzzCookieFromMsg feeds arbitrary bytes through dns.Msg.Unpack into cookieFromMsg
// and Verify, and checks the verdict against the option's length.
func FuzzCookieFromMsg(f *testing.F) {
	c := NewCookies(mustSecret(f, rfcSecret))
	client := netip.MustParseAddr("198.51.100.100")
	now := time.Unix(1559731985, 0)
	for _, content := range []string{"", "2464c4abcf10c957", "2464c4abcf10c957010000005cf79f111f8130c3eee29480", "00"} {
		q := new(dns.Msg)
		q.SetQuestion("example.com.", dns.TypeA)
		setCookie(q, mustHex(f, content))
		if wire, err := q.Pack(); err == nil {
			f.Add(wire)
		}
	}
	f.Fuzz(func(t *testing.T, wire []byte) {
		var m dns.Msg
		if err := m.Unpack(wire); err != nil {
			return
		}
		cookie, ok := cookieFromMsg(&m)
		if ok != (cookie != nil) {
			t.Fatalf("cookieFromMsg = %x, %v", cookie, ok)
		}
		got := c.Verify(cookie, client, now)
		n := len(cookie)
		switch {
		case !ok && got != CookieNone:
			t.Fatalf("no cookie: %v", got)
		case ok && (got == CookieMalformed) != (n != 8 && (n < 16 || n > 40)):
			t.Fatalf("length %d: %v", n, got)
		}
	})
}
