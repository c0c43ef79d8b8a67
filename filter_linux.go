//go:build linux

package rrl

import (
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"syscall"
)

// The Filter's state: the type, the sockets it owns, and the writes of its settings
// to the kernel. What a Filter does (Attach, Update, Close, Stats, the pins, the
// capacity controller, cookies) is built on it in the files named after each; the
// portable half is filter_other.go.

// Filter is the kernel side of rrl on one or more UDP sockets: the eBPF request
// limiter (ModeEBPF) or, where eBPF may not be loaded, the classic-BPF prefilter
// (ModeClassic). Every socket attached through one Filter shares its limits and
// sketches, so the sockets of a SO_REUSEPORT group hold one limit together. Its maps
// take about 1.3 MiB of kernel memory whatever the traffic (docs/kernel-filter.md).
//
// With the Config keyword capacity on, a Filter this process loaded runs the
// capacity controller until Close; a pinned filter gets its one controller from the
// process that calls RunCapacity (rrlctl control). Its names judge (names on, by
// default with capacity) learns what exists from the server's answers only: a
// Protection's Handler teaches the Filter it attached, a Handler of NewHandler the
// Filter given with WithFilter; a Filter nothing teaches knows no names
// (docs/names.md).
//
// A Filter is safe for concurrent use.
type Filter struct {
	mu       sync.Mutex
	mode     FilterMode
	cfg      *Config
	seed     uint64
	objs     *kernelObjects
	sockets  []*attachedSocket // sockets attached, checked against socketOwners
	pin      *pinState         // opened from pins (filter_pin.go): Close leaves the pins in place
	cookies  *kernelCookies    // the secrets of UseCookies (filter_cookies.go)
	capacity filterCapacity    // the capacity controller (capacity_linux.go)
	names    filterNames       // the names tables' learner (filter_names.go)
	// closing: Close has begun. Set under mu as Close takes the capacity controller
	// to stop it; from then on none starts, and Update and Attach refuse.
	closing bool
}

// writeSettings makes cfg the configuration the kernel runs (filter_settings.go): it checks
// everything first, and leaves the previous configuration in force on any error.
func (f *Filter) writeSettings(cfg *Config) error { return f.writeSettingsSecrets(cfg, nil) }

