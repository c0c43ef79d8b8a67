//go:build linux

package rrl

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/dnsrake/rrl/internal/sockopt"
	"golang.org/x/sys/unix"
)

// Attach protects conn, a UDP socket (*net.UDPConn, or anything with SyscallConn),
// with the eBPF filter configured by cfg (nil means NewConfig()).
//
// Whenever the eBPF filter cannot be put on the socket, Attach keeps the classic-BPF
// prefilter there instead and returns the Filter in ModeClassic together with an
// error that says why, for which errors.Is holds with one of:
//
//   - ErrNotPermitted: no CAP_BPF. The message says how to get the eBPF
//     filter: grant it (setcap cap_bpf+ep), attach before dropping
//     privileges (the attached filter keeps working), or attach objects a privileged
//     step pinned (AttachPinned).
//   - ErrOptMem: the socket's option memory (net.core.optmem_max) cannot hold the
//     program; the message names the setting.
//   - ErrNotSupported: the kernel is too old or lacks a helper the program calls.
//   - ErrLoadFailed: any other failure to load or attach the program.
//
// A caller that only logs such an error keeps the stateless protection, but the
// request limits then have to be enforced in Go: make a Limiter from the same Config
// and discard every packet for which Limiter.Allow(source) is false, right after
// reading it (Protect does all of this).
//
// The names judge of the capacity mode (docs/names.md) knows only the names the
// server answered as existing: a server serving with NewHandler gives the Handler
// the Filter (WithFilter) so that its answers teach it. Limiter.Allow judges no
// names (it has the source alone): in the classic mode only a Protection, which
// reads the packet, judges names in Go.
//
// Attach returns a nil Filter only when conn is not an open UDP socket (nil, closed,
// TCP, ...: the error says which) or even the classic prefilter could not be
// attached; every method of a nil Filter is safe and does nothing, so `defer
// f.Close()` right after Attach is always safe.
//
// In report-only mode the filter counts what it would drop (FilterStats.ReportOnly
// and the per-reason counters) and passes everything.
//
// A cookie-secret in cfg is written into the eBPF filter, which then passes queries
// with a valid server cookie made with it as UseCookies describes; Config never
// returns it.
func Attach(conn syscall.Conn, cfg *Config) (*Filter, error) {
	if cfg == nil {
		cfg = NewConfig()
	}
	if err := checkUDP(conn); err != nil {
		return nil, fmt.Errorf("rrl: attach filter: %w", err)
	}
	id, err := identify(conn)
	if err != nil {
		return nil, fmt.Errorf("rrl: attach filter: %w", err)
	}
	// The filter keeps no secret in its Config: Config never returns one.
	f := &Filter{cfg: cfg.withoutSecrets().clone()}
	loadErr := f.loadAndAttach(conn, id, cfg.secrets)
	if loadErr == nil {
		f.mu.Lock()
		f.capacityUpdated() // capacity_linux.go
		f.namesUpdated()    // filter_names.go
		f.mu.Unlock()
		return f, nil
	}
	// Keep the stateless protection, which needs no privilege and a few hundred
	// bytes of option memory.
	if cerr := applyClassic(conn, f.cfg); cerr != nil {
		return nil, errors.Join(loadErr, fmt.Errorf("classic fallback: %w", cerr))
	}
	f.mode = ModeClassic
	f.own(conn, id)
	return f, loadErr
}

// loadAndAttach loads the eBPF filter and attaches it to conn, leaving f in ModeEBPF,
// or returns why not with everything it made released. The error matches
// ErrNotPermitted, ErrNotSupported, ErrOptMem or ErrLoadFailed.
func (f *Filter) loadAndAttach(conn syscall.Conn, id socketID, cs *configSecrets) error {
	objs, err := loadKernel()
	if err == nil {
		f.objs = objs
		if f.seed, err = randomSeed(); err == nil {
			var secrets *cookieKeys
			if cs != nil {
				secrets = keysOf(cs)
			}
			err = f.writeSettingsSecrets(f.cfg, secrets)
		}
		if err == nil {
			err = f.attachEBPF(conn, id)
		}
		if err != nil {
			objs.Close()
			f.objs = nil
		}
	}
	if err == nil {
		f.mode = ModeEBPF
		return nil
	}
	for _, known := range []error{ErrNotPermitted, ErrNotSupported, ErrOptMem, ErrLoadFailed} {
		if errors.Is(err, known) {
			return err
		}
	}
	// The errors of the steps above name their step already.
	return &sysError{sentinel: ErrLoadFailed, err: err}
}

