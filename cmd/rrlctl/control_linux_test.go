package main

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dnsrake/rrl"
)

// syncBuffer is a bytes.Buffer safe for a command writing and a test reading.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// nodeLimits returns the limit of every level the pinned filter f runs with.
func nodeLimits(t *testing.T, f *rrl.Filter) map[rrl.LimiterNode]float64 {
	t.Helper()
	st, err := f.Stats()
	if err != nil {
		t.Fatal(err)
	}
	out := map[rrl.LimiterNode]float64{}
	for _, n := range st.Nodes {
		out[n.Node] = n.Limit
	}
	return out
}

// waitFor polls cond every 10 ms until it holds or d passes.
func waitFor(d time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// TestControl runs rrlctl control on a pinned filter attached to a real socket of
// this process, whose reader takes 500 queries per second, floods it from many
// loopback sources at about 5,000 per second, and checks that the controller finds
// the overload and puts a water level in force for every process of the pins, that
// rrlctl stats reports it, that a second controller on the same pins is refused,
// and that SIGTERM lifts the level. Without a socket, capacity auto is reported as
// unmeasurable and no level is written.
func TestControl(t *testing.T) {
	root := bpffs(t)
	cases := []struct {
		name     string
		capacity string
		sockets  bool   // -pid and -listen: the controller samples the socket's queue
		problem  string // want this problem reported, and no overload
	}{
		{name: "auto", capacity: "auto", sockets: true},
		{name: "configured", capacity: "1000", sockets: true},
		{name: "auto without socket", capacity: "auto", problem: "no socket"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pin := filepath.Join(root, "rrl"+strconv.Itoa(i))
			if code, out, errOut := rrlctl("load", "-pin", pin, "-capacity", tc.capacity); code != exitOK {
				t.Fatalf("load: exit %d: %s%s", code, out, errOut)
			}
			conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if err := conn.SetReadBuffer(16 << 10); err != nil {
				t.Fatal(err)
			}
			f, err := rrl.AttachPinned(conn, pin)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			static := nodeLimits(t, f)
			dst := conn.LocalAddr().(*net.UDPAddr).AddrPort()

			// The server: one query every 2 ms, whatever arrives.
			stop := make(chan struct{})
			var wg sync.WaitGroup
			defer func() { close(stop); wg.Wait() }()
			wg.Add(2)
			go func() {
				defer wg.Done()
				buf := make([]byte, 512)
				tick := time.NewTicker(2 * time.Millisecond)
				defer tick.Stop()
				for {
					select {
					case <-stop:
						return
					case <-tick.C:
					}
					conn.SetReadDeadline(time.Now().Add(time.Millisecond))
					conn.ReadFromUDPAddrPort(buf)
				}
			}()
			// The flood: 25 queries every 5 ms from 400 addresses in four /24s, for
			// at most 6 s.
			go func() {
				defer wg.Done()
				tick := time.NewTicker(5 * time.Millisecond)
				defer tick.Stop()
				for i := 0; i < 1200; i++ {
					select {
					case <-stop:
						return
					case <-tick.C:
					}
					src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 9, byte(i % 4), byte(1 + i%100)}), 40000)
					sendQueries(t, src, dst, 25)
				}
			}()

			args := []string{"control", "-pin", pin, "-interval", "20ms"}
			if tc.sockets {
				args = append(args, "-pid", strconv.Itoa(os.Getpid()), "-listen", dst.String())
			}
			var out, errOut syncBuffer
			code := make(chan int, 1)
			go func() { code <- run(args, &out, &errOut) }()
			if !waitFor(5*time.Second, func() bool { return strings.Contains(out.String(), "controlling") }) {
				t.Fatalf("control did not start: %s%s", out.String(), errOut.String())
			}
			var capst *rrl.CapacityStats
			read := func() *rrl.CapacityStats {
				st, err := f.Stats()
				if err != nil {
					t.Fatal(err)
				}
				return st.Capacity
			}
			if tc.problem != "" {
				if !waitFor(3*time.Second, func() bool { capst = read(); return capst != nil && strings.Contains(capst.Problem, tc.problem) }) {
					t.Errorf("capacity %+v; want the problem %q", capst, tc.problem)
				}
				time.Sleep(300 * time.Millisecond) // flood on: still no level
				if capst = read(); capst.Overloaded || capst.Level != 0 {
					t.Errorf("capacity %+v without a socket; want no overload", capst)
				}
			} else {
				levelled := func() bool {
					for node, l := range nodeLimits(t, f) {
						if l < static[node] {
							return true
						}
					}
					return false
				}
				if !waitFor(4*time.Second, func() bool { capst = read(); return capst.Overloaded && capst.Level > 0 && levelled() }) {
					t.Fatalf("no water level in force after 4 s of flood: capacity %+v, limits %v (static %v)\n%s%s", capst, nodeLimits(t, f), static, out.String(), errOut.String())
				}
				if capst.Problem != "" || capst.Capacity <= 0 || math.IsInf(capst.Capacity, 0) {
					t.Errorf("capacity under overload: %+v", capst)
				}
				if c, so, _ := rrlctl("stats", "-pin", pin); c != exitOK || !strings.Contains(so, "overloaded") {
					t.Errorf("stats during the overload: exit %d:\n%s", c, so)
				}
				if !waitFor(time.Second, func() bool { return strings.Contains(out.String(), "overload:") }) {
					t.Errorf("control printed no overload: %s", out.String())
				}
			}
			// One controller per pin directory.
			if c, _, e := rrlctl("control", "-pin", pin); c != exitError || !strings.Contains(e, fmt.Sprintf("process %d runs the controller", os.Getpid())) {
				t.Errorf("second control: exit %d: %s", c, e)
			}

			if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			select {
			case c := <-code:
				if c != exitOK || !strings.Contains(out.String(), "stopped: the water level is lifted") {
					t.Errorf("control after SIGTERM: exit %d: %s%s", c, out.String(), errOut.String())
				}
			case <-time.After(5 * time.Second):
				t.Fatal("control did not stop on SIGTERM")
			}
			// The flood goes on, and the static limits are back.
			if got := nodeLimits(t, f); !mapsEqual(got, static) {
				t.Errorf("limits after control stopped: %v; want the static %v", got, static)
			}
			if capst = read(); capst.Overloaded || capst.Level != 0 || !strings.Contains(capst.Problem, "no controller runs") {
				t.Errorf("capacity after control stopped: %+v", capst)
			}
		})
	}
}

func mapsEqual[K comparable](a, b map[K]float64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

var _ = errors.New
