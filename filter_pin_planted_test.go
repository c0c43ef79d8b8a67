package rrl

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/dnsrake/rrl/internal/procsock"
	"github.com/dnsrake/rrl/internal/testutil"
)

// TestPlantedPinsRefused reproduces planted pins on a bpffs with the kernel's
// default mode 1777: uid 65534 makes a directory of its own there and pins the
// objects of a loaded filter in it (a member of the pins' group can open them).
// Every entry point refuses that directory, naming it, and leaves the socket without
// a filter; the directory's owner itself, whose objects they may be, may use it; the
// filter root loaded next to it in the sticky root is used as before.
func TestPlantedPinsRefused(t *testing.T) {
	e := newPinEnvMode(t, "1777")
	legit := filepath.Join(e.mnt, "rrl")
	loadPinnedForTest(t, legit, "100", -1, nobody)
	planted := filepath.Join(e.mnt, "planted")
	testutil.MkdirAs(t, planted, nobody)
	testutil.Repin(t, legit, planted, nobody)
	if fi, err := os.Stat(planted); err != nil || fi.Sys().(*syscall.Stat_t).Uid != nobody {
		t.Fatalf("planted directory: %v, %v", fi, err)
	}

	refused := func(t *testing.T, what string, err error) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), planted) || !strings.Contains(err.Error(), "other than root") {
			t.Errorf("%s(%s): %v; want a refusal naming the directory", what, planted, err)
		}
	}
	f, err := OpenPinned(planted)
	if f != nil {
		f.Close()
	}
	refused(t, "OpenPinned", err)

	srv := newUDPServer(t, "udp4", "127.0.0.1:0")
	f, err = AttachPinned(srv.conn, planted)
	if f != nil {
		f.Close()
	}
	refused(t, "AttachPinned", err)
	if kind, err := procsock.AttachedFilter(srv.conn); err != nil || kind != procsock.NoFilter {
		t.Errorf("after the refused AttachPinned the socket has %q (%v)", kind, err)
	}

	// A Protection falls back to a filter of its own, and says why.
	p, err := Protect(srv.conn, nil, NewConfig(), WithPinned(planted))
	if err != nil {
		t.Fatal(err)
	}
	st := p.Status()
	p.Close()
	if st.Pinned != "" {
		t.Errorf("a Protection WithPinned(%s) uses the planted pins: %+v", planted, st)
	}
	refused(t, "WithPinned", st.Reason)

	refused(t, "Unpin", Unpin(planted))
	if _, err := os.Stat(filepath.Join(planted, pinProgram)); err != nil {
		t.Errorf("the refused Unpin removed a pin: %v", err)
	}

	// The directory's owner may use its own directory.
	if r := e.start(t, "probe", planted, nobody, nobody, 0).result(t); r.Err != "" || r.Mode != "ebpf" {
		t.Errorf("uid %d attaching from its own directory: %+v", nobody, r)
	}
	// Root's filter next to it, in the sticky bpffs root, is used as before.
	f, err = AttachPinned(srv.conn, legit)
	if err != nil {
		t.Fatalf("AttachPinned(%s): %v", legit, err)
	}
	f.Close()
	if err := Unpin(legit); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(legit); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%s after Unpin: %v", legit, err)
	}
}
