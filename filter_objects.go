//go:build linux

package rrl

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"
)

// layoutVersion identifies the layout of the filter's maps; LAYOUT_VERSION in
// bpf/common.h is the same number.
const layoutVersion = 11

// kernelObjects are the program and maps production loads: test-only programs and
// maps in filter_bpf.c stay out of the kernel.
type kernelObjects struct {
	Program  *ebpf.Program `ebpf:"rrl_filter"`
	Cells    *ebpf.Map     `ebpf:"rrl_cells"`
	Settings *ebpf.Map     `ebpf:"rrl_settings"`
	Counters *ebpf.Map     `ebpf:"rrl_counters"`
	Exempt4  *ebpf.Map     `ebpf:"rrl_exempt4"`
	Exempt6  *ebpf.Map     `ebpf:"rrl_exempt6"`
	// The server cookie secrets (filter_cookies.go); nil for a pinned filter opened
	// without write access to them. The lookup's per-CPU scratch map is only the
	// program's: the loader creates it, and the program holds it.
	CookieSecrets *ebpf.Map `ebpf:"rrl_cookie_secrets"`
	// The groups the request limiter refused lately (filter_limited.go).
	Limited *ebpf.Map `ebpf:"rrl_limited"`
	// What XDP judges, so that the socket filter does not judge it again (xdp.go).
	XDPDests *ebpf.Map `ebpf:"rrl_xdp_dests"`
	XDPState *ebpf.Map `ebpf:"rrl_xdp_state"`
	// The names judge (docs/names.md): the program rrl_filter hands a packet to
	// when names are on (loaded with it, held by NamesProg), and the two tables the
	// learner writes in place (filter_names.go).
	NamesProg *ebpf.Map `ebpf:"rrl_names_prog"`
	Names     *ebpf.Map `ebpf:"rrl_names"`
	Apexes    *ebpf.Map `ebpf:"rrl_apexes"`
}

func (o *kernelObjects) Close() error {
	var errs []error
	for _, c := range []interface{ Close() error }{o.Program, o.Cells, o.Settings, o.Counters, o.Exempt4, o.Exempt6, o.CookieSecrets, o.Limited, o.XDPDests, o.XDPState, o.NamesProg, o.Names, o.Apexes} {
		if c != nil {
			errs = append(errs, c.Close())
		}
	}
	return errors.Join(errs...)
}

// loadKernel loads the production program and maps; tests replace it to make the
// load fail.
var loadKernel = loadKernelObjects

// loadKernelObjects loads the program and the maps it uses from the bpf2go spec.
func loadKernelObjects() (*kernelObjects, error) {
	// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK; later ones ignore it.
	_ = rlimit.RemoveMemlock()
	spec, err := loadFilter()
	if err != nil {
		return nil, fmt.Errorf("rrl: filter spec: %w", err)
	}
	var objs kernelObjects
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			if missing := missingHelper(); missing != nil {
				return nil, notSupportedError("rrl: load eBPF filter", missing)
			}
			// unprivileged_bpf_disabled 0 lets a process without CAP_BPF try:
			// the verifier then refuses the helpers and maps the program needs.
			if !effectiveCap(unix.CAP_BPF) && !effectiveCap(unix.CAP_SYS_ADMIN) {
				return nil, permissionError("rrl: load eBPF filter", err)
			}
		}
		return nil, loadError("rrl: load eBPF filter", err)
	}
	return &objs, nil
}

// effectiveCap reports whether capability c is in the process's effective set, true when
// the set cannot be read.
func effectiveCap(c int) bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return true
	}
	return data[c/32].Effective&(1<<(c%32)) != 0
}

// requiredHelpers are the helpers of the program that not every kernel this
// package builds for has, newest first.
var requiredHelpers = []asm.BuiltinFunc{
	asm.FnKtimeGetCoarseNs, // Linux 5.11
	asm.FnJiffies64,        // Linux 5.5
	asm.FnSkbLoadBytesRelative,
}

// missingHelper names the first helper the program needs that the kernel lacks for
// socket filters, or returns nil. The verifier rejects such a program like an unsafe
// one; probing tells an old kernel from a bug.
func missingHelper() error {
	for _, fn := range requiredHelpers {
		if err := features.HaveProgramHelper(ebpf.SocketFilter, fn); errors.Is(err, ebpf.ErrNotSupported) {
			return fmt.Errorf("the kernel lacks the helper %s for socket filters: %w", fn, err)
		}
	}
	return nil
}

func randomSeed() (uint64, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return 0, fmt.Errorf("rrl: seed: %w", err)
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

// Indexes of struct counters in bpf/counters.h (enum counter).
const (
	counterSeen = iota
	counterPassed
	counterDropUnfollowed
	counterDropShort
	counterDropResponse
	counterDropReflection
	counterExempt
	counterReportOnly
	counterError
	counterLimited0 // the first of numLimited: see limitedCounter
)

// The cookie counters follow the limited ones (enum counter).
const (
	counterCookiePassed = counterLimited0 + numLimited + iota
	counterCookieInvalid
	counterSlipped
	counterNamesKnown
	counterNamesUnknown
	counterNamesLimited
	counterNamesUnknownPassed
	counterMax
)

// numLimited is the number of limited counters: one for every IPv4 and IPv6 prefix
// length, the port node and the total node (NUM_LIMITED in bpf/counters.h).
const numLimited = 33 + 129 + 2

// The counters struct generated from filter_bpf.c must have one slot per counter.
var _ [counterMax]struct{} = [len(filterCounters{}.Value)]struct{}{}

// limitedCounter returns which limited counter (counterLimited0 + i) counts the
// packets node limited: IPv4 prefix lengths first, then IPv6 ones, then the port
// and total nodes.
func limitedCounter(node LimiterNode) uint32 {
	plen := uint32(node & 0xff)
	switch node &^ 0xff {
	case nodeTagIPv4:
		return min(plen, 32)
	case nodeTagIPv6:
		return 33 + min(plen, 128)
	case NodePort:
		return 33 + 129
	}
	return 33 + 129 + 1
}

// limitedNode is the node whose limited counter is i: the inverse of
// limitedCounter.
func limitedNode(i uint32) LimiterNode {
	switch {
	case i <= 32:
		return nodeTagIPv4 | LimiterNode(i)
	case i < 33+129:
		return nodeTagIPv6 | LimiterNode(i-33)
	case i == 33+129:
		return NodePort
	}
	return NodeTotal
}

// sumCounters reads the program's per-CPU counters (rrl_counters) and returns their
// sums over CPUs, indexed by the counter* constants.
func sumCounters(counters *ebpf.Map) ([counterMax]uint64, error) {
	var perCPU []filterCounters
	return sumCountersInto(counters, &perCPU)
}

// sumCountersInto is sumCounters reading the per-CPU values into *perCPU, made once
// and reused by a caller that reads them often (the capacity controller, every
// sample): the library then allocates no slice of its own for them.
func sumCountersInto(counters *ebpf.Map, perCPU *[]filterCounters) ([counterMax]uint64, error) {
	var sum [counterMax]uint64
	if *perCPU == nil {
		n, err := ebpf.PossibleCPU()
		if err != nil {
			return sum, err
		}
		*perCPU = make([]filterCounters, n)
	}
	if err := counters.Lookup(uint32(0), *perCPU); err != nil {
		return sum, err
	}
	for _, c := range *perCPU {
		for i, v := range c.Value {
			sum[i] += v
		}
	}
	return sum, nil
}
