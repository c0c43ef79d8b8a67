package main

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/dnsrake/rrl"
	"github.com/dnsrake/rrl/internal/procsock"
	"golang.org/x/sys/unix"
)

// The undo tests attach, through rrlctl attach on this very process, to sockets
// this process holds on one port, each with a filter of its own, and make the
// attach fail for real on one of them: a socket whose filter uses nearly all of
// net.core.optmem_max cannot take another filter, as the kernel charges the new
// one before it frees the old (ENOMEM, the failure a re-attach meets).

// acceptAll is a classic program of n instructions: n-1 loads of the packet's first
// word, then "accept".
func acceptAll(n int) []unix.SockFilter {
	p := make([]unix.SockFilter, 0, n)
	for range n - 1 {
		p = append(p, unix.SockFilter{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS})
	}
	return append(p, unix.SockFilter{Code: unix.BPF_RET | unix.BPF_K, K: 0xffffffff})
}

// bigProgram loads an eBPF socket filter of n instructions that accepts everything.
func bigProgram(n int) (*ebpf.Program, error) {
	insns := make(asm.Instructions, 0, n)
	for range n - 2 {
		insns = append(insns, asm.Mov.Imm(asm.R0, 0))
	}
	insns = append(insns, asm.Mov.Imm(asm.R0, -1), asm.Return())
	return ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SocketFilter, License: "GPL", Instructions: insns})
}

// sockopt runs fn on c's descriptor.
func sockopt(t *testing.T, c syscall.Conn, fn func(fd int) error) error {
	t.Helper()
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := raw.Control(func(fd uintptr) { serr = fn(int(fd)) }); err != nil {
		t.Fatal(err)
	}
	return serr
}

func attachClassic(t *testing.T, c syscall.Conn, prog []unix.SockFilter) error {
	return sockopt(t, c, func(fd int) error {
		return unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]})
	})
}

func attachProgram(t *testing.T, c syscall.Conn, p *ebpf.Program) error {
	return sockopt(t, c, func(fd int) error { return unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ATTACH_BPF, p.FD()) })
}

func lockFilter(t *testing.T, c syscall.Conn) {
	t.Helper()
	if err := sockopt(t, c, func(fd int) error { return unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_LOCK_FILTER, 1) }); err != nil {
		t.Fatal(err)
	}
}

func scratchSocket(t *testing.T) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// largest returns the largest n in [1, hi] for which fits(n) holds (fits(1) must).
func largest(hi int, fits func(n int) bool) int {
	lo := 1
	for lo < hi {
		m := (lo + hi + 1) / 2
		if fits(m) {
			lo = m
		} else {
			hi = m - 1
		}
	}
	return lo
}

// undoEnv is a pinned filter and the filters that leave no room for it beside them.
type undoEnv struct {
	pin     string
	prog    *ebpf.Program // the pinned program
	big     int           // instructions of the longest classic program a socket takes
	bigEBPF *ebpf.Program // the longest eBPF program a socket takes
	pinned  *rrl.Filter   // the pins, opened by root, for their counters
}

// largestFilters caches the sizes newUndoEnv finds: they depend only on the kernel
// and net.core.optmem_max.
var largestFilters struct{ classic, ebpf int }

