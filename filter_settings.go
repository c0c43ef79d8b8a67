//go:build linux

package rrl

// The filter's settings are double-buffered (struct settings in bpf/settings.h): entry 0
// of rrl_settings is a header naming the slot in force, entries 1 and 2 are the
// slots, and the exempt tries hold each slot's prefixes under that slot's number. A
// change is written into the slot not in force and then takes effect with a single
// one-byte write, the header's slot, so that every packet is judged by one whole
// configuration, the old or the new.
//
// The program runs under RCU (socket filters are called inside rcu_read_lock), and a
// run lasts well under a microsecond, so once a grace period has passed after a flip
// no packet can still be reading the slot that went out of force; only then is that
// slot written again. The kernel offers user space no way to wait for an RCU grace
// period on a map write, so a writer waits settingsGrace after the header's
// flipped_ns instead: a thousand times longer than any run, and paid only by an
// Update that follows another within that time.

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"net/netip"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

const (
	// settingsHeaderKey is the key of the header in rrl_settings; slot i is key 1+i.
	settingsHeaderKey = 0
	// settingsGrace is how long after a flip the slot that went out of force stays
	// untouched (see above).
	settingsGrace = 10 * time.Millisecond
	// exemptPerSlot is how many exempt-clients prefixes of one family a
	// configuration may have: the tries hold two slots' worth.
	exemptPerSlot = 1024
)

// applyMu serialises apply in this process, also between Filters on the same pins.
var applyMu sync.Mutex

// errConcurrentUpdate: another process flipped the settings while this one wrote
// its slot.
var errConcurrentUpdate = errors.New("the filter's settings were changed by another process during this update; try again")

// settingsMaps are the maps one configuration is written to.
type settingsMaps struct {
	settings, exempt4, exempt6 *ebpf.Map
}

func (o *kernelObjects) settingsMaps() settingsMaps {
	return settingsMaps{o.Settings, o.Exempt4, o.Exempt6}
}

// header reads the header entry.
func (m settingsMaps) header() (*filterSettings, error) {
	var h filterSettings
	if err := m.settings.Lookup(uint32(settingsHeaderKey), &h); err != nil {
		return nil, fmt.Errorf("rrl: read settings header: %w", err)
	}
	return &h, nil
}

// active returns the slot in force and the header it was read under. read, when not
// nil, reads more state that belongs with the slot (the pinned Config text), with the
// same guarantee: all of it belongs to one configuration. A writer flips the header
// before it rewrites a slot, so a read that saw the same generation before and after
// saw no write to its slot.
func (m settingsMaps) active(read func(slot uint8) error) (*filterSettings, *filterSettings, error) {
	for range 100 {
		h, err := m.header()
		if err != nil {
			return nil, nil, err
		}
		slot := h.Slot & 1
		var s filterSettings
		if err := m.settings.Lookup(uint32(1+slot), &s); err != nil {
			return nil, nil, fmt.Errorf("rrl: read settings: %w", err)
		}
		if read != nil {
			if err := read(slot); err != nil {
				return nil, nil, err
			}
		}
		h2, err := m.header()
		if err != nil {
			return nil, nil, err
		}
		if h2.Generation == h.Generation && h2.Slot == h.Slot {
			return &s, h, nil
		}
	}
	return nil, nil, errors.New("rrl: read settings: changing faster than they can be read")
}

// checkKernelConfig reports why cfg cannot be written to the kernel, nil if it can.
func checkKernelConfig(cfg *Config) error {
	if _, err := newLimiterParams(cfg); err != nil {
		return err
	}
	e4, e6 := exemptKeys(0, cfg.exempt)
	if len(e4) > exemptPerSlot || len(e6) > exemptPerSlot {
		return fmt.Errorf("rrl: exempt-clients: %d IPv4 and %d IPv6 prefixes, the filter holds at most %d per family", len(e4), len(e6), exemptPerSlot)
	}
	return nil
}

