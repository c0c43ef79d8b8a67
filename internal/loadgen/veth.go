package loadgen

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Veth is two network namespaces of their own joined by a veth pair: a sender and a
// receiver, each end up and addressed from the benchmarking range (198.18.0.0/15) and
// a unique local IPv6 prefix, so that nothing sent on it can reach another network.
// Reverse-path filtering is off on the receiver, so that it accepts spoofed sources
// from anywhere; the sender treats 198.19.0.0/16 and fd00:c613::/32 as its own (local
// routes), so that it receives what the receiver sends back to sources spoofed there.
type Veth struct {
	Sender, Receiver       *Netns
	SenderDev, ReceiverDev string
	SenderIndex            int
	ReceiverIndex          int
	SenderMAC, ReceiverMAC net.HardwareAddr
	Sender4, Receiver4     netip.Addr
	Sender6, Receiver6     netip.Addr
}

// The addresses of a Veth, and the prefixes spoofed sources come from.
var (
	vethSender4   = netip.MustParseAddr("198.18.0.1")
	vethReceiver4 = netip.MustParseAddr("198.18.0.2")
	vethSender6   = netip.MustParseAddr("fd00:c612::1")
	vethReceiver6 = netip.MustParseAddr("fd00:c612::2")
	// SpoofPrefix4 and SpoofPrefix6 hold the sources a test may spoof on a Veth.
	SpoofPrefix4 = netip.MustParsePrefix("198.19.0.0/16")
	SpoofPrefix6 = netip.MustParsePrefix("fd00:c613::/32")
)

// NewVeth makes the namespaces and the pair. The device names are short and random
// ("s" and "r" and 5 hex digits), so that a receiving NAPI thread's name,
// "napi/<dev>-<id>", fits a kernel task name and names one test's device.
func NewVeth() (v *Veth, err error) {
	var rnd [3]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, err
	}
	tag := hex.EncodeToString(rnd[:])[:5]
	v = &Veth{SenderDev: "s" + tag, ReceiverDev: "r" + tag,
		Sender4: vethSender4, Receiver4: vethReceiver4, Sender6: vethSender6, Receiver6: vethReceiver6}
	if v.Sender, err = NewNetns("rrlsnd"); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			v.Close()
		}
	}()
	if v.Receiver, err = NewNetns("rrlrcv"); err != nil {
		return nil, err
	}
	steps := [][]string{
		{"link", "add", v.SenderDev, "netns", v.Sender.Name, "type", "veth", "peer", "name", v.ReceiverDev, "netns", v.Receiver.Name},
		{"-n", v.Sender.Name, "addr", "add", vethSender4.String() + "/24", "dev", v.SenderDev},
		{"-n", v.Receiver.Name, "addr", "add", vethReceiver4.String() + "/24", "dev", v.ReceiverDev},
		{"-n", v.Sender.Name, "addr", "add", vethSender6.String() + "/64", "dev", v.SenderDev, "nodad"},
		{"-n", v.Receiver.Name, "addr", "add", vethReceiver6.String() + "/64", "dev", v.ReceiverDev, "nodad"},
		{"-n", v.Sender.Name, "link", "set", v.SenderDev, "up"},
		{"-n", v.Receiver.Name, "link", "set", v.ReceiverDev, "up"},
		{"-n", v.Sender.Name, "route", "add", "local", SpoofPrefix4.String(), "dev", "lo"},
		{"-n", v.Sender.Name, "-6", "route", "add", "local", SpoofPrefix6.String(), "dev", "lo"},
		// Replies to spoofed sources go back over the pair.
		{"-n", v.Receiver.Name, "route", "add", SpoofPrefix4.String(), "via", vethSender4.String()},
		{"-n", v.Receiver.Name, "-6", "route", "add", SpoofPrefix6.String(), "via", vethSender6.String()},
	}
	for _, s := range steps {
		if out, err := exec.Command("ip", s...).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("ip %s: %v: %s", strings.Join(s, " "), err, out)
		}
	}
	err = v.Receiver.Do(func() error {
		for _, k := range []string{"all", "default", v.ReceiverDev} {
			if err := os.WriteFile("/proc/sys/net/ipv4/conf/"+k+"/rp_filter", []byte("0"), 0); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("rp_filter: %w", err)
	}
	if err := v.Sender.Do(v.lookup(v.SenderDev, &v.SenderIndex, &v.SenderMAC)); err != nil {
		return nil, err
	}
	if err := v.Receiver.Do(v.lookup(v.ReceiverDev, &v.ReceiverIndex, &v.ReceiverMAC)); err != nil {
		return nil, err
	}
	// Permanent neighbours both ways: no packet of a test waits for (or is
	// dropped while waiting for) address resolution.
	for _, n := range [][]string{
		{"-n", v.Sender.Name, "neigh", "add", vethReceiver4.String(), "lladdr", v.ReceiverMAC.String(), "dev", v.SenderDev, "nud", "permanent"},
		{"-n", v.Sender.Name, "neigh", "add", vethReceiver6.String(), "lladdr", v.ReceiverMAC.String(), "dev", v.SenderDev, "nud", "permanent"},
		{"-n", v.Receiver.Name, "neigh", "add", vethSender4.String(), "lladdr", v.SenderMAC.String(), "dev", v.ReceiverDev, "nud", "permanent"},
		{"-n", v.Receiver.Name, "neigh", "add", vethSender6.String(), "lladdr", v.SenderMAC.String(), "dev", v.ReceiverDev, "nud", "permanent"},
	} {
		if out, err := exec.Command("ip", n...).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("ip %s: %v: %s", strings.Join(n, " "), err, out)
		}
	}
	return v, nil
}

