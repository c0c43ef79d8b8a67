package rrl

import (
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// A Limiter is the per-source request limiter in Go: the model of the kernel socket
// filter, and the limits a Protection applies where the eBPF filter is not in force.
// Allow tells whether the server should process a query from a source.
//
// Sources are grouped at several levels (each prefix level of the source's family,
// the source port, and all sources together), each with a limit in packets per
// second. Every packet counts at all its levels and passes with probability
// min(1, limit/rate) over them, so a group over its limit is trimmed to the limit
// rather than cut off, and traffic outside it is untouched. Rates are estimated in
// fixed-size sketches (768 KiB per Limiter, no per-source state). docs/request-limiter.md
// has the details.
//
// All methods are safe for concurrent use. Create a Limiter with NewLimiter; the zero
// value is not usable.
type Limiter struct {
	seedv  uint64
	mix0   uint64 // mix64(seedv): the first step of sketchHash when hi is 0
	mix00  uint64 // mix64(mix0): sketchHash of the key 0, 0 (the total node)
	sketch *[numNodes]countMin
	params atomic.Pointer[limiterParams]
	events atomic.Pointer[groupTracker] // nil when the Config sets no EventFunc
	// capacity is the controller setting the water level, for Stats (capacity_go.go).
	capacity atomic.Pointer[capacityRun]
	// names is the names judge's state (limiter_names.go), nil until a Config
	// turns it on.
	names atomic.Pointer[limiterNames]
	start time.Time
	stats [statShards]statShard

	updateMu sync.Mutex // serialises Update
}

// limiterParams is everything a Config sets, swapped atomically by Update.
type limiterParams struct {
	limit      [numNodes]fixed
	trip       [numNodes]fixed // tripCount(limit): below it every draw passes
	prefix     [numNodes]int
	name       [numNodes]LimiterNode
	levels     [2]int // active level nodes of IPv4 (nodes 0..levels[0]-1) and IPv6
	exempt     prefixSet
	reportOnly bool
	capacity   capacityParams // capacity.go
	names      namesParams    // limiter_names.go
}

// statShards spreads the counters over cache lines so that CPUs judging packets at
// the same time do not all write one line.
const statShards = 8

type statShard struct {
	judged  [2]atomic.Uint64 // IPv4, IPv6
	exempt  atomic.Uint64
	proven  atomic.Uint64 // passed on a valid server cookie (allowProven)
	report  atomic.Uint64 // limited, but passed because of report-only
	limited [numNodes]atomic.Uint64
	// The names judge's counts (docs/names.md): queries classified known and
	// unknown, unknown ones it refused, and unknown ones finally passed.
	namesKnown, namesUnknown, namesLimited, unknownPassed atomic.Uint64
	_                                                     [(128 - (9+numNodes)*8%128) % 128]byte // to a multiple of the cache line
}

// limiterVerdict is the outcome of judging one packet.
type limiterVerdict struct {
	// Allowed reports whether the server should process the packet. It is always
	// true in report-only mode.
	Allowed bool
	// Limited is the node that limited the packet: the first, finest first, whose
	// limit the draw exceeded. NodeNone when the packet was within every limit. In
	// report-only mode it says which node would have dropped the packet.
	Limited LimiterNode
	// Exempt reports that the source is in exempt-clients: passed, not counted.
	Exempt bool

	node int8 // sketch index of Limited, -1 for none
}

// NewLimiter returns a Limiter enforcing cfg's request limits (requests-per-second,
// the request levels, source-port-factor, total-requests-per-second, exempt-clients
// and report-only). Later changes to cfg do not affect it; see Update. Its hash seed
// is random, so no one can predict which groups share sketch cells. With
// requests-per-second and total-requests-per-second both 0 every packet passes.
func NewLimiter(cfg *Config) (*Limiter, error) {
	var b [8]byte
	if _, err := crand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("rrl: limiter seed: %w", err)
	}
	return newLimiterSeed(cfg, binary.LittleEndian.Uint64(b[:]))
}

