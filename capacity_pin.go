//go:build linux

package rrl

// The capacity controller of a pinned filter. A Filter this process loaded runs its
// controller itself (capacity_linux.go); a pinned filter is shared by every process
// that attached its pins, so it gets one controller for all of them, from the one
// process that calls RunCapacity (rrlctl control, or a server that attached the pins
// and calls it itself), over the sockets it is given: copies of a running server's
// sockets (pidfd_getfd), or the caller's own.
//
// One controller per pin directory: RunCapacity holds an exclusive flock(2) on the
// directory while it runs, and a second one fails at once, naming the process that
// holds it. The kernel releases the lock when the holder dies, however it dies.
//
// The water level lives in the pins' settings, like every limit, and the kernel has
// no clock on it: a level stays in force until something writes the settings again.
// So RunCapacity lifts it (writes the settings without it) before it returns, and
// Close of a Filter running it does so too; a controller that dies without doing so
// (SIGKILL, a crash) leaves its last level, which the next RunCapacity lifts when it
// starts, and any Update (rrlctl set) lifts as well. rrl_capacity holds the
// controller's status, with its pid and a heartbeat, so that Stats of any process
// (rrlctl stats) shows the capacity mode's state, or that no controller runs, or that
// one died and left a level in force.
//
// The controller follows the pins' configuration: at every sample it reads the
// settings' generation, and when another process flipped them (rrlctl set, a server's
// Update) it reads the Config stored with them (the capacity keyword and the limits
// the level applies to) and writes its level again, which such an Update lifted.
// Every write of the level reads the stored Config first, so that it never puts back
// a configuration another process replaced.

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

const (
	// capStatusSize is the size of rrl_capacity's one value: a header and the
	// CapacityStats as JSON.
	capStatusSize   = 1024
	capStatusHeader = 24 // magic, pid, state, JSON length, heartbeat
	capStatusMagic  = 0x5243
	// capStatusRunning and capStatusStopped are the states a controller publishes.
	capStatusRunning = 1
	capStatusStopped = 2
	// capStatusStale is how old a running controller's heartbeat may be: it
	// publishes at every sample, at least every capacitySampleIdle.
	capStatusStale = 2 * time.Second
)

// capacityMapSpec is the spec of rrl_capacity.
func capacityMapSpec() *ebpf.MapSpec {
	return &ebpf.MapSpec{Name: pinCapacity, Type: ebpf.Array, KeySize: 4, ValueSize: capStatusSize, MaxEntries: 1}
}

// openCapacityMap opens rrl_capacity in dir: read-write, or read-only where only
// that is permitted, or nil when the pins predate it.
func openCapacityMap(dir string) (*ebpf.Map, error) {
	path := filepath.Join(dir, pinCapacity)
	m, err := ebpf.LoadPinnedMap(path, nil)
	if err != nil && isPermission(err) {
		m, err = ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{ReadOnly: true})
	}
	switch {
	case errors.Is(err, unix.ENOENT) || errors.Is(err, fs.ErrNotExist):
		return nil, nil
	case err != nil:
		return nil, openError(path, err)
	}
	if err := capacityMapSpec().Compatible(m); err != nil {
		m.Close()
		return nil, fmt.Errorf("rrl: %s: %w: %w", path, ErrLayoutMismatch, err)
	}
	return m, nil
}

// pinnedCapacity is what a controller publishes in rrl_capacity.
type pinnedCapacity struct {
	pid       uint32
	state     uint32
	heartbeat int64 // CLOCK_MONOTONIC nanoseconds
	stats     CapacityStats
}

func (p *pinState) publishCapacity(pc pinnedCapacity) error {
	if p.capacity == nil {
		return nil
	}
	js, err := json.Marshal(pc.stats)
	if err != nil {
		return err
	}
	if len(js) > capStatusSize-capStatusHeader {
		pc.stats.Problem = ""
		js, _ = json.Marshal(pc.stats)
	}
	v := make([]byte, capStatusSize)
	binary.LittleEndian.PutUint32(v[0:], capStatusMagic)
	binary.LittleEndian.PutUint32(v[4:], pc.pid)
	binary.LittleEndian.PutUint32(v[8:], pc.state)
	binary.LittleEndian.PutUint32(v[12:], uint32(len(js)))
	binary.LittleEndian.PutUint64(v[16:], uint64(pc.heartbeat))
	copy(v[capStatusHeader:], js)
	return p.capacity.Put(uint32(0), v)
}

