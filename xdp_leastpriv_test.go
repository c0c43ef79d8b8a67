//go:build linux

package rrl

import (
	"errors"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/dnsrake/rrl/internal/loadgen"
	"github.com/dnsrake/rrl/internal/testutil"
	"golang.org/x/sys/unix"
)

// xdpLeastPrivilegeEnv gives the child of TestAttachXDPLeastPrivilege the pin
// directory and the interface, "PIN,DEV".
const xdpLeastPrivilegeEnv = "RRL_TEST_XDP_LEAST_PRIVILEGE"

// TestAttachXDPLeastPrivilege runs AttachXDP as uid 65534 with CAP_BPF and
// CAP_NET_ADMIN as its only capabilities (what `setpriv --reuid 65534 --regid 65534
// --clear-groups --inh-caps +bpf,+net_admin --ambient-caps +bpf,+net_admin` gives),
// in the receiving namespace of a veth pair of the test's own: the verifier accepts
// the XDP program without CAP_PERFMON, it attaches natively, and it limits a source
// the test sends from the other namespace (no socket filter is attached, so every
// judged and limited packet is XDP's).
func TestAttachXDPLeastPrivilege(t *testing.T) {
	if v := os.Getenv(xdpLeastPrivilegeEnv); v != "" {
		checkOnlyCaps(t, unix.CAP_BPF, unix.CAP_NET_ADMIN)
		op, rest, _ := strings.Cut(v, ",")
		pin, dev, _ := strings.Cut(rest, ",")
		switch op {
		case "attach":
			generic, err := AttachXDP(pin, dev, nil)
			if err != nil {
				t.Fatalf("AttachXDP: %v", err)
			}
			if generic {
				t.Fatal("AttachXDP fell back to generic mode on a veth, which has native XDP")
			}
		case "detach":
			if err := DetachXDP(pin, dev); err != nil {
				t.Fatalf("DetachXDP: %v", err)
			}
		default:
			t.Fatalf("%s=%s", xdpLeastPrivilegeEnv, v)
		}
		return
	}
	requireBPF(t)
	requirePrivilege(t, unix.CAP_SETUID, unix.CAP_SETGID, unix.CAP_NET_ADMIN, unix.CAP_SYS_ADMIN)
	release, err := testutil.LockLive()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)

	pin := filepath.Join(newPinEnv(t).mnt, "rrl")
	cfg := NewConfig()
	for _, kv := range [][2]string{{"requests-per-second", "5"}, {"slip-ratio", "0"}} {
		if err := cfg.SetValue(kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := LoadPinned(cfg, pin, -1, -1); err != nil {
		t.Fatalf("LoadPinned: %v", err)
	}
	// The pins are the child's, as they are root's for a root process with only
	// these capabilities: the owner's bits let it write the destinations
	// (pinModes), and it pins the link in the directory.
	chownPins(t, pin, unprivilegedID)
	veth, err := loadgen.NewVeth()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { veth.Close() })
	var srv *udpServer
	veth.Receiver.Do(func() error {
		srv = newUDPServer(t, "udp4", netip.AddrPortFrom(veth.Receiver4, 53).String())
		return nil
	})

	// The child starts from a thread in the receiving namespace, which it keeps:
	// CAP_NET_ADMIN alone does not let it enter one.
	child := func(op string) {
		t.Helper()
		chownPins(t, pin, unprivilegedID)
		defer chownPins(t, pin, 0) // OpenPinned wants root's directory
		var out []byte
		veth.Receiver.Do(func() error {
			out, err = unprivilegedRunCaps(t, "TestAttachXDPLeastPrivilege", []uintptr{unix.CAP_BPF, unix.CAP_NET_ADMIN},
				xdpLeastPrivilegeEnv+"="+op+","+pin+","+veth.ReceiverDev)
			return nil
		})
		if err != nil {
			t.Fatalf("%s by a child with CAP_BPF and CAP_NET_ADMIN: %v\n%s", op, err, out)
		}
		t.Logf("%s by a child with CAP_BPF and CAP_NET_ADMIN (uid %d):\n%s", op, unprivilegedID, out)
	}
	attached := func() uint32 {
		t.Helper()
		var id uint32
		veth.Receiver.Do(func() error {
			id, err = xdpAttachedProgram(veth.ReceiverIndex)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	child("attach")
	t.Cleanup(func() { // if the test stops before the child detaches
		veth.Receiver.Do(func() error { DetachXDP(pin, veth.ReceiverDev); return nil })
	})
	if attached() == 0 {
		t.Fatal("no XDP program on the receiver after the child attached one")
	}

	var client *net.UDPConn
	err = veth.Sender.Do(func() error {
		var err error
		client, err = net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(srv.addr))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	const queries = 200
	for i := range queries {
		if _, err := client.Write(dnsQuery(uint16(i+1), false)); err != nil {
			t.Fatal(err)
		}
	}
	delivered := 0
	buf := make([]byte, 512)
	for {
		srv.conn.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		if _, _, err := srv.conn.ReadFromUDP(buf); err != nil {
			var nerr net.Error
			if !errors.As(err, &nerr) || !nerr.Timeout() {
				t.Fatal(err)
			}
			break
		}
		delivered++
	}
	f, err := OpenPinned(pin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("delivered %d of %d queries; stats %+v", delivered, queries, st)
	// Five a second and the estimator's burst is a handful; 50 leaves room for a
	// slow machine spreading the sends over seconds.
	if delivered == 0 || delivered > 50 {
		t.Errorf("delivered %d of %d queries at 5 per second", delivered, queries)
	}
	// Only XDP counts: it saw every query, and what it did not pass it limited.
	if st.Seen != queries || st.Passed != uint64(delivered) || st.limited() != uint64(queries-delivered) {
		t.Errorf("stats seen %d, passed %d, limited %d; want %d, %d, %d",
			st.Seen, st.Passed, st.limited(), queries, delivered, queries-delivered)
	}

	// Detaching through the pin needs no more.
	child("detach")
	if id := attached(); id != 0 {
		t.Errorf("program %d still attached after the child detached it", id)
	}
	if _, err := os.Lstat(filepath.Join(pin, pinXDPLinkPrefix+veth.ReceiverDev)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the link's pin after the detach: %v", err)
	}
	state, err := ebpf.LoadPinnedMap(filepath.Join(pin, pinXDPState), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer state.Close()
	var n uint32
	if err := state.Lookup(uint32(0), &n); err != nil || n != 0 {
		t.Errorf("XDP destinations after the detach: %d (%v), want 0", n, err)
	}
}

// chownPins gives the pin directory pin and everything in it to uid (and the gid of
// the same number).
func chownPins(t *testing.T, pin string, uid int) {
	t.Helper()
	err := filepath.WalkDir(pin, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, uid)
	})
	if err != nil {
		t.Fatal(err)
	}
}
