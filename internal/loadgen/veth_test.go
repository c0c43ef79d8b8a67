package loadgen

import (
	"net/netip"
	"os"
	"testing"

	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
)

// requireRoot skips t without root, unless RRL_REQUIRE_BPF=1 asks for a failure.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		if err := rlimit.RemoveMemlock(); err != nil {
			t.Fatal(err)
		}
		return
	}
	if os.Getenv("RRL_REQUIRE_BPF") == "1" {
		t.Fatal("needs root (network namespaces, XDP)")
	}
	t.Skip("needs root (network namespaces, XDP)")
}

// The generator's frames cross the pair and reach the receiver's XDP program, one
// per repeat (none lost at this rate of 20,000, far below the ring's), with the
// sources it varies; the receiving NAPI thread runs them.
func TestVethFlood(t *testing.T) {
	requireRoot(t)
	v, err := NewVeth()
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	f, err := NewFlood()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var l link.Link
	err = v.Receiver.Do(func() (err error) {
		l, err = link.AttachXDP(link.XDPOptions{Program: f.DropProgram(), Interface: v.ReceiverIndex, Flags: link.XDPDriverMode})
		return err
	})
	if err != nil {
		t.Fatalf("attach the drop program to the receiver: %v", err)
	}
	defer l.Close()
	napi, err := v.ThreadedNAPI()
	if err != nil {
		t.Fatal(err)
	}
	if err := PinTask(napi, 1); err != nil {
		t.Fatal(err)
	}
	before, err := TaskRunTime(napi)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Vary(0xff, 0xff); err != nil {
		t.Fatal(err)
	}
	src := netip.AddrPortFrom(netip.MustParseAddr("198.19.1.0"), 40000)
	frame := v.Frame(Packet(src, netip.AddrPortFrom(v.Receiver4, 53), DNSQuery(1, false)))
	const n = 20000
	// Small batches, each drained before the next: a veth ring holds 256 frames.
	for i := 0; i < n/200; i++ {
		if err := f.Send(v, frame, 200, 0); err != nil {
			t.Fatal(err)
		}
	}
	after, err := TaskRunTime(napi)
	if err != nil {
		t.Fatal(err)
	}
	got, err := f.Counted()
	if err != nil {
		t.Fatal(err)
	}
	// gen_sent counts both the generator's frames and the receiver's drops.
	if got < n+n*9/10 || got > 2*n {
		t.Fatalf("generator and receiver counted %d, want %d sent and nearly as many dropped", got, n)
	}
	if after <= before {
		t.Fatalf("the NAPI thread did not run: %v then %v", before, after)
	}
	t.Logf("%d frames: receiver's NAPI thread ran %v, %.0f ns a frame", n, after-before, float64(after-before)/float64(got-n))
}
