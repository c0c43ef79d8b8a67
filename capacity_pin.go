//go:build linux

package rrl

// A pinned filter's capacity controller (RunCapacity, capacity_linux.go) keeps two
// things in its pin directory besides the level it writes into the settings.
//
// One controller per pin directory: RunCapacity holds an exclusive flock(2) on the
// directory while it runs, and a second one fails at once, naming the process that
// holds it. The kernel releases the lock when the holder dies, however it dies.
//
// rrl_capacity holds the controller's status, with its pid and a heartbeat, so that
// Stats of any process (rrlctl stats) shows the capacity mode's state, or that no
// controller runs, or that one died and left a level in force.

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
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