func newUndoEnv(t *testing.T) *undoEnv {
	t.Helper()
	e := &undoEnv{pin: filepath.Join(bpffs(t), "undo")}
	if code, out, errOut := rrlctl("load", "-pin", e.pin, "-requests-per-second", "500"); code != exitOK {
		t.Fatalf("load: exit %d: %s%s", code, out, errOut)
	}
	var err error
	if e.prog, err = ebpf.LoadPinnedProgram(filepath.Join(e.pin, "rrl_filter"), &ebpf.LoadPinOptions{ReadOnly: true}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.prog.Close() })
	if e.pinned, err = rrl.OpenPinned(e.pin); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.pinned.Close() })

	// The pinned program must not fit beside the largest filters: check it on
	// scratch sockets.
	noRoom := func(what string, put func(c *net.UDPConn) error) {
		c := scratchSocket(t)
		defer c.Close()
		if err := put(c); err != nil {
			t.Fatal(err)
		}
		if err := attachProgram(t, c, e.prog); !errors.Is(err, unix.ENOMEM) {
			t.Fatalf("attaching the pinned program beside %s: %v; want ENOMEM (net.core.optmem_max too large?)", what, err)
		}
	}
	if largestFilters.classic == 0 {
		largestFilters.classic = largest(4096, func(n int) bool {
			c := scratchSocket(t)
			defer c.Close()
			return attachClassic(t, c, acceptAll(n)) == nil
		})
		largestFilters.ebpf = largest(1<<15, func(n int) bool {
			p, err := bigProgram(n)
			if err != nil {
				return false
			}
			defer p.Close()
			c := scratchSocket(t)
			defer c.Close()
			return attachProgram(t, c, p) == nil
		})
	}
	e.big = largestFilters.classic
	n := largestFilters.ebpf
	noRoom(fmt.Sprintf("a classic program of %d instructions", e.big), func(c *net.UDPConn) error { return attachClassic(t, c, acceptAll(e.big)) })
	if e.bigEBPF, err = bigProgram(n); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.bigEBPF.Close() })
	noRoom(fmt.Sprintf("an eBPF program of %d instructions", n), func(c *net.UDPConn) error { return attachProgram(t, c, e.bigEBPF) })
	t.Logf("largest filters a socket takes: classic %d instructions, eBPF %d", e.big, n)
	return e
}

// target is a socket of this process given a filter of a kind.
type target struct {
	kind string
	conn *net.UDPConn
	addr netip.AddrPort
	fd   int
	own  *rrl.Filter // the socket's own eBPF filter (kind "own eBPF")
}

func (tg *target) String() string { return fmt.Sprintf("fd %d %s (%s)", tg.fd, tg.addr, tg.kind) }

// targets opens a socket for every kind, on 127.0.0.x and one port, and gives the
// i-th by descriptor the filter kinds[i] names: "none", "classic" (2 instructions),
// "big classic" (the longest a socket takes), "own eBPF" (rrl.Attach in this
// process, a program of its own), "big eBPF", "pinned" (the pinned program, as an
// earlier attach leaves it); "locked " before a kind locks it.
func (e *undoEnv) targets(t *testing.T, kinds ...string) (uint16, []*target) {
	t.Helper()
	var socks []*target
	var port uint16
	for attempt := 0; len(socks) < len(kinds); attempt++ {
		for _, s := range socks {
			s.conn.Close()
		}
		socks = nil
		if attempt == 10 {
			t.Fatal("no port free on 127.0.0.30 and up")
		}
		port = freePort(t)
		for i := range kinds {
			addr := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, byte(30 + i)}), port)
			c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(addr))
			if err != nil {
				break
			}
			socks = append(socks, &target{conn: c, addr: addr})
		}
	}
	found, err := procsock.UDP(0, netip.AddrPortFrom(netip.IPv4Unspecified(), port))
	if err != nil || len(found) != len(socks) {
		t.Fatalf("this process's sockets on port %d: %v, %v", port, found, err)
	}
	for _, s := range socks {
		s.fd = slices.IndexFunc(found, func(f procsock.Socket) bool { return f.Local == s.addr })
		s.fd = found[s.fd].FD
	}
	slices.SortFunc(socks, func(a, b *target) int { return a.fd - b.fd })
	for i, s := range socks {
		t.Cleanup(func() { s.conn.Close() })
		s.kind = kinds[i]
		kind, locked := strings.CutPrefix(s.kind, "locked ")
		var err error
		switch kind {
		case "none":
		case "classic":
			err = attachClassic(t, s.conn, acceptAll(2))
		case "big classic":
			err = attachClassic(t, s.conn, acceptAll(e.big))
		case "own eBPF":
			s.own, err = rrl.Attach(s.conn, rrl.NewConfig())
			if err == nil && s.own.Mode() != rrl.ModeEBPF {
				err = fmt.Errorf("rrl.Attach in mode %v", s.own.Mode())
			}
			if s.own != nil {
				t.Cleanup(func() { s.own.Close() })
			}
		case "big eBPF":
			err = attachProgram(t, s.conn, e.bigEBPF)
		case "pinned":
			err = attachProgram(t, s.conn, e.prog)
		default:
			t.Fatalf("unknown kind %q", kind)
		}
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		if locked {
			lockFilter(t, s.conn)
		}
	}
	return port, socks
}

