//go:build linux

package procsock

import (
	"errors"
	"net"
	"os"
	"slices"
	"syscall"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"
)

// acceptAll is a classic program of n instructions: n-1 loads of the packet's first
// word, then "accept".
func acceptAll(n int) []unix.SockFilter {
	p := make([]unix.SockFilter, 0, n)
	for range n - 1 {
		p = append(p, unix.SockFilter{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS})
	}
	return append(p, unix.SockFilter{Code: unix.BPF_RET | unix.BPF_K, K: 0xffffffff})
}

func udpSocket(t *testing.T) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func setsockopt(t *testing.T, c syscall.Conn, fn func(fd int) error) error {
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

func saved(t *testing.T, c syscall.Conn) SavedFilter {
	t.Helper()
	s, err := SaveFilter(c)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// largestClassic returns the longest acceptAll program a fresh socket takes: one
// that fills nearly all of net.core.optmem_max.
func largestClassic(t *testing.T) int {
	t.Helper()
	lo, hi := 1, 4096 // BPF_MAXINSNS
	for lo < hi {
		m := (lo + hi + 1) / 2
		if setFilter(udpSocket(t), acceptAll(m)) == nil {
			lo = m
		} else {
			hi = m - 1
		}
	}
	return lo
}

// TestSaveRestoreFilter: SaveFilter tells no filter, a classic one (with its
// program and option memory) and an eBPF one apart, and sees a lock; RestoreFilter
// puts back no filter and classic programs exactly, even where the socket's
// current filter and the one put back do not fit its option memory together, and
// refuses, changing nothing, for an eBPF filter and on a locked socket.
func TestSaveRestoreFilter(t *testing.T) {
	small := acceptAll(3)
	t.Run("none", func(t *testing.T) {
		c := udpSocket(t)
		s := saved(t, c)
		if s.Kind != NoFilter || s.Classic != nil || s.Locked || s.OptMem != 0 || !s.Restorable() {
			t.Fatalf("fresh socket: %+v", s)
		}
		if err := setFilter(c, small); err != nil {
			t.Fatal(err)
		}
		if err := RestoreFilter(c, s); err != nil {
			t.Fatal(err)
		}
		if got := saved(t, c); got.Kind != NoFilter || got.OptMem != 0 {
			t.Errorf("after restoring no filter: %+v", got)
		}
		if err := RestoreFilter(c, s); err != nil {
			t.Errorf("restoring no filter on a socket without one: %v", err)
		}
	})
	t.Run("classic", func(t *testing.T) {
		c := udpSocket(t)
		if err := setFilter(c, small); err != nil {
			t.Fatal(err)
		}
		s := saved(t, c)
		if s.Kind != ClassicFilter || !slices.Equal(s.Classic, small) || s.OptMem == 0 || !s.Restorable() {
			t.Fatalf("classic: %+v", s)
		}
		if err := setFilter(c, acceptAll(7)); err != nil {
			t.Fatal(err)
		}
		if err := RestoreFilter(c, s); err != nil {
			t.Fatal(err)
		}
		if got := saved(t, c); !slices.Equal(got.Classic, small) || got.OptMem != s.OptMem {
			t.Errorf("restored %+v, want %+v", got, s)
		}
	})
	t.Run("classic that does not fit beside the current filter", func(t *testing.T) {
		n := largestClassic(t)
		big := acceptAll(n)
		other := acceptAll(n - 1)
		c := udpSocket(t)
		if err := setFilter(c, big); err != nil {
			t.Fatal(err)
		}
		s := saved(t, c)
		if err := setFilter(c, other); err == nil || !errors.Is(err, unix.ENOMEM) {
			t.Fatalf("replacing a %d-instruction program with one of %d: %v, want ENOMEM (both charged at once)", n, n-1, err)
		}
		if err := DetachFilter(c); err != nil {
			t.Fatal(err)
		}
		if err := setFilter(c, other); err != nil {
			t.Fatal(err)
		}
		if err := RestoreFilter(c, s); err != nil {
			t.Fatalf("restore: %v", err)
		}
		if got := saved(t, c); !slices.Equal(got.Classic, big) || got.OptMem != s.OptMem {
			t.Errorf("restored %d instructions, option memory %d; want %d, %d", len(got.Classic), got.OptMem, n, s.OptMem)
		}
	})
	t.Run("locked", func(t *testing.T) {
		c := udpSocket(t)
		if err := setFilter(c, small); err != nil {
			t.Fatal(err)
		}
		if err := setsockopt(t, c, func(fd int) error {
			return unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_LOCK_FILTER, 1)
		}); err != nil {
			t.Fatal(err)
		}
		s := saved(t, c)
		if !s.Locked || s.Kind != ClassicFilter {
			t.Fatalf("locked: %+v", s)
		}
		if err := RestoreFilter(c, SavedFilter{Kind: NoFilter}); !errors.Is(err, unix.EPERM) {
			t.Errorf("restoring on a locked socket: %v, want EPERM", err)
		}
		if got := saved(t, c); !slices.Equal(got.Classic, small) {
			t.Errorf("the locked filter changed: %+v", got)
		}
	})
	t.Run("eBPF", func(t *testing.T) {
		prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
			Type:         ebpf.SocketFilter,
			License:      "GPL",
			Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, -1), asm.Return()},
		})
		if err != nil {
			if errors.Is(err, unix.EPERM) && os.Getenv("RRL_REQUIRE_BPF") != "1" {
				t.Skipf("loading a socket filter needs CAP_BPF: %v", err)
			}
			t.Fatal(err)
		}
		defer prog.Close()
		c := udpSocket(t)
		if err := setsockopt(t, c, func(fd int) error {
			return unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ATTACH_BPF, prog.FD())
		}); err != nil {
			t.Fatal(err)
		}
		s := saved(t, c)
		if s.Kind != EBPFFilter || s.Classic != nil || s.OptMem == 0 || s.Restorable() {
			t.Fatalf("eBPF: %+v", s)
		}
		if err := setFilter(c, small); err != nil {
			t.Fatal(err)
		}
		if err := RestoreFilter(c, s); !errors.Is(err, ErrNotRestorable) {
			t.Errorf("restoring an eBPF filter: %v, want ErrNotRestorable", err)
		}
		if got := saved(t, c); got.Kind != ClassicFilter {
			t.Errorf("a refused restore changed the filter: %+v", got)
		}
	})
}
