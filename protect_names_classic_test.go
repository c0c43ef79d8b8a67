//go:build linux

package rrl

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dnsrake/rrl/internal/loadgen"
	"github.com/dnsrake/rrl/internal/testutil"
	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// namesTally counts, per kind of name, the queries a handler was given and when.
type namesTally struct {
	mu    sync.Mutex
	start time.Time
	at    map[string][]time.Duration // "random", "known", "other"
}

// handler counts each query by its name (rnd-*.victim.test.: random; under
// other.test.: other; else known) and passes it on to next.
func (n *namesTally) handler(next dns.Handler) dns.Handler {
	return dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		name := strings.ToLower(r.Question[0].Name)
		kind := "known"
		switch {
		case strings.HasPrefix(name, "rnd-"):
			kind = "random"
		case dns.IsSubDomain("other.test.", name):
			kind = "other"
		}
		n.mu.Lock()
		n.at[kind] = append(n.at[kind], time.Since(n.start))
		n.mu.Unlock()
		next.ServeDNS(w, r)
	})
}

func (n *namesTally) count(kind string, from, to time.Duration) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return count(n.at[kind], from, to)
}

// TestClassicNamesLive: in the classic mode (the eBPF filter refused for want of
// privilege, the classic prefilter on the socket, the request limits in Go) the Go
// Limiter judges names, by the Protection's reader and by its Handler under a
// host's server, taught by the Handler's answers: with a names level L in force,
// random names under victim.test. from thousands of sources (10 L, real packets)
// are held to about L, while queries for existing victim.test. names and random
// names under other.test. (within that zone's own budget) are all answered.
func TestClassicNamesLive(t *testing.T) {
	if testing.Short() {
		t.Skip("live flood")
	}
	const L = 200.0
	const dur = 2500 * time.Millisecond
	const from = time.Second
	for _, m := range []struct {
		name  string
		serve func(t *testing.T, h dns.Handler, cfg *Config) (*Protection, netip.AddrPort)
	}{
		{"reader", func(t *testing.T, h dns.Handler, cfg *Config) (*Protection, netip.AddrPort) {
			conn := deepLoopback(t)
			p, err := Protect(conn, h, cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Close() })
			srv := p.UDPServer()
			started := make(chan struct{})
			srv.NotifyStartedFunc = func() { close(started) }
			go srv.ActivateAndServe()
			<-started
			t.Cleanup(func() { srv.Shutdown() })
			return p, conn.LocalAddr().(*net.UDPAddr).AddrPort()
		}},
		{"Handler", func(t *testing.T, h dns.Handler, cfg *Config) (*Protection, netip.AddrPort) {
			conn := deepLoopback(t)
			addr := conn.LocalAddr().(*net.UDPAddr).AddrPort()
			p, err := NewProtection(h, cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Close() })
			if err := p.AttachLocal(addr); err != nil {
				t.Logf("AttachLocal: %v", err)
			}
			serveHost(t, conn, p.Handler())
			return p, addr
		}},
	} {
		t.Run(m.name, func(t *testing.T) {
			requirePrivilege(t, unix.CAP_NET_RAW) // raw sockets for the sources
			release, err := testutil.LockLive()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(release)
			failLoad(t, permissionError("rrl: load eBPF filter", errors.ErrUnsupported))
			cfg := NewConfig()
			if err := cfg.SetValue("capacity", "auto"); err != nil {
				t.Fatal(err)
			}
			tally := &namesTally{at: map[string][]time.Duration{}}
			p, addr := m.serve(t, tally.handler(namesZoneHandler()), cfg)
			if st := p.Status(); st.Filter != ModeClassic || st.RequestsInKernel || p.Limiter() == nil {
				t.Fatalf("status %v: want the classic prefilter and the request limits in Go", st)
			}
			// Teaching: the existing names and each zone (an NXDOMAIN's SOA).
			c := &dns.Client{Net: "udp", Timeout: 2 * time.Second}
			for _, n := range append([]string{"nx.victim.test.", "nx.other.test."}, withSuffix(namesVictim, ".victim.test.")...) {
				q := new(dns.Msg)
				q.SetQuestion(n, dns.TypeA)
				if _, _, err := c.Exchange(q, addr.String()); err != nil {
					t.Fatalf("%s: %v", n, err)
				}
			}
			// The level, as the controller puts it under an overload; the
			// Protection's controller is stopped first, so that it keeps it.
			p.stopCapacity()
			l := p.Limiter()
			l.setNamesLevel(L)
			before := l.Stats()

			rng := rand.New(rand.NewPCG(33, 33))
			flows := []flow{{
				Name: "random", Rate: 10 * L, End: dur,
				Src: func(int) netip.AddrPort {
					return netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 9, byte(rng.IntN(256)), byte(1 + rng.IntN(254))}), uint16(20000+rng.IntN(20000)))
				},
				Payload: func(i int) []byte { return idQuery(t, i, fmt.Sprintf("rnd-%08x.victim.test.", rng.Uint32())) },
			}, {
				Name: "known", Rate: L, End: dur,
				Src: func(i int) netip.AddrPort {
					return netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 10, byte(i % 8), 1}), uint16(30000+i%97))
				},
				Payload: func(i int) []byte { return idQuery(t, i, namesVictim[i%len(namesVictim)]+".victim.test.") },
			}, {
				Name: "other", Rate: 0.5 * L, End: dur,
				Src: func(i int) netip.AddrPort {
					return netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 11, byte(i % 8), 1}), uint16(30000+i%97))
				},
				Payload: func(i int) []byte { return idQuery(t, i, fmt.Sprintf("o%d.other.test.", i)) },
			}}
			raw := newRawSender(t, addr)
			tally.mu.Lock()
			tally.at = map[string][]time.Duration{}
			tally.start = time.Now()
			start := tally.start
			tally.mu.Unlock()
			sentAt, err := loadgen.Pace(start, flows, dur, 2*time.Millisecond, func(_ int, src netip.AddrPort, payload []byte) error {
				return raw.Send(loadgen.Packet(src, addr, payload))
			})
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(300 * time.Millisecond) // the last reads
			after := l.Stats()

			if sent := float64(count(sentAt[0], from, dur)) / (dur - from).Seconds(); sent < 5*L {
				t.Fatalf("random names sent at %.0f pps over [%v, %v), under 5 L: the sender fell behind, run not meaningful", sent, from, dur)
			}
			got := float64(tally.count("random", from, dur)) / (dur - from).Seconds()
			t.Logf("random names under victim.test. answered from %v at %.0f pps (level %.0f)", from, got, L)
			if got < 0.5*L || got > 1.3*L {
				t.Errorf("random names under victim.test. answered at %.0f pps, want about the level %.0f (0.5 to 1.3 times)", got, L)
			}
			for fi, kind := range []string{"", "known", "other"} {
				if fi == 0 {
					continue
				}
				n, sent := tally.count(kind, 0, time.Hour), len(sentAt[fi])
				t.Logf("%s: %d of %d answered", kind, n, sent)
				if n < sent*99/100 {
					t.Errorf("%s: %d of %d answered, want 99%%", kind, n, sent)
				}
			}
			if after.Names == nil || before.Names == nil {
				t.Fatalf("no names counters: %+v", after.Names)
			}
			d := NameStats{
				Known:         after.Names.Known - before.Names.Known,
				Unknown:       after.Names.Unknown - before.Names.Unknown,
				Limited:       after.Names.Limited - before.Names.Limited,
				UnknownPassed: after.Names.UnknownPassed - before.Names.UnknownPassed,
			}
			t.Logf("names counters moved %+v, level %g", d, after.Names.Level)
			// Every existing-name query read was judged known (and passed):
			// exactly those the handler was given, whatever a busy machine's
			// socket queue lost.
			if n := tally.count("known", 0, time.Hour); d.Known != uint64(n) {
				t.Errorf("the Limiter counted %d queries known, the handler was given %d", d.Known, n)
			}
			if d.Limited == 0 || d.Limited+d.UnknownPassed != d.Unknown {
				t.Errorf("names counters %+v: nothing limited, or limited and passed do not add up to the unknown", d)
			}
		})
	}
}

// deepLoopback is a UDP socket on loopback with a deep receive queue (loadgen.Listen),
// so that a busy machine's reader loses no query to overflow.
func deepLoopback(t *testing.T) *net.UDPConn {
	t.Helper()
	conn, err := loadgen.Listen("udp4", netip.MustParseAddrPort("127.0.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// withSuffix returns each of names with suffix appended.
func withSuffix(names []string, suffix string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = n + suffix
	}
	return out
}