// newLimiterSeed is NewLimiter with a chosen hash seed, for tests and for checking
// the kernel program against the model.
func newLimiterSeed(cfg *Config, seed uint64) (*Limiter, error) {
	p, err := newLimiterParams(cfg)
	if err != nil {
		return nil, err
	}
	l := &Limiter{seedv: seed, mix0: mix64(seed), mix00: mix64(mix64(seed)), start: time.Now()}
	l.sketch = new([numNodes]countMin)
	l.params.Store(p)
	l.namesState(p)
	l.events.Store(newGroupTracker(cfg, l))
	return l, nil
}

var errNilConfig = errors.New("rrl: nil Config")

func newLimiterParams(cfg *Config) (*limiterParams, error) {
	if cfg == nil {
		return nil, errNilConfig
	}
	p := &limiterParams{reportOnly: cfg.reportOnly}
	for _, e := range cfg.exempt {
		if !e.IsValid() {
			return nil, fmt.Errorf("rrl: exempt-clients: invalid prefix %v", e)
		}
	}
	p.exempt = newPrefixSet(cfg.exempt)
	for fam, first := range [2]int{nodeIPv4First, nodeIPv6First} {
		levels := cfg.requestLevels(fam == 0)
		if len(levels) > maxRequestLevel {
			return nil, fmt.Errorf("rrl: %d request levels, at most %d per family", len(levels), maxRequestLevel)
		}
		bitLen, tag := 32, nodeTagIPv4
		if fam == 1 {
			bitLen, tag = 128, nodeTagIPv6
		}
		for i, lv := range levels {
			if lv.PrefixLen < 0 || lv.PrefixLen > bitLen {
				return nil, fmt.Errorf("rrl: request level /%d out of range", lv.PrefixLen)
			}
			n := first + i
			// A positive limit too small for a fixed is the smallest one, not 0 (off).
			p.limit[n] = max(fixedFromFloat(lv.Limit), 1)
			p.prefix[n] = lv.PrefixLen
			p.name[n] = tag | LimiterNode(lv.PrefixLen)
		}
		p.levels[fam] = len(levels)
	}
	p.limit[nodePort] = fixedFromFloat(cfg.requestsPerSecond * cfg.sourcePortFactor)
	p.name[nodePort] = NodePort
	p.limit[nodeTotal] = fixedFromFloat(cfg.totalRequests)
	p.name[nodeTotal] = NodeTotal
	p.initCapacity(cfg) // capacity.go
	p.initNames(cfg)    // limiter_names.go
	for n, limit := range p.limit {
		p.trip[n] = tripCount(limit)
	}
	return p, nil
}

// Update replaces the Limiter's settings with cfg's, keeping the measured rates: a
// node whose prefix length stays the same keeps its sketch; one whose prefix length
// changes (including when a level is added or removed before it) starts empty.
// It is safe to call while packets are being judged.
func (l *Limiter) Update(cfg *Config) error {
	p, err := newLimiterParams(cfg)
	if err != nil {
		return err
	}
	l.updateMu.Lock()
	defer l.updateMu.Unlock()
	old := l.params.Load()
	p.keepLevel(old) // capacity.go: the water level in force stays
	if p.names.on && old.names.on {
		p.applyNamesLevel(old.names.level) // and the names level
	}
	if ln := l.namesState(p); ln != nil && p.names.on {
		ln.setZones(p.names.zones)
	}
	for n := range numNodes {
		if old.prefix[n] != p.prefix[n] || old.name[n] != p.name[n] {
			l.sketch[n].reset()
		}
	}
	l.params.Store(p)
	switch ev := l.events.Load(); {
	case cfg.eventFunc == nil:
		l.events.Store(nil)
		if ev != nil {
			ev.stopTicks()
		}
	case ev == nil:
		l.events.Store(newGroupTracker(cfg, l))
	default:
		ev.mu.Lock()
		ev.fn, ev.budget.perSec = cfg.eventFunc, cfg.eventsPerSec()
		ev.ticks.off = false // a Protection's Close may have stopped the timer; the next sweep arms it
		ev.mu.Unlock()
	}
	return nil
}

// Allow judges a query from src arriving now, using the process's monotonic clock at
// millisecond resolution (like the kernel filter's tick clock: a fraction of a percent
// of the estimator's time constant, and much cheaper to read than the precise clock)
// and a fast random source. It reports whether the server should process the query.
func (l *Limiter) Allow(src netip.AddrPort) bool {
	return l.decideAt(src, coarseNanos(), rand.Uint32()).Allowed
}

