package loadgen

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// bpfFTestXDPLiveFrames is BPF_F_TEST_XDP_LIVE_FRAMES: a test run's XDP_TX really
// sends the frame (Linux 5.18).
const bpfFTestXDPLiveFrames = 1 << 1

// xdpMD is struct xdp_md, the context a test run of an XDP program is given.
type xdpMD struct {
	Data, DataEnd, DataMeta, IngressIfindex, RxQueueIndex, EgressIfindex uint32
}

// Flood is the in-kernel flood generator (xdpgen_bpf.c) and the XDP programs the
// benchmarks compare with: a trivial drop of UDP to port 53 and a pass.
type Flood struct {
	objs xdpgenObjects
}

// NewFlood loads the generator's programs (CAP_BPF).
func NewFlood() (*Flood, error) {
	var f Flood
	if err := loadXdpgenObjects(&f.objs, nil); err != nil {
		return nil, fmt.Errorf("load flood generator: %w", err)
	}
	return &f, nil
}

// Close unloads the programs.
func (f *Flood) Close() error { return f.objs.Close() }

// DropProgram is an XDP program that drops UDP to port 53 and counts it (Dropped),
// passing everything else: the floor of what discarding a packet costs.
func (f *Flood) DropProgram() *ebpf.Program { return f.objs.XdpDrop53 }

// WorkDropProgram is DropProgram spending the rounds SetWork sets on arithmetic in
// registers for each packet it drops (counted in Dropped): a program as slow as
// another without its memory traffic.
func (f *Flood) WorkDropProgram() *ebpf.Program { return f.objs.XdpDrop53Work }

// SetWork sets WorkDropProgram's rounds per packet (at most 4096).
func (f *Flood) SetWork(rounds uint32) error { return f.objs.WorkRounds.Put(uint32(0), rounds) }

// PassProgram is an XDP program that passes every packet.
func (f *Flood) PassProgram() *ebpf.Program { return f.objs.XdpPass }

// Vary makes the frames sent differ in the source address bits under addrMask (of
// its last 32 bits) and the source port bits under portMask.
func (f *Flood) Vary(addrMask uint32, portMask uint16) error {
	return f.objs.GenSettings.Put(uint32(0), xdpgenGenConfig{AddrMask: addrMask, PortMask: portMask})
}

// Sent returns the frames the generator handled, summed over CPUs.
func (f *Flood) Sent() (uint64, error) { return sumPerCPU(f.objs.GenSent) }

// Dropped returns the packets DropProgram dropped, summed over CPUs.
func (f *Flood) Dropped() (uint64, error) { return sumPerCPU(f.objs.DropCount) }

func sumPerCPU(m *ebpf.Map) (uint64, error) {
	var per []uint64
	if err := m.Lookup(uint32(0), &per); err != nil {
		return 0, err
	}
	var sum uint64
	for _, v := range per {
		sum += v
	}
	return sum, nil
}

// Frame puts an IP packet built by Packet into an Ethernet frame from the sender's
// end of v to the receiver's.
func (v *Veth) Frame(pkt []byte) []byte {
	f := make([]byte, 14, 14+len(pkt))
	copy(f[0:6], v.ReceiverMAC)
	copy(f[6:12], v.SenderMAC)
	etherType := uint16(0x0800)
	if len(pkt) > 0 && pkt[0]>>4 == 6 {
		etherType = 0x86dd
	}
	binary.BigEndian.PutUint16(f[12:], etherType)
	return append(f, pkt...)
}

// Send sends frame n times out of the sender's end of v from the kernel, on CPU cpu
// (the calling goroutine's thread is pinned there for the run). The receiver gets
// the frames as fast as it takes them: what its queue cannot hold is dropped at the
// sender.
func (f *Flood) Send(v *Veth, frame []byte, n uint32, cpu int) error {
	return f.SendPaced(v, frame, n, n, 0, cpu)
}

// SendPaced is Send in batches of batch frames with a pause after each, so that
// a receiver that takes them more slowly than the generator makes them is not
// flooded past its queue: frames the sender cannot queue are freed on the
// generator's CPU into the page pool the receiver returns frames to, and the two
// CPUs then contend for its lock, a cost of the harness that would be charged to
// the receiver.
func (f *Flood) SendPaced(v *Veth, frame []byte, n, batch uint32, pause time.Duration, cpu int) error {
	return v.Sender.Do(func() error {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := PinTask(0, cpu); err != nil {
			return err
		}
		defer unpin()
		for sent := uint32(0); sent < n; sent += batch {
			_, err := f.objs.XdpFlood.Run(&ebpf.RunOptions{
				Data:    frame,
				Repeat:  min(batch, n-sent),
				Flags:   bpfFTestXDPLiveFrames,
				Context: xdpMD{DataEnd: uint32(len(frame)), IngressIfindex: uint32(v.SenderIndex)},
			})
			if err != nil {
				return fmt.Errorf("flood: test run with live frames (Linux 5.18): %w", err)
			}
			if pause > 0 {
				time.Sleep(pause)
			}
		}
		return nil
	})
}

// unpin lets the calling thread run on every CPU again.
func unpin() {
	var set unix.CPUSet
	for c := 0; c < runtime.NumCPU(); c++ {
		set.Set(c)
	}
	_ = unix.SchedSetaffinity(0, &set)
}
