//go:build linux

package rrl

import (
	"errors"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// tfdIOCSetTicks is TFD_IOC_SET_TICKS, _IOW('T', 0, __u64): it sets a timerfd's
// expiry count and wakes its readers, as an expiry or a clock step would.
const tfdIOCSetTicks = 0x40085400

// TestClockWatchNeverTouchesClosedTimer: the clock watch, woken just before
// UseCookies(nil) closes its timerfd, does not re-arm the descriptor number once it
// names another file (here another timerfd, which would come out armed), and has
// returned by the time UseCookies(nil) does.
func TestClockWatchNeverTouchesClosedTimer(t *testing.T) {
	requireBPF(t)
	server := listenUDPAt(t, "udp4", "127.0.0.1:0")
	f, err := Attach(server, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	woke, release := make(chan struct{}, 1), make(chan struct{})
	testHookClockWoke = func() {
		woke <- struct{}{}
		<-release
	}
	err = f.UseCookies(NewCookies(testSecretA))
	testHookClockWoke = nil
	if err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	kc := f.cookies
	f.mu.Unlock()
	rc, err := kc.clock.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	n := -1
	if err := rc.Control(func(fd uintptr) {
		n = int(fd)
		ticks := uint64(1)
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, fd, tfdIOCSetTicks, uintptr(unsafe.Pointer(&ticks))); e != 0 {
			t.Fatalf("TFD_IOC_SET_TICKS: %v", e)
		}
	}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-woke:
	case <-time.After(5 * time.Second):
		t.Fatal("the clock watch did not wake")
	}

	// The watch now sits between its read and its re-arm. Stop it, and wait for
	// the descriptor to be closed.
	stopped := make(chan error, 1)
	go func() { stopped <- f.UseCookies(nil) }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := unix.FcntlInt(uintptr(n), unix.F_GETFD, 0); errors.Is(err, unix.EBADF) {
			break
		}
		if time.Now().After(deadline) {
			close(release)
			t.Fatalf("descriptor %d still open after UseCookies(nil)", n)
		}
		time.Sleep(time.Millisecond)
	}
	// Take the number for a timerfd of our own: new descriptors get the lowest
	// free number.
	var extra []int
	other := -1
	for range 64 {
		fd, err := unix.TimerfdCreate(unix.CLOCK_REALTIME, unix.TFD_CLOEXEC)
		if err != nil {
			t.Fatal(err)
		}
		if fd == n {
			other = fd
			break
		}
		extra = append(extra, fd)
		if fd > n {
			break // someone else took n
		}
	}
	for _, fd := range extra {
		unix.Close(fd)
	}
	if other < 0 {
		close(release)
		t.Fatalf("could not reuse descriptor %d", n)
	}
	defer unix.Close(other)
	close(release)

	select {
	case err := <-stopped:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("UseCookies(nil) did not return")
	}
	select {
	case <-kc.ended:
	default:
		t.Error("UseCookies(nil) returned before the clock watch ended")
	}
	var spec unix.ItimerSpec
	if err := unix.TimerfdGettime(other, &spec); err != nil {
		t.Fatal(err)
	}
	if spec.Value.Nano() != 0 {
		t.Errorf("descriptor %d, another timerfd now, was armed by the closed clock watch: %+v", n, spec)
	}
}

// TestUseCookiesFailedWriteKeepsOld: when UseCookies cannot write the new secrets,
// the filter keeps the Cookies it had, which still reaches it, and the new one
// does not.
func TestUseCookiesFailedWriteKeepsOld(t *testing.T) {
	requireBPF(t)
	server := listenUDPAt(t, "udp4", "127.0.0.1:0")
	f, err := Attach(server, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p := newCookieProbe(t, f, server, "udp4", "127.0.0.1")
	client := []byte("keepold!")
	old := NewCookies(testSecretA)
	if err := f.UseCookies(old); err != nil {
		t.Fatal(err)
	}
	p.expect("before", old.Generate(client, p.addr(), time.Now()), verdictProven)

	// A map whose values are the wrong size refuses every write of the secrets.
	bad, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	secrets := []CookieSecret{testSecretB, {9, 9, 9}}
	for i, c := range []*Cookies{NewCookies(testSecretC), nil} {
		f.mu.Lock()
		good := f.objs.CookieSecrets
		f.objs.CookieSecrets = bad
		f.mu.Unlock()
		err := f.UseCookies(c)
		f.mu.Lock()
		f.objs.CookieSecrets = good
		f.mu.Unlock()
		if err == nil {
			t.Fatalf("UseCookies(%v) with a failing write: no error", c)
		}
		if c != nil {
			c.sinksMu.Lock()
			sinks := len(c.sinks)
			c.sinksMu.Unlock()
			if sinks != 0 {
				t.Errorf("failed UseCookies left the new Cookies with %d sinks", sinks)
			}
			p.expect("the new secret after a failed UseCookies", c.Generate(client, p.addr(), time.Now()), verdictInvalid)
		}
		// The old Cookies still reaches the filter.
		old.Rotate(secrets[i])
		p.expect("a Rotate of the old Cookies after a failed UseCookies", NewCookies(secrets[i]).Generate(client, p.addr(), time.Now()), verdictProven)
	}
}
