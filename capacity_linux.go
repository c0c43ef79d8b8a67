//go:build linux

package rrl

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
)

// The kernel filter's capacity controller. A Filter whose Config has capacity on runs
// one (loaded by this process, not opened from pins) from Attach, or the Update that
// turns it on, until Close. It reads the receive queues of the sockets the Filter
// owns with SO_MEMINFO, the program's counters, and the sketches through a read-only
// memory map of rrl_cells (no system call per cell), and writes the water level as
// every adjusted step's limit through the settings slots (filter_settings.go): each new
// level is one slot flip, so every packet is judged wholly by one level or the next
// and the program reads nothing more per packet.
//
// A pinned filter is shared by every process that attached its pins, so it gets one
// controller for all of them, from the one process that calls RunCapacity (rrlctl
// control, or a server that attached the pins and calls it itself), over the sockets
// it is given: copies of a running server's sockets (pidfd_getfd), or the caller's
// own. Its status record and the pin directory's lock are in capacity_pin.go.
//
// The water level lives in the pins' settings, like every limit, and the kernel has
// no clock on it: a level stays in force until something writes the settings again.
// So RunCapacity lifts it (writes the settings without it) before it returns, and
// Close of a Filter running it does so too; a controller that dies without doing so
// (SIGKILL, a crash) leaves its last level, which the next RunCapacity lifts when it
// starts, and any Update (rrlctl set) lifts as well.
//
// The controller follows the pins' configuration: at every sample it reads the
// settings' generation, and when another process flipped them (rrlctl set, a server's
// Update) it reads the Config stored with them (the capacity keyword and the limits
// the level applies to) and writes its level again, which such an Update lifted.
// Every write of the level reads the stored Config first, so that it never puts back
// a configuration another process replaced.

// capacityUpdated starts or stops the controller after f.cfg changed. f.mu is held.
// A controller told to stop ends at its next sample; it touches nothing once it is
// no longer f's. None starts once Close has begun (f.closing, set under f.mu
// as Close takes the controller to stop it), so none outlives Close.
func (f *Filter) capacityUpdated() {
	if f.closing {
		return
	}
	if f.pin != nil {
		// A pinned filter's controller runs in RunCapacity, whatever the capacity
		// keyword says (it waits while the mode is off), and follows the pins.
		if r := f.capacity.run; r != nil {
			r.update(f.cfg)
		}
		return
	}
	on := f.cfg.capacity != 0 && f.mode == ModeEBPF && f.pin == nil
	switch r := f.capacity.run; {
	case on && r == nil:
		k := &kernelCapacity{f: f}
		f.capacity.run = startCapacity(f.cfg, k, monotonicNow)
		k.run = f.capacity.run
	case on:
		r.update(f.cfg)
	case r != nil:
		r.halt()
		f.capacity.run, f.capacity.level, f.capacity.namesLevel = nil, 0, 0
	}
}

// closeCapacity is Close's part: from now on no controller starts for f, and the
// one running ends; it waits for it unless it is in the event function, which may be
// what called Close (capacityRun.halt). f.mu must not be held: the controller takes
// it.
func (f *Filter) closeCapacity() {
	f.mu.Lock()
	f.closing = true
	r := f.capacity.run
	f.capacity.run = nil
	f.mu.Unlock()
	r.stopAndWait()
}

// capacityStats is FilterStats.Capacity. f.mu is held.
func (f *Filter) capacityStats() *CapacityStats {
	if f.cfg == nil || f.cfg.capacity == 0 {
		return nil
	}
	if f.pin != nil && f.capacity.run == nil {
		return f.pinnedCapacityStats()
	}
	return f.capacity.run.stats()
}

// errCapacityStopped: the controller is no longer its Filter's.
var errCapacityStopped = errors.New("rrl: capacity controller stopped")

