package rrl

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

var netnsCounter atomic.Int64

// testNetns is a network namespace a test creates and removes, with only its own
// loopback interface up: whatever is sent inside it stays inside it.
type testNetns struct {
	name string
	fd   int
}

func newTestNetns(t *testing.T) *testNetns {
	t.Helper()
	if _, err := exec.LookPath("ip"); err != nil {
		t.Fatalf("iproute2 (ip) is needed for network namespace tests: %v", err)
	}
	name := fmt.Sprintf("rrltest-%d-%d", os.Getpid(), netnsCounter.Add(1))
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	if out, err := exec.Command("ip", "-n", name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("ip link set lo up: %v: %s", err, out)
	}
	fd, err := unix.Open("/var/run/netns/"+name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return &testNetns{name: name, fd: fd}
}

// do runs fn on an OS thread switched into the namespace: sockets created by fn
// belong to it and keep working from any thread afterwards.
func (n *testNetns) do(t *testing.T, fn func()) {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	self, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(self)
	if err := unix.Setns(n.fd, unix.CLONE_NEWNET); err != nil {
		t.Fatalf("setns: %v", err)
	}
	defer func() {
		if err := unix.Setns(self, unix.CLONE_NEWNET); err != nil {
			panic(fmt.Sprintf("cannot return to the original network namespace: %v", err))
		}
	}()
	fn()
}
