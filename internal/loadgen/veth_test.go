package loadgen

import (
	"net/netip"
	"os"
	"testing"
	"time"

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
// per repeat (nearly none lost when each batch has time to drain), with the
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
	// Small batches, each given time to drain before the next: a veth ring holds
	// 256 frames, and the sender drops what does not fit.
	for i := 0; i < n/100; i++ {
		if err := f.Send(v, frame, 100, 0); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}
	after, err := TaskRunTime(napi)
	if err != nil {
		t.Fatal(err)
	}
	// Frames still in the ring or on the receiver's NAPI backlog when the generator
	// returns are counted a moment later: read until every frame is accounted for,
	// or for at most two seconds.
	var sent, got, lost uint64
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if sent, err = f.Sent(); err != nil {
			t.Fatal(err)
		}
		if got, err = f.Dropped(); err != nil {
			t.Fatal(err)
		}
		if lost, err = v.SenderTxDropped(); err != nil {
			t.Fatal(err)
		}
		if got+lost >= sent || time.Now().After(deadline) {
			break
		}
	}
	// The generator may run more than n frames (a signal restarts a run), and a
	// receiver delayed by other work on the machine lets the ring overflow now
	// and then (on a busy two-core machine more than half of them): every frame the
	// generator sent was either dropped by the receiver's program or dropped by the
	// sender for want of room, and the receiver's program saw some. How many arrive
	// is the benchmarks' measure, not this test's.
	if sent < n || got+lost != sent || got == 0 {
		t.Fatalf("generator sent %d, receiver dropped %d, sender lost %d; want %d or more sent, all accounted for, some arriving", sent, got, lost, n)
	}
	if after <= before {
		t.Fatalf("the NAPI thread did not run: %v then %v", before, after)
	}
	t.Logf("%d frames: receiver's NAPI thread ran %v, %.0f ns a frame", n, after-before, float64(after-before)/float64(got))
}