func (f *Filter) attachEBPF(conn syscall.Conn, id socketID) error {
	fd := f.objs.Program.FD()
	err := sockopt.Control(conn, func(s int) error {
		if err := checkUDPSocket(s); err != nil {
			return err
		}
		return unix.SetsockoptInt(s, unix.SOL_SOCKET, unix.SO_ATTACH_BPF, fd)
	})
	if err != nil {
		return sockoptError("rrl: attach filter", err)
	}
	f.own(conn, id)
	return nil
}

// Attach adds another socket, typically one more of a SO_REUSEPORT group, to f: it
// shares f's limits and sketches. For a socket f is on already, Attach puts the
// filter on it again and makes conn the descriptor f reaches it through.
func (f *Filter) Attach(conn syscall.Conn) error {
	if f == nil {
		return ErrClosed
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.mode == ModeNone || f.closing {
		return ErrClosed
	}
	if err := checkUDP(conn); err != nil {
		return fmt.Errorf("rrl: attach filter: %w", err)
	}
	id, err := identify(conn)
	if err != nil {
		return fmt.Errorf("rrl: attach filter: %w", err)
	}
	if f.mode == ModeEBPF {
		return f.attachEBPF(conn, id)
	}
	if err := applyClassic(conn, f.cfg); err != nil {
		return err
	}
	f.own(conn, id)
	return nil
}

// Update applies cfg to the running filter without losing its sketches: limits,
// levels, report-only, exempt-clients and reflection ports change at once for every
// attached socket. For the eBPF filter it is all or nothing: cfg is checked before
// anything is written, and on any error the filter keeps running its previous
// configuration, which Config still returns; every packet is judged either wholly
// by the previous configuration or wholly by cfg. Updates of one Filter, and of
// Filters in one process, are serialised; Updates of the same pins from two
// processes are not, and must not overlap: the later one then fails, and the
// configuration in force may hold parts of both until the next Update.
//
// The eBPF filter's settings are maps, which reach every socket the program is on.
// In classic mode each socket holds a program of its own: Update puts the new one on
// every socket f is on, through any descriptor of it open in this process (as Close
// does), all or nothing again, and the error names a socket it could not reach.
//
// A cookie-secret in cfg replaces the eBPF filter's server cookie secrets (a pinned
// filter's for every process), written last before the new configuration takes
// effect; without one they stay. Naming one secret keeps the secret it replaces
// accepted, as Cookies.Rotate does (naming the one in force alone stops accepting
// the previous one); naming two sets both. Keeping the one in force means reading
// it, which a pinned filter's pins allow root alone: others name both, or get an
// error matching ErrNotPermitted. A filter that follows a Cookies (UseCookies) takes
// its secrets from it, and a cookie-secret is refused (ErrNotSupported). The
// classic prefilter verifies no cookies and ignores it.
func (f *Filter) Update(cfg *Config) error {
	if f == nil {
		return ErrClosed
	}
	if cfg == nil {
		cfg = NewConfig()
	}
	cfg = cfg.clone()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closing {
		return ErrClosed // Close has begun
	}
	switch f.mode {
	case ModeEBPF:
		var secrets *cookieKeys
		if cfg.secrets != nil {
			var err error
			if secrets, err = f.updateSecrets(cfg.secrets); err != nil {
				return err
			}
		}
		if err := f.writeSettingsSecrets(cfg, secrets); err != nil {
			return err
		}
	case ModeClassic:
		if err := f.updateClassic(cfg); err != nil {
			return err
		}
	default:
		return ErrClosed
	}
	f.cfg = cfg.withoutSecrets()
	f.capacityUpdated() // capacity_linux.go
	f.namesUpdated()    // filter_names.go
	return nil
}

// updateClassic puts the classic prefilter for cfg on every socket f owns, all or
// nothing: the program is built before any socket is touched, and a socket that
// refuses it, or cannot be reached, puts the sockets already changed back to f.cfg's
// program. A socket is reached through any descriptor of it still open (reach); one
// with none left is gone, and f forgets it.
func (f *Filter) updateClassic(cfg *Config) error {
	if _, err := classicProgram(cfg); err != nil {
		return fmt.Errorf("rrl: update classic filter: %w", err)
	}
	var done []*attachedSocket
	for _, s := range f.ownedSockets() {
		err := s.reach(func(conn syscall.Conn) error { return applyClassic(conn, cfg) })
		switch {
		case err == nil:
			done = append(done, s)
		case errors.Is(err, errSocketGone):
			f.forget(s)
		default:
			for _, d := range done {
				// It took this program before.
				d.reach(func(conn syscall.Conn) error { return applyClassic(conn, f.cfg) })
			}
			return s.errorf("update classic filter", err)
		}
	}
	return nil
}

// Mode reports which filter is attached (ModeNone for a nil or closed Filter).
func (f *Filter) Mode() FilterMode {
	if f == nil {
		return ModeNone
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mode
}

// Close detaches the filter from every socket it is on, except sockets a later
// Filter of this process attached to since (so that attaching a new Filter and then
// closing the old one leaves the new one in force), and frees its programs and maps
// (for a pinned filter: closes this process's descriptors, and the pins keep the
// program and maps). A socket is reached through any descriptor of it open in this
// process, not only the one it was attached through; a socket with none left is
// closed, and skipped without error. A socket that is open but could not be reached,
// or refused the detach, is named in the error: it keeps the filter, which goes on
// running with its last settings. Closing twice, or closing a nil Filter, is
// harmless.
func (f *Filter) Close() error { return f.close(true) }

// Release frees the Filter as Close does but leaves the program on every socket it
// is on, running with its last settings: for a tool that attaches a pinned filter to
// another process's sockets (rrlctl attach) and exits.
func (f *Filter) Release() error { return f.close(false) }

// close is Close, or Release when detach is false.
func (f *Filter) close(detach bool) error {
	if f == nil {
		return nil
	}
	f.closeCapacity() // capacity_linux.go
	f.mu.Lock()
	defer f.mu.Unlock()
	var errs []error
	if err := f.liftPinnedLevel(); err != nil { // capacity_linux.go
		errs = append(errs, err)
	}
	f.cookies.stop()
	f.cookies = nil
	for _, s := range f.sockets {
		if !f.owns(s) {
			continue
		}
		var err error
		if detach {
			err = s.reach(detachIfAttached)
		}
		f.disown(s)
		if err != nil && !errors.Is(err, errSocketGone) {
			errs = append(errs, s.errorf("close filter", err))
		}
	}
	f.sockets = nil
	if err := f.closeNames(); err != nil { // filter_names.go
		errs = append(errs, err)
	}
	if f.objs != nil {
		errs = append(errs, f.objs.Close())
		f.objs = nil
	}
	if f.pin != nil && f.pin.config != nil {
		errs = append(errs, f.pin.config.Close())
		f.pin.config = nil
	}
	if f.pin != nil && f.pin.capacity != nil {
		errs = append(errs, f.pin.capacity.Close())
		f.pin.capacity = nil
	}
	f.mode = ModeNone
	return errors.Join(errs...)
}

// detachIfAttached removes conn's socket filter if it has one.
func detachIfAttached(conn syscall.Conn) error {
	if err := detachFilter(conn); err != nil && !errors.Is(err, unix.ENOENT) {
		return err
	}
	return nil
}

// applyClassic puts the classic prefilter for cfg on conn; in report-only mode,
// where nothing may be withheld and the classic filter has no counters, it removes
// any filter instead.
func applyClassic(conn syscall.Conn, cfg *Config) error {
	if cfg.reportOnly {
		return detachIfAttached(conn)
	}
	return attachClassic(conn, cfg)
}

// Config returns a copy of the Config the filter runs with. For a pinned filter it is
// read from the pins, stored next to the settings the kernel runs, so it includes
// changes other processes made (rrlctl set).
func (f *Filter) Config() *Config {
	if f == nil {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.pin != nil {
		f.refreshPinnedConfig()
	}
	return f.cfg.clone()
}