// filters returns what SaveFilter says of every target.
func filters(t *testing.T, socks []*target) []procsock.SavedFilter {
	t.Helper()
	var out []procsock.SavedFilter
	for _, s := range socks {
		f, err := procsock.SaveFilter(s.conn)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, f)
	}
	return out
}

// seenBy sends one query to s and returns how many packets its own filter and the
// pinned one counted meanwhile.
func (e *undoEnv) seenBy(t *testing.T, s *target) (own, pinned uint64) {
	t.Helper()
	stats := func() (uint64, uint64) {
		a, err := s.own.Stats()
		if err != nil {
			t.Fatal(err)
		}
		b, err := e.pinned.Stats()
		if err != nil {
			t.Fatal(err)
		}
		return a.Seen, b.Seen
	}
	own0, pinned0 := stats()
	c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(s.addr))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	q, err := query("example.test.").Pack()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(q); err != nil {
		t.Fatal(err)
	}
	// Loopback delivers within the send, as a rule; allow for a slow machine.
	for deadline := time.Now().Add(time.Second); ; time.Sleep(5 * time.Millisecond) {
		own1, pinned1 := stats()
		if own1+pinned1 > own0+pinned0 || time.Now().After(deadline) {
			return own1 - own0, pinned1 - pinned0
		}
	}
}

// socketLine returns the line of rrlctl's report about s.
func socketLine(out string, s *target) string {
	for line := range strings.Lines(out) {
		if strings.HasPrefix(strings.TrimSpace(line), fmt.Sprintf("fd %d IPv4 %s:", s.fd, s.addr)) {
			return strings.TrimSpace(line)
		}
	}
	return ""
}