// readCapacity reads what the pins' controller published last; ok is false when
// nothing was ever published (or the pins predate rrl_capacity).
func (p *pinState) readCapacity() (pc pinnedCapacity, ok bool, err error) {
	if p.capacity == nil {
		return pc, false, nil
	}
	v := make([]byte, capStatusSize)
	if err := p.capacity.Lookup(uint32(0), &v); err != nil {
		return pc, false, fmt.Errorf("rrl: read %s: %w", filepath.Join(p.dir, pinCapacity), err)
	}
	if binary.LittleEndian.Uint32(v[0:]) != capStatusMagic {
		return pc, false, nil
	}
	n := binary.LittleEndian.Uint32(v[12:])
	if n > capStatusSize-capStatusHeader {
		return pc, false, fmt.Errorf("rrl: %s: %w: status of %d bytes", filepath.Join(p.dir, pinCapacity), ErrLayoutMismatch, n)
	}
	pc.pid, pc.state = binary.LittleEndian.Uint32(v[4:]), binary.LittleEndian.Uint32(v[8:])
	pc.heartbeat = int64(binary.LittleEndian.Uint64(v[16:]))
	if err := json.Unmarshal(v[capStatusHeader:capStatusHeader+n], &pc.stats); err != nil {
		return pc, false, fmt.Errorf("rrl: %s: %w: %w", filepath.Join(p.dir, pinCapacity), ErrLayoutMismatch, err)
	}
	return pc, true, nil
}

// pinnedCapacityStats is FilterStats.Capacity of a pinned filter whose controller
// runs in another process, or nowhere. f.mu is held.
func (f *Filter) pinnedCapacityStats() *CapacityStats {
	idle := idleCapacityStats(f.cfg)
	pc, ok, err := f.pin.readCapacity()
	switch {
	case err != nil:
		idle.Problem = err.Error()
		return &idle
	case f.pin.capacity == nil:
		idle.Problem = fmt.Sprintf("rrl: capacity: the pins in %s were made before the controller's status pin (%s): its state cannot be read; load them again", f.pin.dir, pinCapacity)
		return &idle
	case !ok || pc.state == capStatusStopped:
		idle.Problem = fmt.Sprintf("rrl: capacity: no controller runs for the pins in %s (rrlctl control runs one): the static limits are in force", f.pin.dir)
		return &idle
	}
	age := time.Duration(monotonicNow() - pc.heartbeat)
	switch pinDirLocked(f.pin.dir) {
	case lockHeld:
		s := pc.stats
		if age > capStatusStale {
			s.Problem = fmt.Sprintf("rrl: capacity: the controller of the pins in %s (pid %d) published nothing for %s", f.pin.dir, pc.pid, age.Round(time.Second))
		}
		return &s
	case lockUnknown:
		if age <= capStatusStale {
			s := pc.stats
			return &s
		}
	}
	// Its process is gone: it died without publishing that it stopped. Whether it
	// left a level in force is read from the settings the kernel runs: it may have
	// died between writing a level and publishing it.
	if level := f.levelLeft(); level > 0 {
		idle.Level, idle.Overloaded = level, true
		idle.Problem = fmt.Sprintf("rrl: capacity: the controller of the pins in %s (pid %d) died %s ago without lifting its water level %.4g: it stays in force until a controller starts (rrlctl control) or the configuration is written again (rrlctl set)",
			f.pin.dir, pc.pid, age.Round(time.Second), level)
		return &idle
	}
	idle.Problem = fmt.Sprintf("rrl: capacity: the controller of the pins in %s (pid %d) died %s ago; no controller runs: the static limits are in force", f.pin.dir, pc.pid, age.Round(time.Second))
	return &idle
}

// levelLeft returns the water level in force in the settings the kernel runs, read
// from the limits below the static ones of the Config stored with them (a level
// times a node's factor), or 0: the level a controller wrote and did not lift.
// f.mu is held.
func (f *Filter) levelLeft() float64 {
	if f.pin.config == nil {
		return 0
	}
	set, cfg, err := f.pin.readConfig(f.objs)
	if err != nil {
		return 0
	}
	static := latticeOf(cfg) // the limits of the settings without a level
	for _, st := range set.activeNodes() {
		if factor := static.capacity.factor[st.Node]; factor > 0 && st.Limit < uint64(static.limit[st.Node]) {
			return fixed(st.Limit).Float64() / factor
		}
	}
	return 0
}