// apply makes cfg the configuration in force: it writes cfg into the slot not in
// force and its exempt prefixes, calls beforeFlip (nil: none) with that slot, and
// flips the header to it. Until the flip nothing packets read has changed, so an
// error from any step leaves the old configuration in force. cfg must have passed
// checkKernelConfig.
func (m settingsMaps) apply(cfg *Config, seed uint64, beforeFlip func(slot uint8) error) error {
	applyMu.Lock()
	defer applyMu.Unlock()
	h, err := m.header()
	if err != nil {
		return err
	}
	next := uint8(0)
	if h.LayoutVersion != 0 {
		// Not a fresh map: write the other slot, once no packet can be reading it.
		next = 1 - h.Slot&1
		wait := time.Duration(int64(h.FlippedNs)-monotonicNow()) + settingsGrace
		time.Sleep(min(wait, settingsGrace))
	}
	s := kernelSettings(cfg, seed)
	s.Slot = next
	if err := m.settings.Put(uint32(1+next), s); err != nil {
		return fmt.Errorf("rrl: write settings: %w", err)
	}
	if err := replaceExempt(m.exempt4, m.exempt6, next, cfg.exempt); err != nil {
		return fmt.Errorf("rrl: write exempt-clients: %w", err)
	}
	if beforeFlip != nil {
		if err := beforeFlip(next); err != nil {
			return err
		}
	}
	if h.LayoutVersion != 0 {
		now, err := m.header()
		if err != nil {
			return err
		}
		if now.Generation != h.Generation {
			return fmt.Errorf("rrl: write settings: %w", errConcurrentUpdate)
		}
	}
	flip := filterSettings{LayoutVersion: layoutVersion, Slot: next, Generation: h.Generation + 1, FlippedNs: uint64(monotonicNow())}
	if err := m.settings.Put(uint32(settingsHeaderKey), &flip); err != nil {
		return fmt.Errorf("rrl: write settings header: %w", err)
	}
	return nil
}

// monotonicNow reads CLOCK_MONOTONIC, which every process reads alike.
func monotonicNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0
	}
	return ts.Nano()
}

// exemptKeys returns the exempt tries' keys of prefixes in slot, one per distinct
// prefix.
func exemptKeys(slot uint8, prefixes []netip.Prefix) (map[filterExempt4Key]bool, map[filterExempt6Key]bool) {
	want4 := map[filterExempt4Key]bool{}
	want6 := map[filterExempt6Key]bool{}
	for _, p := range prefixes {
		p = p.Masked()
		// The slot byte precedes the address: it counts 8 bits of the prefix.
		plen := uint32(8 + p.Bits())
		if p.Addr().Is4() {
			want4[filterExempt4Key{Prefixlen: plen, Slot: slot, Addr: p.Addr().As4()}] = true
		} else {
			want6[filterExempt6Key{Prefixlen: plen, Slot: slot, Addr: p.Addr().As16()}] = true
		}
	}
	return want4, want6
}

// replaceExempt makes slot's entries in the exempt tries exactly prefixes, leaving
// the other slot's entries alone.
func replaceExempt(m4, m6 *ebpf.Map, slot uint8, prefixes []netip.Prefix) error {
	want4, want6 := exemptKeys(slot, prefixes)
	if len(want4) > exemptPerSlot || len(want6) > exemptPerSlot {
		return fmt.Errorf("more than %d exempt prefixes per family", exemptPerSlot)
	}
	if err := syncTrie(m4, want4, func(k filterExempt4Key) bool { return k.Slot == slot }); err != nil {
		return err
	}
	return syncTrie(m6, want6, func(k filterExempt6Key) bool { return k.Slot == slot })
}

// syncTrie deletes the keys of m that mine claims and want does not list, then puts
// every key of want.
func syncTrie[K comparable](m *ebpf.Map, want map[K]bool, mine func(K) bool) error {
	var k K
	var stale []K
	var v uint8
	it := m.Iterate()
	for it.Next(&k, &v) {
		if mine(k) && !want[k] {
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
	lat := latticeOf(cfg)
	s := &filterSettings{LayoutVersion: layoutVersion, Seed: seed, SeedMix0: mix64(seed), TickNs: coarseTick(),
		// The names judge (docs/names.md): on as the Go Limiter's (the names
		// keyword, on by default with capacity), keyed by the same seed, with
		// the level the capacity controller wrote into cfg (namesLevel; none:
		// fixedMax, nothing limited), exactly the Limiter's limit and trip.
		NameSeed: nameSeed(seed), NamesLimit: uint64(lat.names.limit), NamesTrip: uint64(lat.names.trip)}
	if lat.names.on {
		s.NamesOn = 1
	} else {
		s.NamesLimit, s.NamesTrip = uint64(fixedMax), uint64(tripCount(fixedMax))
	}
	if cfg.reportOnly {
		s.ReportOnly = 1
	}
	s.SlipRatio = uint32(cfg.slipRatio)
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
		for i := range steps {
			steps[i].Limited = limitedCounter(steps[i].limiterNode())
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

// limiterNode names the node a step judges: a level by its family and prefix
// length, as the kernel's masks give it, or the port or total node.
func (st *filterStep) limiterNode() LimiterNode {
	switch node := int(st.Node); {
	case node < nodeIPv6First:
		return nodeTagIPv4 | LimiterNode(st.prefix())
	case node < nodePort:
		return nodeTagIPv6 | LimiterNode(st.prefix())
	case node == nodePort:
		return NodePort
	}
	return NodeTotal
}
