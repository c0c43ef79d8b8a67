//go:build linux

package rrl

// The kernel filter's copy of the server cookie secrets (rrl_cookie_secrets), kept in
// step with a Cookies and with the wall clock.
//
// The program judges a cookie's age against the wall clock, which it cannot read
// cheaply: it adds to its own clock (the coarse monotonic clock) an offset this side
// writes, CLOCK_REALTIME minus CLOCK_MONOTONIC_COARSE. Both clocks are slewed alike,
// so the offset moves only when the system clock is stepped (settimeofday, a leap
// second, a resume from suspend); a timerfd armed with TFD_TIMER_CANCEL_ON_SET wakes
// the writer on every step, and it rewrites the offset every hour besides. The
// program's wall clock is therefore within two clock ticks (a few milliseconds) of
// CLOCK_REALTIME, either way, except for the moment after a step until the process
// that called UseCookies rewrites the offset; a filter whose last such process has
// exited keeps the last offset, off by any later step. An error only moves the ends
// of the freshness window (a cookie an hour old, or five minutes ahead): a cookie
// judged stale is judged as no cookie, never dropped for it.

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// wallResync is how often the wall-clock offset is rewritten without a clock step.
const wallResync = time.Hour

// kernelCookies keeps a filter's secrets map in step with a Cookies and the wall
// clock.
type kernelCookies struct {
	c       *Cookies
	secrets *ebpf.Map
	clock   *os.File      // the timerfd that wakes on clock steps
	ended   chan struct{} // closed when the goroutine watching clock has returned

	mu     sync.Mutex
	closed bool
}

// setCookieKeys is called by Cookies, under its lock, when the keys change.
func (kc *kernelCookies) setCookieKeys(k *cookieKeys) {
	kc.mu.Lock()
	defer kc.mu.Unlock()
	if kc.closed {
		return
	}
	// A failed write (it needs only a valid descriptor and key, which it has)
	// would leave the previous secrets in the kernel: cookies made with the new
	// one would be judged as without a cookie, never dropped for it.
	_ = writeCookieSecrets(kc.secrets, k)
}

// rewrite writes the current keys and wall-clock offset again.
func (kc *kernelCookies) rewrite() {
	kc.c.sinksMu.Lock()
	defer kc.c.sinksMu.Unlock()
	kc.setCookieKeys(kc.c.keys.Load())
}

// stop detaches kc from its Cookies and returns once the clock watch has ended;
// nothing for a nil kc. The Filter's f.mu is held.
func (kc *kernelCookies) stop() {
	if kc == nil {
		return
	}
	kc.c.unsubscribe(kc)
	kc.mu.Lock()
	kc.closed = true
	kc.mu.Unlock()
	// Close wakes the goroutine's read; the goroutine takes no lock f.mu's holder
	// may hold (Cookies' and kc's only), so waiting for it cannot deadlock.
	kc.clock.Close()
	<-kc.ended
}

// testHookClockWoke, when set before UseCookies, is called by the clock watch after
// each wake-up, before it rewrites and re-arms: tests stop it there.
var testHookClockWoke func()

// openClock creates and arms the timerfd that wakes the clock watch.
func (kc *kernelCookies) openClock() error {
	fd, err := unix.TimerfdCreate(unix.CLOCK_REALTIME, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return fmt.Errorf("rrl: clock watch: %w", err)
	}
	if err := armClockWatch(fd); err != nil {
		unix.Close(fd)
		return err
	}
	kc.clock = os.NewFile(uintptr(fd), "rrl-clock-watch")
	return nil
}

// watchClock starts the goroutine that rewrites the wall-clock offset whenever the
// system clock is stepped, and every wallResync, until stop closes the clock.
// The goroutine reaches the timerfd only through kc.clock, which holds the
// descriptor open while it is used and refuses once closed: the bare number could
// by then name another file.
func (kc *kernelCookies) watchClock() {
	kc.ended = make(chan struct{})
	woke := testHookClockWoke
	go func() {
		defer close(kc.ended)
		rc, err := kc.clock.SyscallConn()
		if err != nil {
			return
		}
		var buf [8]byte
		for {
			_, err := kc.clock.Read(buf[:])
			if err != nil && !errors.Is(err, unix.ECANCELED) {
				return // closed by stop
			}
			if woke != nil {
				woke()
			}
			// The hour is up, or the clock was set: the offset may have moved.
			kc.rewrite()
			var armErr error
			if err := rc.Control(func(fd uintptr) { armErr = armClockWatch(int(fd)) }); err != nil || armErr != nil {
				return
			}
		}
	}()
}

// armClockWatch arms the timerfd to expire wallResync from now and to be cancelled
// (its read fails with ECANCELED) when CLOCK_REALTIME is set.
func armClockWatch(fd int) error {
	at := time.Now().Add(wallResync)
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(at.UnixNano())}
	if err := unix.TimerfdSettime(fd, unix.TFD_TIMER_ABSTIME|unix.TFD_TIMER_CANCEL_ON_SET, &spec, nil); err != nil {
		return fmt.Errorf("rrl: clock watch: %w", err)
	}
	return nil
}

// wallOffset is CLOCK_REALTIME minus the program's clock, in nanoseconds.
func wallOffset() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC_COARSE, &ts); err != nil {
		return 0
	}
	return time.Now().UnixNano() - ts.Nano()
}

// cookieSecretsValue is the rrl_cookie_secrets value for k (nil: no secrets) with
// the wall-clock offset.
func cookieSecretsValue(k *cookieKeys, offset int64) *filterCookieSecrets {
	v := &filterCookieSecrets{LayoutVersion: layoutVersion, WallOffsetNs: offset}
	if k == nil {
		return v
	}
	v.HasCurrent = 1
	v.Current.K0, v.Current.K1 = k.current.k0, k.current.k1
	if k.hasPrev {
		v.HasPrevious = 1
		v.Previous.K0, v.Previous.K1 = k.previous.k0, k.previous.k1
	}
	return v
}

func writeCookieSecrets(m *ebpf.Map, k *cookieKeys) error {
	return m.Put(uint32(0), cookieSecretsValue(k, wallOffset()))
}

// openCookieSecrets opens a pin directory's cookie secrets write-only, the only
// access its mode grants; without that access the filter works without UseCookies.
func openCookieSecrets(objs *kernelObjects, spec *ebpf.CollectionSpec, pinDir string) error {
	path := filepath.Join(pinDir, pinCookieSecrets)
	m, err := ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{WriteOnly: true})
	switch {
	case err != nil && (isPermission(err) || errors.Is(err, fs.ErrNotExist)):
		// Not ours to write, or pins of an older layout (which the layout
		// version check then refuses).
		return nil
	case err != nil:
		return openError(path, err)
	}
	if err := spec.Maps[pinCookieSecrets].Compatible(m); err != nil {
		m.Close()
		return fmt.Errorf("rrl: %s: %w: %w", path, ErrLayoutMismatch, err)
	}
	objs.CookieSecrets = m
	return nil
}