// RunCapacity runs the capacity controller (Config keyword capacity) of a filter
// opened from pins (OpenPinned or AttachPinned) until ctx is done, sampling the
// receive queues of conns: the sockets the pinned filter is on (a server's own, or
// copies of another process's taken with pidfd_getfd, as rrlctl control does). It
// follows the capacity keyword and the limits of the Config stored in the pins
// (rrlctl set), writes the water level into the pinned settings for every process
// attached to them, and publishes its status, which Stats of any process reads.
//
// Only one controller runs per pin directory: RunCapacity holds an flock on it, and
// fails at once while another process (or another Filter) runs one. Before it
// returns, and when f is closed, it lifts the water level: the static limits stay
// in force. A controller killed without that leaves its last level in the settings,
// and the next RunCapacity lifts it as it starts (as does any Update).
//
// With capacity auto and no socket whose queue can be read, or counters that cannot
// be read, the status reports the problem and no level is written. A Filter this
// process loaded (Attach, Protect) runs its controller itself; RunCapacity refuses
// it.
func (f *Filter) RunCapacity(ctx context.Context, conns ...syscall.Conn) error {
	if f == nil {
		return ErrClosed
	}
	r, k, lock, err := f.startPinnedCapacity(conns)
	if err != nil {
		return err
	}
	defer lock.Close() // releases the flock, after the level is lifted

	select {
	case <-ctx.Done():
	case <-r.done: // Close stopped it
	}
	f.mu.Lock()
	if f.capacity.run == r {
		f.capacity.run = nil
	}
	f.mu.Unlock()
	r.stopAndWait()
	k.closeCells()
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.liftPinnedLevel()
}

// startPinnedCapacity is RunCapacity's start: it takes the pin directory's lock
// (returned, for the caller to release), lifts a level a dead controller left, and
// starts the controller over conns.
func (f *Filter) startPinnedCapacity(conns []syscall.Conn) (*capacityRun, *kernelCapacity, *os.File, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.mode != ModeEBPF || f.objs == nil:
		return nil, nil, nil, ErrClosed
	case f.pin == nil:
		return nil, nil, nil, errors.New("rrl: run capacity controller: not a pinned filter (a Filter this process loaded runs its own)")
	case f.capacity.run != nil:
		return nil, nil, nil, errors.New("rrl: run capacity controller: it runs already for this Filter")
	}
	if err := f.pin.checkWritable(); err != nil {
		return nil, nil, nil, err
	}
	lock, err := lockPinDir(f.pin)
	if err != nil {
		return nil, nil, nil, err
	}
	// A level a controller that died left behind goes now, with the stored Config.
	f.refreshPinnedConfig()
	f.capacity.level = 0
	if err := f.writeSettings(f.cfg); err != nil {
		lock.Close()
		return nil, nil, nil, fmt.Errorf("rrl: run capacity controller: %w", err)
	}
	k := &kernelCapacity{f: f, watched: conns, pinned: true}
	// The cells are read through a memory map, which needs a descriptor opened for
	// writing: root's; others read them by batches.
	if m, err := openCellsRW(filepath.Join(f.pin.dir, pinCells)); err == nil {
		k.cellsRW = m
	}
	k.gen = f.settingsGeneration()
	r := startCapacity(f.cfg, k, monotonicNow)
	k.run = r
	f.capacity.run = r
	// Published at once, so that no earlier controller's record (a dead one's)
	// is read as this one's before its first sample.
	f.capacity.published = true
	f.pin.publishCapacity(pinnedCapacity{pid: uint32(os.Getpid()), state: capStatusRunning, heartbeat: monotonicNow(), stats: *r.stats()})
	return r, k, lock, nil
}

// Whether a controller holds the lock of a pin directory (pinDirLocked).
const (
	lockUnknown = iota
	lockHeld
	lockFree
)