// TestAttachUndo: when rrlctl attach fails on one socket, every socket of the server
// is left with the filter it had: those reached before the failure get theirs back
// (none, or their classic program, to the instruction), the one that failed and
// those after it are untouched, a socket with the server's own eBPF filter keeps it
// (and it still counts the socket's packets), the keyword flags are not applied, and
// the report names each socket's filter. Failures are real (ENOMEM) except in the
// case no real one can produce: a failure for another reason on an eBPF socket after
// another took the filter, which that one then keeps, said so.
func TestAttachUndo(t *testing.T) {
	e := newUndoEnv(t)
	self := strconv.Itoa(os.Getpid())
	cases := []struct {
		name   string
		kinds  []string
		fail   int      // the socket attach fails on
		inject bool     // make the second eBPF socket's attach fail, not the kernel
		want   []string // in the report line of each socket
		kept   []bool   // whether each socket has the filter it had
	}{
		{
			name:  "among sockets whose filter can be put back",
			kinds: []string{"none", "classic", "none", "big classic", "none", "classic", "own eBPF"},
			fail:  3,
			want:  []string{"no filter again, as before", "classic filter (2 instructions) again, as before", "no filter again, as before", "as before: attach failed here", "no filter, untouched", "classic filter (2 instructions), untouched", "eBPF filter, untouched"},
		},
		{
			name:  "on the eBPF socket using the most option memory, attached before the other",
			kinds: []string{"none", "own eBPF", "classic", "big eBPF"},
			fail:  3,
			want:  []string{"no filter again, as before", "eBPF filter, untouched", "classic filter (2 instructions) again, as before", "as before: attach failed here"},
		},
		{
			name:   "on a later eBPF socket, for a reason other than option memory",
			kinds:  []string{"none", "own eBPF", "pinned"},
			fail:   2,
			inject: true,
			want:   []string{"no filter again, as before", "protected by the filter pinned in " + e.pin + ", which replaced its eBPF filter: the kernel cannot give that back", "eBPF filter, as before: attach failed here"},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.inject {
				calls := 0
				attachSocket = func(f *rrl.Filter, k *procsock.Conn) error {
					if kind, _ := procsock.AttachedFilter(k); kind == procsock.EBPFFilter {
						if calls++; calls == 2 {
							return fmt.Errorf("injected failure: %w", unix.EINVAL)
						}
					}
					return f.Attach(k)
				}
				defer func() { attachSocket = func(f *rrl.Filter, k *procsock.Conn) error { return f.Attach(k) } }()
			}
			port, socks := e.targets(t, c.kinds...)
			before := filters(t, socks)
			cfg := e.pinned.Config().Values()
			code, out, errOut := rrlctl("attach", "-pid", self, "-listen", fmt.Sprintf("0.0.0.0:%d", port), "-pin", e.pin, "-requests-per-second", "77")
			t.Logf("exit %d\n%s%s", code, out, errOut)
			if head := "attach failed; every socket of process " + self + " has the filter it had"; !strings.HasPrefix(out, head) || strings.Contains(out, "keep the one pinned") != c.inject {
				t.Errorf("report %q: want it to start %q, naming the socket that keeps the pinned filter if any", out, head)
			}
			failed := socks[c.fail]
			if code != exitError || !strings.Contains(errOut, fmt.Sprintf("attach to fd %d IPv4 %s", failed.fd, failed.addr)) {
				t.Errorf("exit %d, %q; want a failure naming %s", code, errOut, failed)
			}
			if !c.inject && !strings.Contains(errOut, "optmem") {
				t.Errorf("error %q does not say the option memory ran out", errOut)
			}
			after := filters(t, socks)
			for i, s := range socks {
				line := socketLine(out, s)
				if !strings.Contains(line, c.want[i]) {
					t.Errorf("%s: reported %q, want %q", s, line, c.want[i])
				}
				changed := c.inject && i == 1
				if !changed && !reflect.DeepEqual(after[i], before[i]) {
					t.Errorf("%s: filter %+v, had %+v", s, after[i], before[i])
				}
				if s.own == nil {
					continue
				}
				own, pinned := e.seenBy(t, s)
				if changed {
					// The documented limit: it now has the pinned filter.
					if own != 0 || pinned != 1 {
						t.Errorf("%s: a query counted by its own filter %d times, by the pinned one %d; want 0, 1", s, own, pinned)
					}
				} else if own != 1 || pinned != 0 {
					t.Errorf("%s: a query counted by its own filter %d times, by the pinned one %d; want 1, 0", s, own, pinned)
				}
			}
			if got := e.pinned.Config().Values(); !reflect.DeepEqual(got, cfg) {
				t.Errorf("the failed attach changed the pinned configuration to %v", got)
			}
		})
	}
}