// kernelCapacity is the capacitySource of a Filter's controller.
type kernelCapacity struct {
	f   *Filter
	run *capacityRun
	// For a pinned filter (RunCapacity): the sockets it is given,
	// the settings' generation after its last write or read, and whether another
	// process's write lifted the level, which must then be written again.
	pinned  bool
	watched []syscall.Conn
	gen     uint64
	rewrite bool
	// namesRewrite: as rewrite, for the names level (takeNamesRewrite).
	namesRewrite bool

	queues queueWatch
	socks  []queueSocket    // the sockets of the last sample (storage)
	perCPU []filterCounters // the counters' per-CPU values (storage)
	mem    *ebpf.Memory
	ro     []byte // or a copy of all cells read by batches (readCellsBatch), when batch
	batch  bool
	// cellsRW is rrl_cells of a pinned filter opened read-write for the mapping
	// (RunCapacity, when permitted), closed by closeCells.
	cellsRW *ebpf.Map
	cells   []byte // one node's cells, read from mem or ro
	params  *limiterParams
	cfg     *Config // params is latticeOf(cfg)
	cellsS  capacityScratch
	// The names judge's (capacity_kernel_names.go): its counters as sample read
	// them, and the zone sketch's cells as zoneCell read them last.
	namesCounts namesCounts
	zoneBlock   []byte
}

// mine reports whether k's controller is still its Filter's. f.mu is held.
func (k *kernelCapacity) mine() bool {
	return k.f.capacity.run == k.run && k.run != nil && k.f.mode == ModeEBPF && k.f.objs != nil
}

func (k *kernelCapacity) sample(now int64) (capacityInput, error) {
	f := k.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if !k.mine() {
		return capacityInput{}, errCapacityStopped
	}
	// The sockets first, then the counters: the program counts a drop before the
	// socket does, so the difference (overflow) is never counted ahead of time.
	if f.pin != nil {
		k.followPins()
	}
	socks := k.socks[:0] // reused: a sample allocates as little as it can
	for _, s := range f.sockets {
		if f.owns(s) {
			socks = append(socks, queueSocket{key: s.id, conn: s.conn})
		}
	}
	owned := len(socks)
	for i, c := range k.watched {
		// A socket given to RunCapacity that this Filter is attached to itself (a
		// server running its pins' controller) is read once: read twice, its
		// drops (the program's included) would count twice as overflows.
		if id, err := identify(c); err == nil && slices.ContainsFunc(socks[:owned], func(q queueSocket) bool { return q.key == id }) {
			continue
		}
		socks = append(socks, queueSocket{key: watchedKey(i), conn: c})
	}
	k.socks = socks
	in := k.queues.read(socks)
	sum, err := sumCountersInto(f.objs.Counters, &k.perCPU)
	if err != nil {
		return capacityInput{}, fmt.Errorf("rrl: capacity: read the filter's counters: %w", err)
	}
	var limited uint64
	for _, v := range sum[counterLimited0 : counterLimited0+numLimited] {
		limited += v
	}
	// What the names judge refused is limited too (as the Go Limiter's refused
	// counts it): Admitted is what passed both judges, so that the names
	// controller's "other" (Admitted, fixed, less the random names passed) is what
	// the server read besides random names.
	limited += sum[counterNamesLimited]
	stateless := sum[counterDropUnfollowed] + sum[counterDropShort] + sum[counterDropResponse] + sum[counterDropReflection]
	in.Now = now
	in.Demand = sum[counterSeen] - stateless
	in.fixed = sum[counterExempt] + sum[counterCookiePassed]
	in.Admitted = subFloor(in.Demand, in.fixed+limited)
	in.Overflow = k.queues.account(subFloor(sum[counterSeen], sum[counterPassed]))
	// What entered the queues: read, or still queued (QueuedPackets).
	in.Served = subFloor(sum[counterPassed], in.Overflow)
	k.namesCounts = namesCountsOf(&sum) // capacity_kernel_names.go
	return in, nil
}

func (k *kernelCapacity) nodes(now int64) []capacityNode {
	f := k.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if !k.mine() {
		return nil
	}
	if !k.readCells() {
		return nil // unreadable: no node, so no water level
	}
	if k.cfg != f.cfg {
		k.cfg, k.params = f.cfg, latticeOf(f.cfg)
	}
	node := -1
	read := func(n, row, col int) (fixed, uint64) {
		if n != node {
			node = n
			switch off := n * len(k.cells); {
			case k.ro != nil && off+len(k.cells) <= len(k.ro):
				copy(k.cells, k.ro[off:])
			case k.mem != nil:
				if _, err := k.mem.ReadAt(k.cells, int64(off)); err != nil {
					clear(k.cells)
				}
			default:
				clear(k.cells)
			}
		}
		c := k.cells[(row*sketchWidth+col)*cellBytes:]
		return fixed(binary.NativeEndian.Uint64(c)), binary.NativeEndian.Uint64(c[8:])
	}
	return k.params.capacityNodes(uint64(now), read, &k.cellsS)
}

