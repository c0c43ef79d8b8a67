//go:build linux

package rrl

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/cilium/ebpf"
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
