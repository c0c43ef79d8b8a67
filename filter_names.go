//go:build linux

package rrl

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// The kernel filter's names tables (bpf/names.h, docs/names.md): rrl_names and
// rrl_apexes, memory-mappable arrays of 32-byte buckets of four 64-bit entries, the
// layout of nameLearner's tables. The Go side maps them into its memory and the
// learner writes them in place, one compare-and-swap per entry as on the heap, so
// that learning from a response costs no system call; the program only reads them.

// nameBucketBytes is the size of one bucket (struct name_bucket).
const nameBucketBytes = nameWays * 8

// kernelNameTables are the two tables mapped into this process.
type kernelNameTables struct {
	names, apexes []byte
}

// mapNameTables maps the filter's names tables (descriptors opened for writing:
// the kernel maps a bpf map shared and writable only through one).
func mapNameTables(names, apexes *ebpf.Map) (*kernelNameTables, error) {
	if names == nil || apexes == nil {
		return nil, fmt.Errorf("rrl: names tables: %w", ErrLayoutMismatch)
	}
	for _, c := range []struct {
		m       *ebpf.Map
		buckets uint32
	}{{names, 1 << nameBucketShift}, {apexes, 1<<apexBucketShift + 1}} {
		if c.m.ValueSize() != nameBucketBytes || c.m.MaxEntries() != c.buckets || c.m.Flags()&unix.BPF_F_MMAPABLE == 0 {
			return nil, fmt.Errorf("rrl: names tables: %w: %v", ErrLayoutMismatch, c.m)
		}
	}
	t := &kernelNameTables{}
	var err error
	if t.names, err = mmapMap(names); err != nil {
		return nil, err
	}
	if t.apexes, err = mmapMap(apexes); err != nil {
		t.close()
		return nil, err
	}
	return t, nil
}

func mmapMap(m *ebpf.Map) ([]byte, error) {
	n := int(m.ValueSize()) * int(m.MaxEntries())
	b, err := unix.Mmap(m.FD(), 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("rrl: map %v into memory: %w", m, err)
	}
	return b, nil
}

// learner returns a nameLearner keyed by seed (the settings' name_seed) that
// learns into the tables, with the configured apexes. It must not be used once
// the tables are closed.
func (t *kernelNameTables) learner(seed uint64, apexes []string) (*nameLearner, bool) {
	return newNameLearnerOn(seed, apexes, words(t.names, nameTableWords), words(t.apexes, apexTableWords+1))
}

// words is the memory b (page aligned, from mmap) as n 64-bit words.
func words(b []byte, n int) []atomic.Uint64 {
	if len(b) < n*8 {
		return nil
	}
	return unsafe.Slice((*atomic.Uint64)(unsafe.Pointer(unsafe.SliceData(b))), n)
}

// close unmaps the tables.
func (t *kernelNameTables) close() error {
	var err error
	for _, b := range [][]byte{t.names, t.apexes} {
		if b != nil {
			if e := unix.Munmap(b); e != nil && err == nil {
				err = e
			}
		}
	}
	t.names, t.apexes = nil, nil
	return err
}

// filterNames is what a Filter in ModeEBPF keeps to teach its names tables: the
// tables mapped into this process and a learner on them, keyed by the settings'
// name seed (nameSeed of the Filter's seed) and stamped with CLOCK_MONOTONIC, the
// program's clock. A pinned filter's tables are the pins' maps, so every process
// attached to one pin directory teaches one table. observe runs per response and
// takes the read lock only; closing the tables takes the write lock, so no
// response is learnt into memory that is no longer mapped.
type filterNames struct {
	// on: responses are learnt (the Config has names on, or the filter is
	// pinned); the tables stay mapped while it is off.
	on      atomic.Bool
	mu      sync.RWMutex
	tables  *kernelNameTables
	learner *nameLearner
	zones   []string // the learner's configured apexes
	// err is why the tables could not be mapped (a pinned filter opened without
	// write access to them), nil when they are or were not asked for.
	err error
	// zoneNames names the apexes seen (configured, or the owner of an answer's
	// SOA), for the names events: at most maxZoneNames.
	zoneNames sync.Map // nameKey -> string
	nzones    atomic.Int32
}

// namesUpdated maps f's names tables and makes their learner when f's Config has
// the names judge on (a pinned filter's whatever its Config says: another process
// may turn it on, and what it finds learnt must be there), with the Config's zones
// as configured apexes; a change of zones makes a new learner on the same tables
// (the configured apexes are added; what was learnt stays). f.mu is held.
func (f *Filter) namesUpdated() {
	if f.mode != ModeEBPF || f.objs == nil || f.closing {
		return
	}
	n := &f.names
	n.on.Store(f.pin != nil || namesOnIn(f.cfg))
	if !n.on.Load() {
		return // tables mapped before stay mapped, unused
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	zones := f.cfg.zones
	if n.tables != nil && slices.Equal(n.zones, zones) || n.err != nil {
		return
	}
	if n.tables == nil {
		t, err := mapNameTables(f.objs.Names, f.objs.Apexes)
		if err != nil {
			n.err = err
			return
		}
		n.tables = t
	}
	seed := nameSeed(f.seed)
	lr, ok := n.tables.learner(seed, zones)
	if !ok {
		lr, _ = n.tables.learner(seed, nil) // parseZones refused such names already
	}
	n.learner, n.zones = lr, slices.Clone(zones)
	var q qname
	for _, z := range zones {
		if qnameOf(z, seed, &q) {
			n.nameZone(q.name(), z)
		}
	}
}

// observe teaches f's names tables from resp, a response the server computed,
// with the wildcard origin its handler reported ("" for none).
func (f *Filter) observe(resp *dns.Msg, wildcard string) {
	if f == nil {
		return
	}
	n := &f.names
	if !n.on.Load() {
		return
	}
	n.mu.RLock()
	defer n.mu.RUnlock()
	if n.learner == nil {
		return
	}
	n.learner.observe(resp, wildcard, uint64(max(monotonicNow(), 0)))
	for _, rr := range resp.Ns {
		if soa, ok := rr.(*dns.SOA); ok {
			var q qname
			if qnameOf(soa.Hdr.Name, n.learner.seed, &q) && q.labels > 0 {
				n.nameZone(q.name(), soa.Hdr.Name)
			}
			break
		}
	}
}

// nameZone records that key is the apex name, unless maxZoneNames are recorded.
func (n *filterNames) nameZone(key nameKey, name string) {
	if _, ok := n.zoneNames.Load(key); ok || n.nzones.Load() >= maxZoneNames {
		return
	}
	if _, loaded := n.zoneNames.LoadOrStore(key, dns.CanonicalName(name)); !loaded {
		n.nzones.Add(1)
	}
}

// closeNames unmaps f's names tables, once no response is being learnt.
func (f *Filter) closeNames() error {
	n := &f.names
	n.on.Store(false)
	n.mu.Lock()
	defer n.mu.Unlock()
	n.learner = nil
	if n.tables == nil {
		return nil
	}
	err := n.tables.close()
	n.tables = nil
	return err
}
