//go:build linux

package rrl

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"net/netip"
	"sync"
	"syscall"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/rlimit"
	"github.com/dnsrake/rrl/internal/sockopt"
	"golang.org/x/sys/unix"
)

// layoutVersion identifies the layout of the filter's maps; filter_bpf.c's
// LAYOUT_VERSION is the same number.
const layoutVersion = 6

// Filter is the kernel side of rrl on one or more UDP sockets: the eBPF request
// limiter (ModeEBPF) or, where eBPF may not be loaded, the classic-BPF prefilter
// (ModeClassic). Every socket attached through one Filter shares its limits and
// sketches, so the sockets of a SO_REUSEPORT group hold one limit together.
//
// Its maps take about 800 KiB of kernel memory whatever the traffic: the sketches
// (768 KiB), the settings (8.3 KiB, mostly the reflection-port bitmap), per-CPU
// counters and two small exempt-prefix tries.
//
// A Filter is safe for concurrent use.
type Filter struct {
	mu      sync.Mutex
	mode    FilterMode
	cfg     *Config
	seed    uint64
	objs    *kernelObjects
	sockets []syscall.Conn
	pin     *pinState      // opened from pins (pin.go): Close leaves the pins in place
	cookies *kernelCookies // the secrets of UseCookies (kernelcookie.go)
}

// kernelObjects are the program and maps production loads: test-only programs and
// maps in filter_bpf.c stay out of the kernel.
type kernelObjects struct {
	Program  *ebpf.Program `ebpf:"rrl_filter"`
	Cells    *ebpf.Map     `ebpf:"rrl_cells"`
	Settings *ebpf.Map     `ebpf:"rrl_settings"`
	Counters *ebpf.Map     `ebpf:"rrl_counters"`
	Exempt4  *ebpf.Map     `ebpf:"rrl_exempt4"`
	Exempt6  *ebpf.Map     `ebpf:"rrl_exempt6"`
	// The server cookie secrets (kernelcookie.go); nil for a pinned filter opened
	// without write access to them. The lookup's per-CPU scratch map is only the
	// program's: the loader creates it, and the program holds it.
	CookieSecrets *ebpf.Map `ebpf:"rrl_cookie_secrets"`
}

func (o *kernelObjects) Close() error {
	var errs []error
	for _, c := range []interface{ Close() error }{o.Program, o.Cells, o.Settings, o.Counters, o.Exempt4, o.Exempt6, o.CookieSecrets} {
		if c != nil {
			errs = append(errs, c.Close())
		}
	}
	return errors.Join(errs...)
}

// Attach protects conn, a UDP socket (*net.UDPConn, or anything with SyscallConn),
// with the eBPF filter configured by cfg (nil means NewConfig()).
//
// When the kernel refuses to load eBPF (no CAP_BPF), Attach still attaches the
// classic-BPF prefilter and returns the Filter together with an error for which
// errors.Is(err, ErrNotPermitted) holds: a caller that only logs the error keeps the
// stateless protection, and Mode reports ModeClassic. The request limits then have
// to be enforced in Go: make a Limiter from the same Config and discard every packet
// for which Limiter.Allow(source) is false, right after reading it. The error says
// how to get the eBPF filter instead: grant CAP_BPF (setcap cap_bpf+ep), attach
// before dropping privileges (the attached filter keeps working), or attach objects
// a privileged step pinned (AttachPinned).
//
// When the socket's option memory (net.core.optmem_max) cannot hold the eBPF program,
// Attach likewise falls back to the classic prefilter and returns an error for which
// errors.Is(err, ErrOptMem) holds, naming the setting to raise.
//
// In report-only mode the filter counts what it would drop (FilterStats.ReportOnly
// and the per-reason counters) and passes everything.
func Attach(conn syscall.Conn, cfg *Config) (*Filter, error) {
	if cfg == nil {
		cfg = NewConfig()
	}
	f := &Filter{cfg: cfg.clone()}
	objs, err := loadKernelObjects()
	if err != nil {
		if !errors.Is(err, ErrNotPermitted) {
			return nil, err
		}
		if cerr := applyClassic(conn, f.cfg); cerr != nil {
			return nil, errors.Join(err, fmt.Errorf("classic fallback: %w", cerr))
		}
		f.mode = ModeClassic
		f.sockets = append(f.sockets, conn)
		return f, err
	}
	f.objs = objs
	f.mode = ModeEBPF
	if f.seed, err = randomSeed(); err == nil {
		err = f.writeSettings(f.cfg)
	}
	if err == nil {
		err = f.attachEBPF(conn)
	}
	if err != nil {
		objs.Close()
		f.objs = nil
		if !errors.Is(err, ErrOptMem) {
			return nil, err
		}
		// The socket's option memory cannot hold the eBPF program: keep the
		// stateless protection, which takes a few hundred bytes.
		if cerr := applyClassic(conn, f.cfg); cerr != nil {
			return nil, errors.Join(err, fmt.Errorf("classic fallback: %w", cerr))
		}
		f.mode = ModeClassic
		f.sockets = append(f.sockets[:0], conn)
		return f, err
	}
	return f, nil
}

