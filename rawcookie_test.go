package rrl

import (
	"bytes"
	"encoding/hex"
	"testing"

	"github.com/miekg/dns"
)

// packedQuery returns a packed query for www.example.test. with the given EDNS
// options (none: no OPT record), built by miekg/dns.
func packedQuery(t testing.TB, opts ...dns.EDNS0) []byte {
	t.Helper()
	q := new(dns.Msg)
	q.SetQuestion("www.example.test.", dns.TypeA)
	if opts != nil {
		q.SetEdns0(1232, false)
		q.IsEdns0().Option = opts
	}
	b, err := q.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestRawCookie: the cookie of a datagram is found where miekg/dns finds it, and
// a datagram cut short or malformed yields none.
func TestRawCookie(t *testing.T) {
	full := bytes.Repeat([]byte{0xab}, cookieLen)
	cookie := &dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: hex.EncodeToString(full)}
	withCookie := packedQuery(t, &dns.EDNS0_NSID{Code: dns.EDNS0NSID}, cookie)
	// An answer record before the OPT record, whose owner is a compression pointer.
	withAnswer := func() []byte {
		m := new(dns.Msg)
		m.SetQuestion("www.example.test.", dns.TypeA)
		m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: "www.example.test.", Rrtype: dns.TypeA, Class: dns.ClassINET}, A: []byte{192, 0, 2, 1}}}
		m.SetEdns0(1232, false)
		m.IsEdns0().Option = []dns.EDNS0{cookie}
		m.Compress = true
		b, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}()
	for _, tc := range []struct {
		name string
		msg  []byte
		want []byte // nil: none found
	}{
		{"cookie after another option", withCookie, full},
		{"after an answer with a compressed name", withAnswer, full},
		{"client cookie only", packedQuery(t, &dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0102030405060708"}), []byte{1, 2, 3, 4, 5, 6, 7, 8}},
		{"empty cookie option", packedQuery(t, &dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE}), []byte{}},
		{"OPT without a cookie", packedQuery(t, &dns.EDNS0_NSID{Code: dns.EDNS0NSID}), nil},
		{"no OPT", packedQuery(t), nil},
		{"cut in the option", withCookie[:len(withCookie)-1], nil},
		{"cut in the question", withCookie[:15], nil},
		{"header only", withCookie[:12], nil},
		{"short", withCookie[:5], nil},
		{"extended label type", append(append([]byte{}, withCookie[:12]...), append([]byte{0x41}, withCookie[13:]...)...), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := rawCookie(tc.msg)
			if ok != (tc.want != nil) || !bytes.Equal(got, tc.want) || ok && got == nil {
				t.Errorf("rawCookie = %x, %v; want %x", got, ok, tc.want)
			}
		})
	}
}

// FuzzRawCookie: rawCookie never panics, and on every message miekg/dns unpacks
// with one OPT record it finds what cookieFromMsg finds.
func FuzzRawCookie(f *testing.F) {
	f.Add(packedQuery(f, &dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: hex.EncodeToString(bytes.Repeat([]byte{7}, cookieLen))}))
	f.Add(packedQuery(f, &dns.EDNS0_NSID{Code: dns.EDNS0NSID}, &dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0102030405060708"}))
	f.Add(packedQuery(f))
	f.Add([]byte{0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0xc0, 12, 0, 1, 0, 1})
	f.Fuzz(func(t *testing.T, msg []byte) {
		got, ok := rawCookie(msg)
		if ok && got == nil {
			t.Fatal("found a nil cookie")
		}
		m := new(dns.Msg)
		if m.Unpack(msg) != nil {
			return
		}
		opts := 0
		for _, rr := range m.Extra {
			if _, isOPT := rr.(*dns.OPT); isOPT {
				opts++
			}
		}
		if opts != 1 {
			return
		}
		want, wantOK := cookieFromMsg(m)
		if ok != wantOK || !bytes.Equal(got, want) {
			t.Fatalf("rawCookie = %x, %v; cookieFromMsg = %x, %v", got, ok, want, wantOK)
		}
	})
}