// allowAt judges a query from src arriving at now, in nanoseconds of a monotonic clock
// (the kernel filter's is CLOCK_MONOTONIC at tick resolution), with rand a uniform
// 32-bit random draw. Time that stands still or steps back counts the arrival without
// decaying anything; negative times count as 0.
func (l *Limiter) allowAt(src netip.AddrPort, now int64, rand uint32) bool {
	return l.decideAt(src, now, rand).Allowed
}

// decideAt is allowAt with the full verdict: which node limited the packet. A source
// that is not a valid address is passed uncounted.
func (l *Limiter) decideAt(src netip.AddrPort, now int64, rand uint32) limiterVerdict {
	return l.decideQueryAt(src, nil, false, now, rand)
}

// decideQueryAt judges a query from src arriving at now, with rand the packet's draw:
// its name q (nil: not read; see readName) by the names judge, then the source
// lattice, at the source's own address only when proven (a valid server cookie). A
// query the names judge refuses is not counted in the lattice (docs/names.md, "The
// rule").
func (l *Limiter) decideQueryAt(src netip.AddrPort, q *qname, proven bool, now int64, rand uint32) limiterVerdict {
	p := l.params.Load()
	addr := src.Addr().Unmap()
	st := &l.stats[rand%statShards]
	if !addr.IsValid() {
		return limiterVerdict{Allowed: true, node: -1}
	}
	if !p.exempt.empty() && p.exempt.contains(addr) {
		st.exempt.Add(1)
		return limiterVerdict{Allowed: true, Exempt: true, node: -1}
	}
	nv := namesNotJudged
	if q != nil && p.names.on {
		nv = l.judgeName(p, st, q, addr, uint64(max(now, 0)), rand)
		if nv == namesRefused {
			st.judged[familyIndex(addr)].Add(1)
			st.namesLimited.Add(1)
			if p.reportOnly {
				st.report.Add(1)
				st.unknownPassed.Add(1)
			}
			return limiterVerdict{Allowed: p.reportOnly, Limited: NodeNames, node: -1}
		}
	}
	var v limiterVerdict
	if proven {
		v = l.provenAt(p, st, src, addr, now, rand)
	} else {
		v = l.latticeAt(p, st, src, addr, now, rand)
	}
	if nv == namesUnknown && v.Allowed {
		st.unknownPassed.Add(1)
	}
	return v
}

// familyIndex is 0 for an IPv4 address, 1 for IPv6.
func familyIndex(addr netip.Addr) int {
	if addr.Is4() {
		return 0
	}
	return 1
}

// latticeAt judges a query from src, a valid address that is not exempt, in the
// source lattice.
func (l *Limiter) latticeAt(p *limiterParams, st *statShard, src netip.AddrPort, addr netip.Addr, now int64, rand uint32) limiterVerdict {
	// First the key hashes of the packet's active nodes, in order: its family's
	// levels, finest first, then the port and total nodes.
	var hs [maxRequestLevel + 2]uint64
	var ns [maxRequestLevel + 2]uint8
	k := 0
	if addr.Is4() {
		st.judged[0].Add(1)
		a4 := addr.As4()
		a := uint64(binary.BigEndian.Uint32(a4[:]))
		for i := range min(p.levels[0], maxRequestLevel) {
			n := nodeIPv4First + i
			// sketchHash(seed, 0, lo); with hi = 0 its first step is mix0.
			hs[k] = mix64(l.mix0 ^ maskIPv4(a, p.prefix[n]))
			ns[k] = uint8(n)
			k++
		}
	} else {
		st.judged[1].Add(1)
		a16 := addr.As16()
		hi, lo := binary.BigEndian.Uint64(a16[:8]), binary.BigEndian.Uint64(a16[8:])
		// sketchHash(seed, mhi, mlo), its first step shared by consecutive
		// levels with the same masked hi (all levels of /64 and longer).
		prevHi, h1 := hi, mix64(l.seedv^hi)
		for i := range min(p.levels[1], maxRequestLevel) {
			n := nodeIPv6First + i
			mhi, mlo := maskIPv6(hi, lo, p.prefix[n])
			if mhi != prevHi {
				prevHi, h1 = mhi, mix64(l.seedv^mhi)
			}
			hs[k] = mix64(h1 ^ mlo)
			ns[k] = uint8(n)
			k++
		}
	}
	if p.limit[nodePort] != 0 {
		hs[k], ns[k] = mix64(l.mix0^uint64(src.Port())), nodePort
		k++
	}
	if p.limit[nodeTotal] != 0 {
		hs[k], ns[k] = l.mix00, nodeTotal
		k++
	}
	// Then every node counts the arrival, and the first node whose limit the draw
	// exceeds (u*rate >= limit) decides.
	t := uint64(max(now, 0))
	u := fixed(rand) // the draw as a fraction in [0, 1)
	decider, dj, dc := -1, 0, fixed(0)
	for j := range k {
		n := ns[j]
		c := l.sketch[n].arrive(hs[j], t)
		if decider < 0 && c >= p.trip[n] && u.Mul(arrivalRate(c)) >= p.limit[n] {
			decider, dj, dc = int(n), j, c
		}
	}
	if ev := l.events.Load(); ev != nil {
		if decider >= 0 {
			ev.limited(decider, p.groupNode(decider), hs[dj], src, now, arrivalRate(dc))
		}
		ev.sweep(now)
	}
	if decider < 0 {
		return limiterVerdict{Allowed: true, node: -1}
	}
	return st.refuse(p, decider)
}