// pinDirLocked tells whether a controller holds the lock on dir, by trying a shared
// lock and letting go of it at once: the kernel drops a dead process's lock, in
// whatever pid namespace it ran. A controller that starts at that very moment
// tries again (lockPinDir).
func pinDirLocked(dir string) int {
	d, err := os.Open(dir)
	if err != nil {
		return lockUnknown
	}
	defer d.Close()
	switch err := unix.Flock(int(d.Fd()), unix.LOCK_SH|unix.LOCK_NB); {
	case errors.Is(err, unix.EWOULDBLOCK):
		return lockHeld
	case err != nil:
		return lockUnknown
	}
	unix.Flock(int(d.Fd()), unix.LOCK_UN)
	return lockFree
}

// lockTries is how many times lockPinDir tries the lock, lockRetry apart: a
// reader's probe (pinDirLocked) holds it for microseconds.
const (
	lockTries = 5
	lockRetry = 5 * time.Millisecond
)

// openCellsRW opens rrl_cells for the memory map; tests make it fail.
var openCellsRW = func(path string) (*ebpf.Map, error) { return ebpf.LoadPinnedMap(path, nil) }

// lockPinDir takes the controller's lock on the pin directory.
func lockPinDir(p *pinState) (*os.File, error) {
	d, err := os.Open(p.dir)
	if err != nil {
		return nil, fmt.Errorf("rrl: run capacity controller: %w", err)
	}
	for i := 1; i < lockTries; i++ {
		if err := unix.Flock(int(d.Fd()), unix.LOCK_EX|unix.LOCK_NB); !errors.Is(err, unix.EWOULDBLOCK) {
			break
		}
		time.Sleep(lockRetry)
	}
	if err := unix.Flock(int(d.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		d.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			who := "another process"
			if pc, ok, _ := p.readCapacity(); ok && pc.state == capStatusRunning {
				who = fmt.Sprintf("process %d", pc.pid)
			}
			return nil, fmt.Errorf("rrl: run capacity controller: %s runs the controller of the pins in %s already (one per pin directory)", who, p.dir)
		}
		return nil, fmt.Errorf("rrl: run capacity controller: lock %s: %w", p.dir, err)
	}
	return d, nil
}

// settingsGeneration returns the settings header's generation (0 if unreadable).
func (f *Filter) settingsGeneration() uint64 {
	h, err := f.objs.settingsMaps().header()
	if err != nil {
		return 0
	}
	return h.Generation
}

// liftPinnedLevel writes a pinned filter's settings without the water level this
// process put in force, if it did, and publishes that the controller stopped. f.mu
// is held; the controller has stopped.
func (f *Filter) liftPinnedLevel() error {
	if f.pin == nil || f.objs == nil || !f.capacity.published {
		return nil
	}
	f.capacity.published = false
	var err error
	if f.capacity.level > 0 {
		f.capacity.level = 0
		f.refreshPinnedConfig()
		if err = f.writeSettings(f.cfg); err != nil {
			err = fmt.Errorf("rrl: capacity: lift the water level: %w", err)
		}
	}
	st := idleCapacityStats(f.cfg)
	if err != nil {
		st.Problem = err.Error()
	}
	f.pin.publishCapacity(pinnedCapacity{pid: uint32(os.Getpid()), state: capStatusStopped, heartbeat: monotonicNow(), stats: st})
	return err
}

// followPins is sample's part for a pinned filter: a flip of the settings by another
// process brings its Config, and a level to write again. f.mu is held.
func (k *kernelCapacity) followPins() {
	f := k.f
	gen := f.settingsGeneration()
	if gen == k.gen {
		return
	}
	k.gen = gen
	if f.refreshPinnedConfig() {
		k.run.update(f.cfg)
	}
	if f.capacity.level > 0 {
		k.rewrite = true
	}
}

// takeRewrite reports once that the level must be written again.
func (k *kernelCapacity) takeRewrite() bool {
	if !k.pinned {
		return false
	}
	f := k.f
	f.mu.Lock()
	defer f.mu.Unlock()
	rw := k.rewrite
	k.rewrite = false
	return rw
}

// publish puts the controller's status in the pins.
func (k *kernelCapacity) publish(st CapacityStats) {
	if !k.pinned {
		return
	}
	f := k.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.pin == nil || !k.mine() {
		return
	}
	if math.IsInf(st.Level, 0) {
		st.Level = 0
	}
	f.capacity.published = true
	f.pin.publishCapacity(pinnedCapacity{pid: uint32(os.Getpid()), state: capStatusRunning, heartbeat: monotonicNow(), stats: st})
}