// readCells makes the cells readable, through the memory map or, without one, by
// reading them all now by batches; false when they cannot be read. f.mu is held.
func (k *kernelCapacity) readCells() bool {
	f := k.f
	if k.mem == nil && k.ro == nil {
		cells := f.objs.Cells
		if k.cellsRW != nil {
			cells = k.cellsRW
		}
		mem, err := cells.Memory()
		if err != nil {
			// The kernel maps a bpf map only through a descriptor opened for
			// writing (a read-only file loses VM_SHARED, which it requires):
			// without one, read the whole sketch by batches.
			if k.ro, err = readCellsBatch(f.objs.Cells, k.ro); err != nil {
				return false
			}
			k.batch = true
		}
		k.mem, k.cells = mem, make([]byte, sketchDepth*sketchWidth*cellBytes)
	} else if k.batch {
		var err error
		if k.ro, err = readCellsBatch(f.objs.Cells, k.ro); err != nil {
			return false
		}
	}
	return true
}

func (k *kernelCapacity) apply(level float64) error {
	return k.writeLevel(&k.f.capacity.level, level, "the limits")
}

// writeLevel sets *field (one of f.capacity's levels) to level and writes the
// settings, restoring it when the write fails; what names it in the error.
func (k *kernelCapacity) writeLevel(field *float64, level float64, what string) error {
	f := k.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if !k.mine() {
		return nil
	}
	if f.pin != nil {
		// Never write back a Config another process replaced meanwhile.
		f.refreshPinnedConfig()
	}
	prev := *field
	*field = level
	if err := f.writeSettings(f.cfg); err != nil {
		*field = prev
		return fmt.Errorf("rrl: capacity: write %s: %w", what, err)
	}
	if f.pin != nil {
		k.gen = f.settingsGeneration()
	}
	return nil
}

// watchedKey identifies a socket given to RunCapacity in queueWatch.
type watchedKey int

// readCellsBatch reads every cell of m into buf (reused when large enough), laid
// out as the memory map has them.
func readCellsBatch(m *ebpf.Map, buf []byte) ([]byte, error) {
	n := int(m.MaxEntries())
	size := n * cellBytes
	if cap(buf) < size {
		buf = make([]byte, size)
	}
	buf = buf[:size]
	const chunk = 4096
	keys := make([]uint32, chunk)
	vals := make([]filterCell, chunk)
	var cursor ebpf.MapBatchCursor
	for {
		got, err := m.BatchLookup(&cursor, keys, vals, nil)
		for i := 0; i < got; i++ {
			if k := int(keys[i]); k < n {
				binary.NativeEndian.PutUint64(buf[k*cellBytes:], vals[i].Count)
				binary.NativeEndian.PutUint64(buf[k*cellBytes+8:], vals[i].Last)
			}
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return buf, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// closeCells closes what the controller opened to read the cells, once it stopped.
func (k *kernelCapacity) closeCells() {
	k.f.mu.Lock()
	defer k.f.mu.Unlock()
	if k.cellsRW != nil {
		k.cellsRW.Close()
		k.cellsRW, k.mem = nil, nil
	}
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
	for i, c := range conns {
		if err := checkUDP(c); err != nil {
			return fmt.Errorf("rrl: run capacity controller: socket %d: %w", i, err)
		}
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
	case f.mode != ModeEBPF || f.objs == nil || f.closing:
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
	f.capacity.level, f.capacity.namesLevel = 0, 0
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

// liftPinnedLevel writes a pinned filter's settings without the water level this
// process put in force, if it did, and publishes that the controller stopped. f.mu
// is held; the controller has stopped.
func (f *Filter) liftPinnedLevel() error {
	if f.pin == nil || f.objs == nil || !f.capacity.published {
		return nil
	}
	f.capacity.published = false
	var err error
	if f.capacity.level > 0 || f.capacity.namesLevel > 0 {
		f.capacity.level, f.capacity.namesLevel = 0, 0
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
	if f.capacity.namesLevel > 0 {
		k.namesRewrite = true
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