// refuse counts a packet node n of p refused (in report-only mode also as passed on
// report) and returns its verdict.
func (st *statShard) refuse(p *limiterParams, n int) limiterVerdict {
	st.limited[n].Add(1)
	if p.reportOnly {
		st.report.Add(1)
	}
	return limiterVerdict{Allowed: p.reportOnly, Limited: p.name[n], node: int8(n)}
}

// allowProven is Allow for a query whose valid server cookie proves its source
// address (the Handler, or the reader of a Protection's server, verified it).
func (l *Limiter) allowProven(src netip.AddrPort) bool {
	return l.decideProvenAt(src, coarseNanos(), rand.Uint32()).Allowed
}

// decideProvenAt is decideAt for a query with a valid server cookie, judged as the
// kernel program judges one (bpf/judge.h, judge): an exempt source passes
// uncounted; when the finest level of the source's family keys on the whole address
// (/32, /128), the query is counted and limited at that node only, not in the groups
// it shares and not at the port and total nodes; with no node at all for its family
// it passes uncounted; otherwise (a finest level coarser than the address, or no
// level but the port or total node) it is judged as a query without a cookie.
func (l *Limiter) decideProvenAt(src netip.AddrPort, now int64, rand uint32) limiterVerdict {
	return l.decideQueryAt(src, nil, true, now, rand)
}

// provenAt is latticeAt for a proven query (see decideProvenAt).
func (l *Limiter) provenAt(p *limiterParams, st *statShard, src netip.AddrPort, addr netip.Addr, now int64, rand uint32) limiterVerdict {
	fam, n, bitLen := 0, nodeIPv4First, 32
	if !addr.Is4() {
		fam, n, bitLen = 1, nodeIPv6First, 128
	}
	switch {
	case p.levels[fam] == 0 && p.limit[nodePort] == 0 && p.limit[nodeTotal] == 0:
		st.judged[fam].Add(1)
		st.proven.Add(1)
		return limiterVerdict{Allowed: true, node: -1}
	case p.levels[fam] == 0 || p.prefix[n] != bitLen:
		return l.latticeAt(p, st, src, addr, now, rand)
	}
	st.judged[fam].Add(1)
	var h uint64
	if fam == 0 {
		a4 := addr.As4()
		h = mix64(l.mix0 ^ uint64(binary.BigEndian.Uint32(a4[:])))
	} else {
		a16 := addr.As16()
		h = mix64(mix64(l.seedv^binary.BigEndian.Uint64(a16[:8])) ^ binary.BigEndian.Uint64(a16[8:]))
	}
	c := l.sketch[n].arrive(h, uint64(max(now, 0)))
	refused := c >= p.trip[n] && fixed(rand).Mul(arrivalRate(c)) >= p.limit[n]
	if ev := l.events.Load(); ev != nil {
		if refused {
			ev.limited(n, p.groupNode(n), h, src, now, arrivalRate(c))
		}
		ev.sweep(now)
	}
	if !refused {
		st.proven.Add(1)
		return limiterVerdict{Allowed: true, node: -1}
	}
	return st.refuse(p, n)
}