// writeSettingsSecrets is writeSettings that also writes secrets (nil: leaves the
// cookie secrets as they are), last before the flip (filter_cookie_secrets.go).
func (f *Filter) writeSettingsSecrets(cfg *Config, secrets *cookieKeys) error {
	cfg = f.capacityConfig(cfg) // the water level in force
	if err := checkKernelConfig(cfg); err != nil {
		return err
	}
	var beforeFlip []func(slot uint8) error
	var flags uint32
	if f.pin != nil {
		if err := f.pin.checkWritable(); err != nil {
			return err
		}
		text, err := configValue(cfg, f.pin.flags)
		if err != nil {
			return err
		}
		// The Config text has a slot of its own next to each settings slot.
		beforeFlip = append(beforeFlip, func(slot uint8) error {
			flags = f.pin.flags
			if secrets != nil {
				flags = flags&^configCookieBits | cookieFlags(secrets)
			} else if inForce, _, err := readConfigMap(f.pin.config, 1-slot); err == nil {
				// Another process may have changed the secrets since this one
				// read the flags: they stay as the slot in force says.
				flags = flags&^configCookieBits | inForce&configCookieBits
			}
			binary.LittleEndian.PutUint32(text[4:], flags)
			return f.pin.saveConfig(slot, text)
		})
	}
	if secrets != nil {
		beforeFlip = append(beforeFlip, func(uint8) error {
			if err := writeCookieSecrets(f.objs.CookieSecrets, secrets); err != nil {
				return fmt.Errorf("rrl: write cookie secrets: %w", err)
			}
			return nil
		})
	}
	err := f.objs.settingsMaps().apply(cfg, f.seed, func(slot uint8) error {
		for _, step := range beforeFlip {
			if err := step(slot); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil && f.pin != nil {
		f.pin.flags = flags
	}
	return err
}

// socketOwners is which Filter of this process attached each socket last (see
// attach_sockets.go).
var socketOwners = struct {
	sync.Mutex
	m map[socketID]*Filter
}{m: map[socketID]*Filter{}}

// own records that f attached the socket last, through conn: from now on f reaches
// the socket through conn first, whichever descriptor it knew before.
func (f *Filter) own(conn syscall.Conn, id socketID) {
	socketOwners.Lock()
	socketOwners.m[id] = f
	socketOwners.Unlock()
	local := localAddr(conn)
	for _, s := range f.sockets {
		if s.id == id {
			s.conn, s.local = conn, local
			return
		}
	}
	f.sockets = append(f.sockets, &attachedSocket{conn: conn, id: id, local: local})
}

// owns reports whether f is still the last Filter that attached s.
func (f *Filter) owns(s *attachedSocket) bool {
	socketOwners.Lock()
	defer socketOwners.Unlock()
	return socketOwners.m[s.id] == f
}

// disown forgets f's claim on s, leaving a later owner's in place.
func (f *Filter) disown(s *attachedSocket) {
	socketOwners.Lock()
	if socketOwners.m[s.id] == f {
		delete(socketOwners.m, s.id)
	}
	socketOwners.Unlock()
}

// forget drops s, a socket that is gone, from f.
func (f *Filter) forget(s *attachedSocket) {
	f.disown(s)
	f.sockets = slices.DeleteFunc(f.sockets, func(o *attachedSocket) bool { return o == s })
}

// ownedSockets returns the sockets f still owns.
func (f *Filter) ownedSockets() []*attachedSocket {
	var out []*attachedSocket
	for _, s := range f.sockets {
		if f.owns(s) {
			out = append(out, s)
		}
	}
	return out
}

// pinPath returns the pin directory a filter was opened from ("" when it was not).
func (f *Filter) pinPath() string {
	if f == nil || f.pin == nil {
		return ""
	}
	return f.pin.dir
}

// filterCapacity is a Filter's capacity state, guarded by Filter.mu.
type filterCapacity struct {
	run   *capacityRun
	level float64 // the water level in the kernel's settings; 0: none
	// namesLevel is the names level in the kernel's settings (docs/names.md,
	// "The controller"); 0: none. It is written and lifted with level.
	namesLevel float64
	// published: a pinned filter's controller (RunCapacity, capacity_linux.go) has
	// published its status in the pins, and must publish that it stopped.
	published bool
}

// capacityConfig returns the Config to write to the kernel for cfg: cfg itself, or a
// copy carrying the water level in force.
func (f *Filter) capacityConfig(cfg *Config) *Config {
	if cfg.capacity == 0 || f.capacity.level <= 0 && f.capacity.namesLevel <= 0 {
		return cfg
	}
	c := cfg.clone()
	c.capLevel = f.capacity.level
	c.namesLevel = f.capacity.namesLevel
	return c
}

// refreshPinnedConfig reads the Config stored in the pins, with the settings in
// force, into f.cfg, keeping the clock the caller may have given the Config it
// passed; it reports whether it could. f.mu is held, and f is pinned.
func (f *Filter) refreshPinnedConfig() bool {
	if f.pin.config == nil || f.objs == nil {
		return false
	}
	_, cfg, err := f.pin.readConfig(f.objs)
	if err != nil {
		return false
	}
	// The clock and the event function are this process's, not the pins'.
	cfg.nowFunc, cfg.eventFunc = f.cfg.nowFunc, f.cfg.eventFunc
	f.cfg = cfg
	return true
}

// settingsGeneration returns the settings header's generation (0 if unreadable).
func (f *Filter) settingsGeneration() uint64 {
	h, err := f.objs.settingsMaps().header()
	if err != nil {
		return 0
	}
	return h.Generation
}