// lookup returns a function that finds dev's index and address in the calling
// thread's namespace.
func (v *Veth) lookup(dev string, index *int, mac *net.HardwareAddr) func() error {
	return func() error {
		ifc, err := net.InterfaceByName(dev)
		if err != nil {
			return err
		}
		*index, *mac = ifc.Index, ifc.HardwareAddr
		return nil
	}
}

// Close removes both namespaces, and with them the pair.
func (v *Veth) Close() error {
	var first error
	for _, n := range []*Netns{v.Sender, v.Receiver} {
		if n != nil {
			if err := n.Close(); err != nil && first == nil {
				first = err
			}
		}
	}
	return first
}

// ThreadedNAPI switches the receiving end's NAPI to a kernel thread of its own and
// returns the thread's process ID, so that the receiving side's work can be pinned
// to a CPU and measured apart from the sender's. A veth has NAPI only while an XDP
// program is attached to it (or GRO is on): attach first; a detach removes the
// thread, and the next attach needs this call again.
func (v *Veth) ThreadedNAPI() (int, error) {
	// /sys/class/net shows the namespace of sysfs's mount: ip netns exec mounts the
	// receiver's.
	path := filepath.Join("/sys/class/net", v.ReceiverDev, "threaded")
	if out, err := exec.Command("ip", "netns", "exec", v.Receiver.Name, "sh", "-c", "echo 1 > "+path).CombinedOutput(); err != nil {
		return 0, fmt.Errorf("threaded NAPI on %s (needs NAPI: an XDP program attached): %v: %s", v.ReceiverDev, err, out)
	}
	prefix := "napi/" + v.ReceiverDev + "-"
	deadline := time.Now().Add(2 * time.Second)
	for {
		pids, err := tasksNamed(prefix)
		if err != nil {
			return 0, err
		}
		switch {
		case len(pids) == 1:
			return pids[0], nil
		case len(pids) > 1:
			return 0, fmt.Errorf("%d threads named %s*: want one receive queue", len(pids), prefix)
		case time.Now().After(deadline):
			return 0, fmt.Errorf("no thread named %s* after enabling threaded NAPI", prefix)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// tasksNamed lists the processes whose name starts with prefix.
func tasksNamed(prefix string) ([]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if err == nil && strings.HasPrefix(strings.TrimSpace(string(comm)), prefix) {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// PinTask restricts a task (0: the calling thread) to one CPU.
func PinTask(pid, cpu int) error {
	var set unix.CPUSet
	set.Set(cpu)
	if err := unix.SchedSetaffinity(pid, &set); err != nil {
		return fmt.Errorf("pin task %d to CPU %d: %w", pid, cpu, err)
	}
	return nil
}

// TaskRunTime returns the time a task has run on a CPU, from the scheduler's own
// accounting (/proc/PID/schedstat, nanoseconds), softirq work done in its context
// included.
func TaskRunTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) < 1 {
		return 0, fmt.Errorf("/proc/%d/schedstat: %q", pid, b)
	}
	ns, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("/proc/%d/schedstat: %w", pid, err)
	}
	return time.Duration(ns), nil
}

// SenderTxDropped returns the frames the sender's end dropped on transmit: what
// did not fit the receiver's ring (from /proc/net/dev of the sender's namespace).
func (v *Veth) SenderTxDropped() (uint64, error) {
	var dropped uint64
	err := v.Sender.Do(func() error {
		b, err := os.ReadFile("/proc/thread-self/net/dev")
		if err != nil {
			return err
		}
		for _, line := range strings.Split(string(b), "\n") {
			name, rest, ok := strings.Cut(line, ":")
			if !ok || strings.TrimSpace(name) != v.SenderDev {
				continue
			}
			f := strings.Fields(rest)
			if len(f) < 12 {
				break
			}
			dropped, err = strconv.ParseUint(f[11], 10, 64)
			return err
		}
		return fmt.Errorf("/proc/net/dev: no %s", v.SenderDev)
	})
	return dropped, err
}
