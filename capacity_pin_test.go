//go:build linux

package rrl

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

// TestPinnedCapacityCellsBatch: a pinned filter's controller without write access
// to rrl_cells (the kernel maps a map only through a descriptor opened for
// writing) reads the sketches by batches, and gets what the memory map shows.
func TestPinnedCapacityCellsBatch(t *testing.T) {
	e := newPinEnv(t)
	dir := filepath.Join(e.mnt, "rrl")
	loadPinnedForTest(t, dir, "500", -1, -1)
	srv, f := attachPinnedServer(t, dir)
	raw := newRawSender(t, srv.addr)
	for i := range 20 {
		sendQueries(t, f, raw, netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 6, 7, byte(1 + i)}), 40000), srv.addr, 10)
	}
	if _, err := f.objs.Cells.Memory(); err == nil {
		t.Log("this kernel maps a read-only descriptor of rrl_cells")
	}
	got, err := readCellsBatch(f.objs.Cells, nil)
	if err != nil {
		t.Fatal(err)
	}
	rw, err := ebpf.LoadPinnedMap(filepath.Join(dir, pinCells), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rw.Close()
	mem, err := rw.Memory()
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, len(got))
	if _, err := mem.ReadAt(want, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) || bytes.Count(got, []byte{0}) == len(got) {
		t.Errorf("cells read by batches differ from the memory map (or are all zero): %d bytes", len(got))
	}
}

// TestPinnedRunCapacity runs Filter.RunCapacity in this process on a pinned filter
// attached to a socket of it, with a configured capacity of 1,000 queries per second
// and 5,000 arriving: the water level comes into force for the pins (seen through
// another Filter of them), with the cells read through the memory map or by
// batches, and leaves when the controller's Filter is closed or its context ends.
func TestPinnedRunCapacity(t *testing.T) {
	e := newPinEnv(t)
	for i, tc := range []struct {
		name   string
		batch  bool // no read-write descriptor of the cells: read them by batches
		closeF bool // stop by closing the Filter instead of ending the context
	}{
		{"mapped, context ends", false, false},
		{"batches, Filter closed", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.batch {
				orig := openCellsRW
				openCellsRW = func(string) (*ebpf.Map, error) { return nil, errors.New("test: no write access") }
				defer func() { openCellsRW = orig }()
			}
			dir := filepath.Join(e.mnt, fmt.Sprint("rrl", i))
			cfg := NewConfig()
			if err := cfg.SetValue("capacity", "1000"); err != nil {
				t.Fatal(err)
			}
			if err := LoadPinned(cfg, dir, -1, -1); err != nil {
				t.Fatal(err)
			}
			srv, f := attachPinnedServer(t, dir)
			limits := func() (low float64) {
				st, err := f.Stats()
				if err != nil {
					t.Fatal(err)
				}
				low = math.Inf(1)
				for _, n := range st.Nodes {
					low = min(low, n.Limit)
				}
				return low
			}
			static := limits()
			ctl, err := OpenPinned(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer ctl.Close()
			if err := (&Filter{}).RunCapacity(context.Background()); err == nil {
				t.Error("RunCapacity of a Filter that is not open: no error")
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- ctl.RunCapacity(ctx, srv.conn) }()

			raw := newRawSender(t, srv.addr)
			stop := make(chan struct{})
			flooded := make(chan struct{})
			go func() {
				defer close(flooded)
				tick := time.NewTicker(5 * time.Millisecond)
				defer tick.Stop()
				for i := 0; i < 1200; i++ {
					select {
					case <-stop:
						return
					case <-tick.C:
					}
					for j := range 25 {
						src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 6, 8, byte(1 + (i*25+j)%200)}), 40000)
						raw.Send(ipv4Packet(src, srv.addr, nil, dnsQuery(uint16(j), false)))
					}
				}
			}()
			defer func() { close(stop); <-flooded }()
			var capst *CapacityStats
			deadline := time.Now().Add(4 * time.Second)
			for ; time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
				st, err := f.Stats()
				if err != nil {
					t.Fatal(err)
				}
				if capst = st.Capacity; capst != nil && capst.Overloaded && capst.Level > 0 && limits() < static {
					break
				}
			}
			if capst == nil || !capst.Overloaded || capst.Level <= 0 || capst.Capacity != 1000 || limits() >= static {
				t.Fatalf("no water level in force after the flood: capacity %+v, lowest limit %g (static %g)", capst, limits(), static)
			}
			if tc.closeF {
				ctl.Close()
			} else {
				cancel()
			}
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("RunCapacity: %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("RunCapacity did not return")
			}
			if low := limits(); low != static {
				t.Errorf("lowest limit %g after the controller stopped; want the static %g", low, static)
			}
			st, _ := f.Stats()
			if c := st.Capacity; c == nil || c.Level != 0 || !strings.Contains(c.Problem, "no controller runs") {
				t.Errorf("capacity after the controller stopped: %+v", c)
			}
		})
	}
}

// TestPinnedCapacityOwnSocketOnce: a server running its pins' controller over the
// socket it attached to the pins (RunCapacity(ctx, conn) after AttachPinned(conn))
// has that socket's queue read once, not twice: read twice, every drop (the
// program's included) counted twice as an overflow, and R stayed at its floor.
func TestPinnedCapacityOwnSocketOnce(t *testing.T) {
	e := newPinEnv(t)
	dir := filepath.Join(e.mnt, "rrl")
	loadPinnedForTest(t, dir, "1", 0, 0)
	srv, f := attachPinnedServer(t, dir)
	other := newUDPServer(t, "udp4", "127.0.0.1:0")
	r := &capacityRun{}
	k := &kernelCapacity{f: f, run: r, pinned: true, watched: []syscall.Conn{srv.conn, other.conn}}
	f.mu.Lock()
	f.capacity.run = r
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.capacity.run = nil
		f.mu.Unlock()
	}()
	// A flood from one source, which the program drops at 1 query per second.
	client := newUDPServer(t, "udp4", "127.0.0.1:0")
	if _, err := k.sample(monotonicNow()); err != nil {
		t.Fatal(err)
	}
	for range 300 {
		if _, err := client.conn.WriteToUDPAddrPort(queryBytes(t, "www.victim.test."), srv.addr); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(100 * time.Millisecond)
	in, err := k.sample(monotonicNow())
	if err != nil {
		t.Fatal(err)
	}
	if in.Sockets != 2 {
		t.Errorf("%d sockets read, want 2 (the attached one once, and the other)", in.Sockets)
	}
	if in.Overflow != 0 {
		t.Errorf("the program's drops counted as %d overflows", in.Overflow)
	}
}
