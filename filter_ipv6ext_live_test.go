package rrl

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestLiveIPv6ExtensionHeaders: on a real IPv6 socket in a namespace of the test's
// own, one spoofed source sends 300 queries, each behind n Destination Options
// headers, and one response (QR=1) from port 123, at requests-per-second 5. Linux
// delivers every one to the socket, whatever n; the filter holds the queries to the
// limit while it can walk the headers to UDP (n up to 6) and drops them beyond (the
// program once passed them unjudged from n = 7: all 301 delivered), and never lets
// the response through.
func TestLiveIPv6ExtensionHeaders(t *testing.T) {
	const queries = 300
	src := netip.MustParseAddrPort("[2001:db8:77::9]:40000")
	ntp := netip.AddrPortFrom(src.Addr(), 123)
	for _, n := range []int{0, 1, 2, 5, 6, 7, 8, 12} {
		t.Run(fmt.Sprintf("%d headers", n), func(t *testing.T) {
			srv, raw, f := attachLiveIPv6(t, "5")
			if f.Mode() != ModeEBPF {
				t.Fatalf("mode %v, want ebpf", f.Mode())
			}
			types := slices.Repeat([]byte{unix.IPPROTO_DSTOPTS}, n)
			raw.send(t, extChain(ntp, srv.addr, types, qr(dnsQuery(0, false))))
			for i := range queries {
				raw.send(t, extChain(src, srv.addr, types, dnsQuery(uint16(i+1), false)))
			}
			got := srv.collect(time.Now(), nil, 300*time.Millisecond, 5*time.Second)
			st, err := f.Stats()
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%d headers: %d of %d delivered; stats %+v", n, len(got), queries+1, st)
			for _, r := range got {
				if r.from.Port() == 123 {
					t.Errorf("the response from port 123 was delivered")
				}
			}
			// Every datagram reached the filter: what it did not deliver, it dropped.
			if st.Seen != queries+1 || st.Passed != uint64(len(got)) {
				t.Fatalf("filter saw %d and passed %d; sent %d, %d delivered", st.Seen, st.Passed, queries+1, len(got))
			}
			if n <= maxIPv6ExtHeaders {
				// Five a second and the estimator's burst: a handful, as with no
				// extension header.
				if len(got) == 0 || len(got) > 30 || st.DroppedResponse != 1 {
					t.Errorf("delivered %d of %d, responses dropped %d: want at most 30 queries and the response dropped",
						len(got), queries, st.DroppedResponse)
				}
				return
			}
			if len(got) != 0 || st.NotDNS != queries+1 {
				t.Errorf("delivered %d, NotDNS %d: want every datagram behind %d headers dropped", len(got), st.NotDNS, n)
			}
		})
	}
}
