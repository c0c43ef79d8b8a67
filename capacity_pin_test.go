//go:build linux

package rrl

import (
	"bytes"
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
)

// TestPinnedCapacityCellsBatch: a pinned filter's controller without write access
// to rrl_cells (the kernel maps a map only through a descriptor opened for
// writing) reads the sketches by batches, and gets what the memory map shows.
func TestPinnedCapacityCellsBatch(t *testing.T) {
	e := newPinEnv(t)
	dir := filepath.Join(e.mnt, "rrl")
	loadPinnedForTest(t, dir, "500", -1, -1)
	srv := newUDPServer(t, "udp4", "127.0.0.1:0")
	f, err := AttachPinned(srv.conn, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
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
