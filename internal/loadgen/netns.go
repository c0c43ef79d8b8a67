package loadgen

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

var netnsCounter atomic.Int64

// Netns is a network namespace made for one test or benchmark run, with only its
// loopback interface up: whatever is sent inside it stays inside it.
type Netns struct {
	Name string
	fd   int
}

// NewNetns creates a namespace with iproute2 and brings its loopback up.
func NewNetns(prefix string) (*Netns, error) {
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, fmt.Errorf("iproute2 (ip) is needed for network namespaces: %w", err)
	}
	name := fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), netnsCounter.Add(1))
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("ip netns add: %v: %s", err, out)
	}
	n := &Netns{Name: name, fd: -1}
	if out, err := exec.Command("ip", "-n", name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		n.Close()
		return nil, fmt.Errorf("ip link set lo up: %v: %s", err, out)
	}
	fd, err := unix.Open("/var/run/netns/"+name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		n.Close()
		return nil, err
	}
	n.fd = fd
	return n, nil
}

// Do runs fn on an OS thread switched into the namespace: sockets fn creates belong
// to it and keep working from any thread afterwards.
func (n *Netns) Do(fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	self, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(self)
	if err := unix.Setns(n.fd, unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("setns: %w", err)
	}
	defer func() {
		if err := unix.Setns(self, unix.CLONE_NEWNET); err != nil {
			panic(fmt.Sprintf("cannot return to the original network namespace: %v", err))
		}
	}()
	return fn()
}

// AddAddress assigns addr to the namespace's loopback, so that ordinary sockets in
// it can bind to addr as a source.
func (n *Netns) AddAddress(addr netip.Addr) error {
	p := netip.PrefixFrom(addr, addr.BitLen())
	if out, err := exec.Command("ip", "-n", n.Name, "addr", "add", p.String(), "dev", "lo").CombinedOutput(); err != nil {
		return fmt.Errorf("ip addr add %s: %v: %s", p, err, out)
	}
	return nil
}

// Close deletes the namespace.
func (n *Netns) Close() error {
	if n.fd >= 0 {
		unix.Close(n.fd)
		n.fd = -1
	}
	if out, err := exec.Command("ip", "netns", "del", n.Name).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns del: %v: %s", err, out)
	}
	return nil
}