// TestAttachChecksFirst: a locked filter on any socket fails attach and detach
// before they touch a socket, and attach creates no pins then.
func TestAttachChecksFirst(t *testing.T) {
	e := newUndoEnv(t)
	self := strconv.Itoa(os.Getpid())
	fresh := filepath.Join(filepath.Dir(e.pin), "fresh")
	for _, c := range []struct {
		cmd   string
		kinds []string
	}{
		{"attach", []string{"none", "classic", "locked classic", "pinned"}},
		{"attach", []string{"none", "pinned", "locked own eBPF"}},
		{"attach", []string{"classic", "locked none"}},
		{"detach", []string{"pinned", "none", "locked pinned"}},
	} {
		port, socks := e.targets(t, c.kinds...)
		before := filters(t, socks)
		code, out, errOut := rrlctl(c.cmd, "-pid", self, "-listen", fmt.Sprintf("0.0.0.0:%d", port), "-pin", fresh)
		t.Logf("%s %q: exit %d\n%s%s", c.cmd, c.kinds, code, out, errOut)
		if code != exitError || !strings.Contains(errOut, "locked (SO_LOCK_FILTER)") || !strings.Contains(errOut, "no socket was touched") {
			t.Errorf("%s %q: exit %d, %q; want the locked filter refused", c.cmd, c.kinds, code, errOut)
		}
		if got := filters(t, socks); !reflect.DeepEqual(got, before) {
			t.Errorf("%s %q: filters %+v, had %+v", c.cmd, c.kinds, got, before)
		}
		if _, err := os.Stat(fresh); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s %q left %s: %v", c.cmd, c.kinds, fresh, err)
		}
	}
}

// TestAttachDetachReport: a successful attach names every socket and what its filter
// replaced, and applies the keyword flags; detach removes eBPF filters and leaves a
// classic one in place.
func TestAttachDetachReport(t *testing.T) {
	e := newUndoEnv(t)
	self := strconv.Itoa(os.Getpid())
	port, socks := e.targets(t, "none", "classic", "own eBPF", "pinned")
	listen := fmt.Sprintf("0.0.0.0:%d", port)
	code, out, errOut := rrlctl("attach", "-pid", self, "-listen", listen, "-pin", e.pin, "-requests-per-second", "77")
	t.Logf("attach: exit %d\n%s%s", code, out, errOut)
	if code != exitOK || !strings.Contains(out, fmt.Sprintf("attached the filter pinned in %s to 4 socket(s)", e.pin)) {
		t.Fatalf("attach: exit %d: %s%s", code, out, errOut)
	}
	want := []string{"(it had no filter)", "(replacing its classic filter (2 instructions))", "(replacing its eBPF filter", "(replacing its eBPF filter"}
	for i, s := range socks {
		if line := socketLine(out, s); !strings.Contains(line, "protected by the filter pinned in "+e.pin+" "+want[i]) {
			t.Errorf("%s: reported %q, want %q", s, line, want[i])
		}
	}
	for i, f := range filters(t, socks) {
		if f.Kind != procsock.EBPFFilter {
			t.Errorf("%s after attach: %+v", socks[i], f)
		}
	}
	if own, pinned := e.seenBy(t, socks[2]); own != 0 || pinned != 1 {
		t.Errorf("%s after attach: a query counted by its own filter %d times, by the pinned one %d; want 0, 1", socks[2], own, pinned)
	}
	if v := e.pinned.Config().Values(); !slices.Contains(v, [2]string{"requests-per-second", "77"}) {
		t.Errorf("keyword flags not applied: %v", v)
	}

	// The server puts a classic filter back on one socket: detach leaves it.
	classic := acceptAll(5)
	if err := attachClassic(t, socks[0].conn, classic); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = rrlctl("detach", "-pid", self, "-listen", listen, "-pin", e.pin)
	t.Logf("detach: exit %d\n%s%s", code, out, errOut)
	if code != exitOK || !strings.Contains(out, "detached the filter from 3 socket(s)") || !strings.Contains(out, "left the classic filter of 1 socket(s)") {
		t.Errorf("detach: exit %d: %s%s", code, out, errOut)
	}
	for i, f := range filters(t, socks) {
		if i == 0 && (f.Kind != procsock.ClassicFilter || !slices.Equal(f.Classic, classic)) || i > 0 && f.Kind != procsock.NoFilter {
			t.Errorf("%s after detach: %+v", socks[i], f)
		}
	}
}
