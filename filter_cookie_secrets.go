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
	"encoding/binary"
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
	// mark, for a pinned filter, records which secrets the kernel holds after each
	// write (pinState.markCookies); nil otherwise.
	mark  func(*cookieKeys)
	clock *os.File      // the timerfd that wakes on clock steps
	ended chan struct{} // closed when the goroutine watching clock has returned

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
	if writeCookieSecrets(kc.secrets, k) == nil && kc.mark != nil {
		kc.mark(k)
	}
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

// A Config's cookie-secret reaches the kernel filter without a Cookies: Attach and
// LoadPinned write it, and Filter.Update with one writes it, keeping the secret it
// replaces accepted (as Cookies.Rotate does) unless the Config names both. A
// Protection, whose Cookies hold the secrets and follow them into the filter
// (UseCookies), gives the filter its Config without them (withoutSecrets).
//
// rrl_cookie_secrets is write-only to all but root, so what a pinned filter holds is
// also told, without the secrets, by two flags in the header of rrl_config, written
// with every change of the secrets (and carried over by every other write of the
// settings): Stats reports them as FilterStats.CookieSecrets, for any process that
// may read the pins.

const (
	configCookieCurrent  = 2 // rrl_cookie_secrets holds a secret
	configCookiePrevious = 4 // and a previous one, accepted too
	configCookieBits     = configCookieCurrent | configCookiePrevious
)

// cookieFlags are the rrl_config flags for k (nil: no secrets).
func cookieFlags(k *cookieKeys) uint32 {
	switch {
	case k == nil:
		return 0
	case k.hasPrev:
		return configCookieCurrent | configCookiePrevious
	}
	return configCookieCurrent
}

// secretCount is the number of secrets the flags say the kernel holds.
func secretCount(flags uint32) int {
	switch {
	case flags&configCookieCurrent == 0:
		return 0
	case flags&configCookiePrevious != 0:
		return 2
	}
	return 1
}

// keysOf returns the keys of a Config's secrets.
func keysOf(cs *configSecrets) *cookieKeys {
	k := &cookieKeys{current: newSipKey(cs.current)}
	if cs.previous != nil {
		k.previous, k.hasPrev = newSipKey(*cs.previous), true
	}
	return k
}

// updateSecrets returns the keys Update writes for cs, a Config's secrets: both of
// them when it names two; else its one, with the secret in force before it accepted
// too, unless that is the same one (so giving the current secret alone again stops
// accepting the previous one). f.mu is held.
func (f *Filter) updateSecrets(cs *configSecrets) (*cookieKeys, error) {
	if f.cookies != nil {
		return nil, fmt.Errorf("rrl: cookie-secret: %w: the filter verifies the secrets of a Cookies (UseCookies): change them there (Cookies.Rotate)", ErrNotSupported)
	}
	if f.objs.CookieSecrets == nil {
		return nil, fmt.Errorf("rrl: cookie-secret: %w: %s is not writable for uid %d", ErrNotPermitted, filepath.Join(f.pin.dir, pinCookieSecrets), os.Geteuid())
	}
	k := keysOf(cs)
	if cs.previous != nil {
		return k, nil
	}
	old, err := f.secretsInForce()
	if err != nil {
		return nil, err
	}
	if old != nil && old.current != k.current {
		k.previous, k.hasPrev = old.current, true
	}
	return k, nil
}

// secretsInForce reads the secrets the kernel holds (nil: none). A pinned filter's
// can be read only by root; when a secret is in force there and this process may
// not read it, the error says to name it. f.mu is held.
func (f *Filter) secretsInForce() (*cookieKeys, error) {
	m := f.objs.CookieSecrets
	if f.pin != nil {
		if _, _, err := f.pin.readConfig(f.objs); err == nil && f.pin.flags&configCookieCurrent == 0 {
			return nil, nil // none to keep
		}
		path := filepath.Join(f.pin.dir, pinCookieSecrets)
		rm, err := ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			if isPermission(err) {
				return nil, fmt.Errorf("rrl: cookie-secret: %w: keeping the secret in force accepted means reading %s, which only root may (uid %d): give the new secret and the one in force, cookie-secret \"NEW CURRENT\"",
					ErrNotPermitted, path, os.Geteuid())
			}
			return nil, openError(path, err)
		}
		defer rm.Close()
		m = rm
	}
	if m == nil {
		return nil, nil // objects loaded without the secrets map (tests' programs) hold none
	}
	var v filterCookieSecrets
	if err := m.Lookup(uint32(0), &v); err != nil {
		return nil, fmt.Errorf("rrl: read cookie secrets: %w", err)
	}
	if v.HasCurrent == 0 {
		return nil, nil
	}
	k := &cookieKeys{current: sipKey{v.Current.K0, v.Current.K1}}
	if v.HasPrevious != 0 {
		k.previous, k.hasPrev = sipKey{v.Previous.K0, v.Previous.K1}, true
	}
	return k, nil
}

// markCookies records in the header of the rrl_config slot in force that the kernel
// holds the secrets k (nil: none), for the Stats of every process; the Config text is
// left as it is. A flip of the settings meanwhile makes it look again. Nothing
// happens when the pins are read-only here.
func (p *pinState) markCookies(objs *kernelObjects, k *cookieKeys) {
	if p.readOnly != "" {
		return
	}
	applyMu.Lock()
	defer applyMu.Unlock()
	want := cookieFlags(k)
	v := make([]byte, configValueSize)
	for range 10 {
		h, err := objs.settingsMaps().header()
		if err != nil {
			return
		}
		slot := uint32(h.Slot & 1)
		if err := p.config.Lookup(slot, &v); err != nil || binary.LittleEndian.Uint32(v[0:]) != configMagic {
			return
		}
		flags := binary.LittleEndian.Uint32(v[4:])
		if flags&configCookieBits == want {
			return
		}
		binary.LittleEndian.PutUint32(v[4:], flags&^configCookieBits|want)
		if err := p.config.Put(slot, v); err != nil {
			return
		}
		if now, err := objs.settingsMaps().header(); err == nil && now.Generation == h.Generation {
			return
		}
	}
}