// maskIPv4 keeps the first bits bits of the IPv4 address a (its low 32 bits).
func maskIPv4(a uint64, bits int) uint64 {
	return a &^ (math.MaxUint32 >> bits)
}

// maskIPv6 keeps the first bits bits of the 128-bit address hi:lo.
func maskIPv6(hi, lo uint64, bits int) (uint64, uint64) {
	if bits >= 64 {
		return hi, lo &^ (math.MaxUint64 >> (bits - 64))
	}
	return hi &^ (math.MaxUint64 >> bits), 0
}

// Stats returns the Limiter's counters since it was made, as the kernel filter
// reports its own: Mode is ModeNone, and the counters of checks only the kernel
// makes (NotDNS, the Dropped* ones, Errors, CookieInvalid) stay 0, and Capacity is
// set only while a controller runs for the Limiter (a Protection's). Node counters
// are kept per node position, so after an Update that adds or removes levels a
// node's count includes what the level previously at its position limited.
func (l *Limiter) Stats() FilterStats {
	p := l.params.Load()
	c := l.counts()
	judged, limited := c.judged, c.limited
	s := FilterStats{Exempt: c.exempt, CookiePassed: c.proven, ReportOnly: c.report}
	s.Seen = judged[0] + judged[1] + s.Exempt
	s.Passed = s.Seen - c.refused + s.ReportOnly
	add := func(n int, packets uint64) {
		s.Nodes = append(s.Nodes, NodeStats{p.name[n], p.limit[n].Float64(), packets, limited[n]})
	}
	for i := range p.levels[0] {
		add(nodeIPv4First+i, judged[0])
	}
	for i := range p.levels[1] {
		add(nodeIPv6First+i, judged[1])
	}
	if p.limit[nodePort] != 0 {
		add(nodePort, judged[0]+judged[1])
	}
	if p.limit[nodeTotal] != 0 {
		add(nodeTotal, judged[0]+judged[1])
	}
	s.Capacity = l.capacity.Load().stats() // capacity_go.go
	if p.names.on {
		s.Names = &NameStats{Known: c.namesKnown, Unknown: c.namesUnknown, Limited: c.namesLimited, UnknownPassed: c.unknownPassed, Level: p.names.level}
	}
	return s
}

// limiterCounts are a Limiter's counters summed over its shards.
type limiterCounts struct {
	judged                 [2]uint64 // IPv4, IPv6
	exempt, proven, report uint64
	limited                [numNodes]uint64
	refused                uint64 // the sum of limited and namesLimited
	// The names judge's (statShard).
	namesKnown, namesUnknown, namesLimited, unknownPassed uint64
}

// counts sums the Limiter's counters.
func (l *Limiter) counts() limiterCounts {
	var c limiterCounts
	for i := range l.stats {
		sh := &l.stats[i]
		// A packet counts in judged (or exempt) before limited, and in limited
		// before report: read in the other order, no count runs ahead of the one
		// it is part of while packets are being judged.
		c.report += sh.report.Load()
		c.unknownPassed += sh.unknownPassed.Load()
		c.namesLimited += sh.namesLimited.Load()
		c.refused += sh.namesLimited.Load()
		c.namesUnknown += sh.namesUnknown.Load()
		c.namesKnown += sh.namesKnown.Load()
		for n := range c.limited {
			v := sh.limited[n].Load()
			c.limited[n] += v
			c.refused += v
		}
		c.proven += sh.proven.Load()
		c.exempt += sh.exempt.Load()
		c.judged[0] += sh.judged[0].Load()
		c.judged[1] += sh.judged[1].Load()
	}
	return c
}

// groupNode describes node n of p for a limiting event.
func (p *limiterParams) groupNode(n int) groupNode {
	return groupNode{name: p.name[n], limit: p.limit[n], prefixLen: p.prefix[n], reportOnly: p.reportOnly}
}