func loadKernelObjects() (*kernelObjects, error) {
	// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK; later ones ignore it.
	_ = rlimit.RemoveMemlock()
	spec, err := loadFilter()
	if err != nil {
		return nil, fmt.Errorf("rrl: filter spec: %w", err)
	}
	var objs kernelObjects
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		return nil, loadError("rrl: load eBPF filter", err)
	}
	return &objs, nil
}

func randomSeed() (uint64, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return 0, fmt.Errorf("rrl: seed: %w", err)
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

func (f *Filter) attachEBPF(conn syscall.Conn) error {
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
	f.sockets = append(f.sockets, conn)
	return nil
}

// Attach adds another socket, typically one more of a SO_REUSEPORT group, to f: it
// shares f's limits and sketches.
func (f *Filter) Attach(conn syscall.Conn) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch f.mode {
	case ModeEBPF:
		return f.attachEBPF(conn)
	case ModeClassic:
		if err := applyClassic(conn, f.cfg); err != nil {
			return err
		}
		f.sockets = append(f.sockets, conn)
		return nil
	}
	return ErrClosed
}

// Update applies cfg to the running filter without losing its sketches: limits,
// levels, report-only, exempt-clients and reflection ports change at once for every
// attached socket.
func (f *Filter) Update(cfg *Config) error {
	if cfg == nil {
		cfg = NewConfig()
	}
	cfg = cfg.clone()
	f.mu.Lock()
	defer f.mu.Unlock()
	switch f.mode {
	case ModeEBPF:
		if err := f.writeSettings(cfg); err != nil {
			return err
		}
	case ModeClassic:
		for _, s := range f.sockets {
			if err := applyClassic(s, cfg); err != nil {
				return err
			}
		}
	default:
		return ErrClosed
	}
	f.cfg = cfg
	return nil
}

// Mode reports which filter is attached.
func (f *Filter) Mode() FilterMode {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mode
}

// Close detaches the filter from every socket it was attached to and frees its
// programs and maps (for a pinned filter: closes this process's descriptors, and
// the pins keep the program and maps). Closing twice is harmless.
func (f *Filter) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var errs []error
	f.stopCookies()
	for _, s := range f.sockets {
		if err := detachFilter(s); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EBADF) {
			errs = append(errs, err)
		}
	}
	f.sockets = nil
	if f.objs != nil {
		errs = append(errs, f.objs.Close())
		f.objs = nil
	}
	if f.pin != nil && f.pin.config != nil {
		errs = append(errs, f.pin.config.Close())
		f.pin.config = nil
	}
	f.mode = ModeNone
	return errors.Join(errs...)
}

// applyClassic puts the classic prefilter for cfg on conn; in report-only mode,
// where nothing may be withheld and the classic filter has no counters, it removes
// any filter instead.
func applyClassic(conn syscall.Conn, cfg *Config) error {
	if cfg.reportOnly {
		if err := detachFilter(conn); err != nil && !errors.Is(err, unix.ENOENT) {
			return err
		}
		return nil
	}
	return attachClassic(conn, cfg)
}

// latticeOf returns the Go Limiter's parameters for cfg: the kernel reads every
// node's limit, trip count and prefix length from its settings map, taken from them
// so that the two cannot disagree. SetValue only makes valid Configs; an invalid
// one limits nothing (every limit 0).
func latticeOf(cfg *Config) *limiterParams {
	p, err := newLimiterParams(cfg)
	if err != nil {
		return &limiterParams{}
	}
	return p
}

// step is node n's entry in the kernel's settings, without its key masks.
func (p *limiterParams) step(n int) filterStep {
	return filterStep{
		Trip:  uint64(p.trip[n]),
		Limit: uint64(p.limit[n]),
		Node:  uint32(n),
	}
}

// Each family has room for all its levels plus the port and total nodes.
var _ [maxRequestLevel + 2]filterStep = filterSettings{}.Step[0]

// steps returns the active steps of a family: 0 IPv6, 1 IPv4.
func (s *filterSettings) steps(fam int) []filterStep {
	return s.Step[fam][:min(int(s.Steps[fam]), len(s.Step[fam]))]
}

// activeNodes returns the step of every node the settings activate, in node order:
// IPv4 levels, IPv6 levels, port, total.
func (s *filterSettings) activeNodes() []filterStep {
	var byNode [numNodes]*filterStep
	for fam := range s.Step {
		for i, st := range s.steps(fam) {
			if int(st.Node) < numNodes {
				byNode[st.Node] = &s.Step[fam][i]
			}
		}
	}
	var out []filterStep
	for _, st := range byNode {
		if st != nil {
			out = append(out, *st)
		}
	}
	return out
}

