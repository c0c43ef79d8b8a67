//go:build linux

package rrl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/dnsrake/rrl/internal/sockopt"
	"golang.org/x/sys/unix"
)

// The kernel filter's capacity controller. A Filter whose Config has capacity on runs
// one (loaded by this process, not opened from pins) from Attach, or the Update that
// turns it on, until Close. It reads the receive queues of the sockets the Filter
// owns with SO_MEMINFO, the program's counters, and the sketches through a read-only
// memory map of rrl_cells (no system call per cell), and writes the water level as
// every adjusted step's limit through the settings slots (settings.go): each new
// level is one slot flip, so every packet is judged wholly by one level or the next
// and the program reads nothing more per packet.

// readSocketQueue returns the bytes in conn's receive queue, the queue's size and the
// socket's drop counter.
func readSocketQueue(conn syscall.Conn) (queued, size, drops uint32, err error) {
	err = sockopt.Control(conn, func(fd int) error {
		var info [unix.SK_MEMINFO_VARS]uint32
		n := uint32(unsafe.Sizeof(info))
		_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_MEMINFO,
			uintptr(unsafe.Pointer(&info[0])), uintptr(unsafe.Pointer(&n)), 0)
		if e != 0 {
			return e
		}
		// SK_MEMINFO_DROPS counts both the queue's overflows and the filter's drops.
		queued, size, drops = info[unix.SK_MEMINFO_RMEM_ALLOC], info[unix.SK_MEMINFO_RCVBUF], info[unix.SK_MEMINFO_DROPS]
		return nil
	})
	return queued, size, drops, err
}

// filterCapacity is a Filter's capacity state, guarded by Filter.mu.
type filterCapacity struct {
	run   *capacityRun
	level float64 // the water level in the kernel's settings; 0: none
	// published: a pinned filter's controller (RunCapacity, capacity_pin.go) has
	// published its status in the pins, and must publish that it stopped.
	published bool
}

// capacityConfig returns the Config to write to the kernel for cfg: cfg itself, or a
// copy carrying the water level in force.
func (f *Filter) capacityConfig(cfg *Config) *Config {
	if cfg.capacity == 0 || f.capacity.level <= 0 {
		return cfg
	}
	c := cfg.clone()
	c.capLevel = f.capacity.level
	return c
}

// capacityUpdated starts or stops the controller after f.cfg changed. f.mu is held.
// A controller told to stop ends at its next sample; it touches nothing once it is
// no longer f's.
func (f *Filter) capacityUpdated() {
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
		close(r.stop)
		f.capacity.run, f.capacity.level = nil, 0
	}
}

// stopCapacity ends the controller and waits for it. f.mu must not be held: the
// controller takes it.
func (f *Filter) stopCapacity() {
	f.mu.Lock()
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
		return f.pinnedCapacityStats() // capacity_pin.go
	}
	return f.capacity.run.stats()
}

// errCapacityStopped: the controller is no longer its Filter's.
var errCapacityStopped = errors.New("rrl: capacity controller stopped")

// kernelCapacity is the capacitySource of a Filter's controller.
type kernelCapacity struct {
	f   *Filter
	run *capacityRun
	// For a pinned filter (RunCapacity, capacity_pin.go): the sockets it is given,
	// the settings' generation after its last write or read, and whether another
	// process's write lifted the level, which must then be written again.
	pinned  bool
	watched []syscall.Conn
	gen     uint64
	rewrite bool

	queues queueWatch
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
		k.followPins() // capacity_pin.go
	}
	var socks []queueSocket
	for _, s := range f.ownedSockets() {
		socks = append(socks, queueSocket{key: s.id, conn: s.conn})
	}
	for i, c := range k.watched {
		socks = append(socks, queueSocket{key: watchedKey(i), conn: c})
	}
	in := k.queues.read(socks)
	sum, err := sumCounters(f.objs.Counters)
	if err != nil {
		return capacityInput{}, fmt.Errorf("rrl: capacity: read the filter's counters: %w", err)
	}
	var limited uint64
	for _, v := range sum[counterLimited0 : counterLimited0+numLimited] {
		limited += v
	}
	stateless := sum[counterDropShort] + sum[counterDropResponse] + sum[counterDropReflection]
	in.Now = now
	in.Demand = sum[counterSeen] - stateless
	in.fixed = sum[counterNotDNS] + sum[counterExempt] + sum[counterCookiePassed]
	in.Admitted = subFloor(in.Demand, in.fixed+limited)
	in.Overflow = k.queues.account(subFloor(sum[counterSeen], sum[counterPassed]))
	in.Served = subFloor(sum[counterPassed], in.Overflow)
	return in, nil
}

func (k *kernelCapacity) nodes(now int64) []capacityNode {
	f := k.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if !k.mine() {
		return nil
	}
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
				return nil // unreadable: no node, so no water level
			}
			k.batch = true
		}
		k.mem, k.cells = mem, make([]byte, sketchDepth*sketchWidth*cellBytes)
	} else if k.batch {
		var err error
		if k.ro, err = readCellsBatch(f.objs.Cells, k.ro); err != nil {
			return nil
		}
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

func (k *kernelCapacity) apply(level float64) error {
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
	prev := f.capacity.level
	f.capacity.level = level
	if err := f.writeSettings(f.cfg); err != nil {
		f.capacity.level = prev
		return fmt.Errorf("rrl: capacity: write the limits: %w", err)
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