// groupRate returns a group's estimated rate and its node's limit now, for the
// event sweeps (groupSource).
func (l *Limiter) groupRate(n int, h uint64, t uint64) (rate, limit fixed) {
	return l.sketch[n].rate(h, t), l.params.Load().limit[n]
}

// following reports whether ev is the Limiter's event tracker (groupSource).
func (l *Limiter) following(ev *groupTracker) bool { return l.events.Load() == ev }

// memoryBytes returns the memory of the Limiter's sketches in bytes: 786,432
// (12 nodes x 2 rows x 2048 cells x 16 bytes), whatever the traffic.
func (l *Limiter) memoryBytes() int {
	return int(unsafe.Sizeof(*l.sketch))
}

// seed returns the hash seed (for loading the same seed into the kernel program).
func (l *Limiter) seed() uint64 { return l.seedv }

// cell returns one sketch cell of a node.
func (l *Limiter) cell(node, row int, col uint32) (count fixed, last uint64) {
	return l.sketch[node][row][col].load()
}

// nodeLimit returns a node's limit, 0 when the node is off.
func (l *Limiter) nodeLimit(node int) fixed { return l.params.Load().limit[node] }

// nodePrefix returns a node's prefix length (0 for the port and total nodes and for
// unused level nodes).
func (l *Limiter) nodePrefix(node int) int { return l.params.Load().prefix[node] }

// nodeIndex returns the sketch index of the node that limited the packet, -1 for none.
func (v limiterVerdict) nodeIndex() int { return int(v.node) }

// ---- The capacity mode's water level in the limits (capacity.go computes it) ----

// capacityParams are a limiter's capacity settings: the water level in force and,
// for every node it adjusts, its factor (0: not adjusted) and its limit without the
// water level (fixedMax for none).
type capacityParams struct {
	on     bool
	factor [numNodes]float64
	base   [numNodes]fixed
	level  float64 // 0 or +Inf: none
}

// initCapacity sets up the capacity mode for cfg (nothing when capacity is off) and
// puts cfg's water level (capLevel, set for the kernel's settings) in force. It runs
// before the trip counts are computed.
func (p *limiterParams) initCapacity(cfg *Config) {
	if cfg.capacity == 0 {
		return
	}
	c := &p.capacity
	c.on = true
	for fam, first := range [2]int{nodeIPv4First, nodeIPv6First} {
		own := 32
		if fam == 1 {
			own = 128
		}
		for i, lv := range cfg.requestLevels(fam == 0) {
			if i >= min(p.levels[fam], maxRequestLevel) {
				break
			}
			if i == 0 && lv.PrefixLen == own {
				continue // the level proven queries are judged in: static only
			}
			c.factor[first+i] = lv.Factor
		}
	}
	if cfg.sourcePortFactor > 0 {
		if p.limit[nodePort] == 0 {
			p.limit[nodePort] = fixedMax // counted, not limited
		}
		c.factor[nodePort] = cfg.sourcePortFactor
	}
	c.base = p.limit
	p.applyLevel(cfg.capLevel)
}

// applyLevel puts the water level in force: every adjusted node's limit becomes the
// smaller of its base and level times its factor; 0 or +Inf restores the bases. The
// trip counts must be computed afterwards (retrip).
func (p *limiterParams) applyLevel(level float64) {
	c := &p.capacity
	if !c.on {
		return
	}
	if !(level > 0) || math.IsInf(level, 1) {
		level = 0
	}
	c.level = level
	for n := range numNodes {
		limit := c.base[n]
		if f := c.factor[n]; f > 0 && level > 0 {
			// A positive limit too small for a fixed is the smallest one, not 0 (off).
			limit = min(limit, max(fixedFromFloat(level*f), 1))
		}
		p.limit[n] = limit
	}
}

// retrip recomputes the trip counts from the limits.
func (p *limiterParams) retrip() {
	for n, limit := range p.limit {
		p.trip[n] = tripCount(limit)
	}
}

// keepLevel carries the water level of old, the parameters an Update replaces, over
// to p, so that an Update during an overload does not lift the limits.
func (p *limiterParams) keepLevel(old *limiterParams) {
	if p.capacity.on && old.capacity.level > 0 {
		p.applyLevel(old.capacity.level)
		p.retrip()
	}
}