// prefix is the prefix length of a level step's key (0 for the port and total
// nodes).
func (st *filterStep) prefix() uint8 {
	return uint8(bits.OnesCount64(st.MaskHi) + bits.OnesCount64(st.MaskLo))
}

// kernelSettings builds the settings map value for cfg.
func kernelSettings(cfg *Config, seed uint64) *filterSettings {
	s := &filterSettings{LayoutVersion: layoutVersion, Seed: seed, SeedMix0: mix64(seed), TickNs: coarseTick()}
	if cfg.reportOnly {
		s.ReportOnly = 1
	}
	lat := latticeOf(cfg)
	// The C program indexes steps by "is IPv4": [0] IPv6, [1] IPv4.
	for fam, first := range [2]int{nodeIPv6First, nodeIPv4First} {
		var steps []filterStep
		for i := range min(lat.levels[1-fam], maxRequestLevel) {
			n := first + i
			st := lat.step(n)
			if fam == 1 {
				st.MaskLo = maskIPv4(math.MaxUint32, lat.prefix[n])
			} else {
				st.MaskHi, st.MaskLo = maskIPv6(math.MaxUint64, math.MaxUint64, lat.prefix[n])
			}
			steps = append(steps, st)
		}
		if lat.limit[nodePort] != 0 {
			st := lat.step(nodePort)
			st.PortMask = math.MaxUint16
			steps = append(steps, st)
		}
		if lat.limit[nodeTotal] != 0 {
			steps = append(steps, lat.step(nodeTotal))
		}
		s.Steps[fam] = uint32(copy(s.Step[fam][:], steps))
	}
	for _, p := range cfg.exempt {
		if p.Addr().Is4() {
			s.HasExempt4 = 1
		} else {
			s.HasExempt6 = 1
		}
	}
	for _, p := range cfg.reflectionPorts {
		s.ReflectionPorts[p>>6] |= 1 << (p & 63)
		s.ReflectionBlocks |= 1 << (p >> 10)
	}
	return s
}

// coarseTick returns the resolution of CLOCK_MONOTONIC_COARSE, which is the length
// of a jiffy: the program counts jiffies and needs it to turn them into nanoseconds.
// 0 (unknown) makes the program read the coarse clock itself on every packet.
var coarseTick = sync.OnceValue(func() uint64 {
	var res unix.Timespec
	if err := unix.ClockGetres(unix.CLOCK_MONOTONIC_COARSE, &res); err != nil || res.Nano() <= 0 {
		return 0
	}
	return uint64(res.Nano())
})

func (f *Filter) writeSettings(cfg *Config) error {
	if f.pin != nil {
		if err := f.pin.checkWritable(); err != nil {
			return err
		}
	}
	if err := f.objs.Settings.Put(uint32(0), kernelSettings(cfg, f.seed)); err != nil {
		return fmt.Errorf("rrl: write settings: %w", err)
	}
	if err := replaceExempt(f.objs.Exempt4, f.objs.Exempt6, cfg.exempt); err != nil {
		return fmt.Errorf("rrl: write exempt-clients: %w", err)
	}
	if f.pin != nil {
		return f.pin.saveConfig(cfg)
	}
	return nil
}

// replaceExempt makes the exempt tries hold exactly prefixes.
func replaceExempt(m4, m6 *ebpf.Map, prefixes []netip.Prefix) error {
	want4 := map[filterExempt4Key]bool{}
	want6 := map[filterExempt6Key]bool{}
	for _, p := range prefixes {
		if p.Addr().Is4() {
			want4[filterExempt4Key{Prefixlen: uint32(p.Bits()), Addr: p.Addr().As4()}] = true
		} else {
			want6[filterExempt6Key{Prefixlen: uint32(p.Bits()), Addr: p.Addr().As16()}] = true
		}
	}
	if len(want4) > int(m4.MaxEntries()) || len(want6) > int(m6.MaxEntries()) {
		return fmt.Errorf("more than %d exempt prefixes per family", m4.MaxEntries())
	}
	if err := syncTrie(m4, want4); err != nil {
		return err
	}
	return syncTrie(m6, want6)
}

func syncTrie[K comparable](m *ebpf.Map, want map[K]bool) error {
	var k K
	var stale []K
	var v uint8
	it := m.Iterate()
	for it.Next(&k, &v) {
		if !want[k] {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return err
	}
	for _, k := range stale {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return err
		}
	}
	for k := range want {
		if err := m.Put(k, uint8(1)); err != nil {
			return err
		}
	}
	return nil
}