// setCapacityLevel puts the water level in force in l (0 or +Inf: none). It does
// nothing unless l's Config has capacity on.
func (l *Limiter) setCapacityLevel(level float64) {
	l.updateMu.Lock()
	defer l.updateMu.Unlock()
	old := l.params.Load()
	if !old.capacity.on {
		return
	}
	p := *old
	p.applyLevel(level)
	p.retrip()
	l.params.Store(&p)
}

// capacityPredict is how far ahead of the read the cells' estimates are taken: half
// a step, the middle of the time the level read now is in force.
const capacityPredict = capacityStepEvery / 2

// capacityNodes returns the nodes p's water level adjusts, with their cells read at
// now; cell reads one cell of a node's sketch (count and time, as cmCell holds them).
// A cell's rate is its arrivals since the previous read, when that was between 50 ms
// and a second ago (else its estimate), and its estimate is where the sketch's
// decaying count will be capacityPredict later at that rate.
func (p *limiterParams) capacityNodes(now uint64, cell func(node, row, col int) (fixed, uint64), s *capacityScratch) []capacityNode {
	s.nodes = s.nodes[:0]
	c := &p.capacity
	dt := int64(now) - int64(s.prevAt)
	useRate := s.prevAt > 0 && dt >= int64(50*time.Millisecond) && dt <= int64(time.Second)
	// Over dt, an arrival rate r adds r*tau*(1-d) to a count that decays by d, with
	// tau the estimator's time constant; an estimate e moves to r + (e-r)*ahead.
	tau := float64(halfLifeNanos) / math.Ln2 / 1e9
	d := math.Exp2(-float64(dt) / halfLifeNanos)
	gain := tau * (1 - d)
	ahead := math.Exp2(-float64(capacityPredict) / halfLifeNanos)
	for n := range numNodes {
		if c.factor[n] <= 0 {
			s.prev[n] = s.prev[n][:0]
			continue
		}
		cn := capacityNode{node: n, fam: 2, factor: c.factor[n], base: limitRate(c.base[n])}
		switch {
		case n < nodeIPv6First:
			cn.fam = 0
		case n < nodePort:
			cn.fam = 1
		}
		prev := s.prev[n]
		fresh := !useRate || len(prev) != sketchDepth*sketchWidth || s.name[n] != p.name[n]
		if len(prev) != sketchDepth*sketchWidth {
			prev = make([]float64, sketchDepth*sketchWidth)
			s.prev[n] = prev
		}
		s.name[n] = p.name[n]
		for row := range sketchDepth {
			cells := s.cells[n][row][:0]
			for col := range sketchWidth {
				i := row*sketchWidth + col
				count, last := cell(n, row, col)
				before := prev[i]
				if count == 0 {
					prev[i] = 0
					if before == 0 || fresh {
						continue
					}
				}
				// The count decayed to now, in packets.
				if now > last {
					count = count.Mul(decayFactor(now - last))
				}
				k := count.Float64()
				prev[i] = k
				est := k / tau
				rate := est
				if !fresh {
					rate = max(k-before*d, 0) / gain
					est = rate + (est-rate)*ahead
				}
				if est > 0 {
					cells = append(cells, curveCell{est, rate})
				}
			}
			s.cells[n][row] = cells
			cn.rows[row] = newFillCurve(cells, s.curves[n][row])
			s.curves[n][row] = cn.rows[row]
		}
		s.nodes = append(s.nodes, cn)
	}
	s.prevAt = now
	return s.nodes
}

// limitRate is a limit in queries per second, +Inf for fixedMax (none).
func limitRate(f fixed) float64 {
	if f == fixedMax {
		return math.Inf(1)
	}
	return f.Float64()
}

// capacityNodes returns the Limiter's adjusted nodes at now (see
// limiterParams.capacityNodes).
func (l *Limiter) capacityNodes(now int64, s *capacityScratch) []capacityNode {
	return l.params.Load().capacityNodes(uint64(max(now, 0)), func(node, row, col int) (fixed, uint64) {
		return l.sketch[node][row][col].load()
	}, s)
}
