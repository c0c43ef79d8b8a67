package rrl

import (
	"math"
	"math/bits"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/miekg/dns"
)

// The names judge of the Go Limiter (docs/names.md, "The rule"): under overload,
// queries for names the server has not answered as existing (the unknown tier) are
// limited by zone, before the source lattice, which then counts only what passed.
// The kernel program applies the same rule to the same keys.

// namesParams are a limiterParams' names settings.
type namesParams struct {
	on    bool
	level float64 // in force, queries per second per zone; 0: none
	limit fixed   // the unknown tier's limit per zone; fixedMax: none
	trip  fixed   // tripCount(limit)
	zones []string
	// netBits are the client networks' prefix lengths, IPv4 and IPv6 (Config
	// ipv4-prefix-length and ipv6-prefix-length), by which the zone counters
	// (names_count.go) count the networks a zone's random names come from.
	netBits [2]int
}

// initNames sets the names judge up for cfg: on with the capacity mode unless the
// names keyword is off, with cfg's level (namesLevel) in force.
func (p *limiterParams) initNames(cfg *Config) {
	p.names = namesParams{limit: fixedMax, trip: tripCount(fixedMax)}
	if !namesOnIn(cfg) {
		return
	}
	p.names.on = true
	p.names.zones = cfg.zones
	p.names.netBits = [2]int{cfg.ipv4PrefixLength, cfg.ipv6PrefixLength}
	p.applyNamesLevel(cfg.namesLevel)
}

// namesOnIn reports whether cfg has the names judge on: the names keyword, on by
// default with the capacity mode.
func namesOnIn(cfg *Config) bool { return cfg != nil && cfg.capacity != 0 && !cfg.namesOff }

// namesLimit is the limit a names level gives: fixedMax for none (0 or +Inf), else
// the level, at least the smallest fixed.
func namesLimit(level float64) fixed {
	if !(level > 0) || math.IsInf(level, 1) {
		return fixedMax
	}
	return max(fixedFromFloat(level), 1)
}

// applyNamesLevel puts the names level in force (0 or +Inf: none).
func (p *limiterParams) applyNamesLevel(level float64) {
	n := &p.names
	if !n.on {
		return
	}
	n.limit = namesLimit(level)
	n.level = 0
	if n.limit != fixedMax {
		n.level = level
	}
	n.trip = tripCount(n.limit)
}

// limiterNames is what a Limiter keeps for the names judge, made when a Config first
// turns it on and kept after: the learner and the zone sketch (the unknown tier's
// arrivals by zone).
type limiterNames struct {
	seed    uint64
	learner atomic.Pointer[nameLearner]
	zones   []string // the learner's configured apexes; under mu
	mu      sync.Mutex
	sketch  countMin
	// zoneNames maps the key of every apex seen (configured, or the owner of an
	// answer's SOA) to its name, for reports: at most maxZoneNames of them.
	zoneNames sync.Map // nameKey -> string
	nzones    atomic.Int32
	// counters count the distinct names and networks of the zones being limited
	// (names_count.go), for the events.
	counters zoneCounters
}

// maxZoneNames bounds the zones a Limiter names in its reports: as many as its
// learner's apex table holds.
const maxZoneNames = 1 << apexBucketShift * nameWays

// nameZone records that key is the apex name, unless maxZoneNames are recorded.
func (ln *limiterNames) nameZone(key nameKey, name string) {
	if _, ok := ln.zoneNames.Load(key); ok || ln.nzones.Load() >= maxZoneNames {
		return
	}
	if _, loaded := ln.zoneNames.LoadOrStore(key, dns.CanonicalName(name)); !loaded {
		ln.nzones.Add(1)
	}
}

// namesState returns l's names state, making it if p has the names judge on.
func (l *Limiter) namesState(p *limiterParams) *limiterNames {
	if ln := l.names.Load(); ln != nil || !p.names.on {
		return ln
	}
	ln := &limiterNames{seed: nameSeed(l.seedv)}
	if !l.names.CompareAndSwap(nil, ln) {
		ln = l.names.Load()
	}
	ln.setZones(p.names.zones)
	return ln
}

// setZones gives the learner the configured apexes zones: a new learner when they
// changed (what it learnt comes back with the next answers).
func (ln *limiterNames) setZones(zones []string) {
	ln.mu.Lock()
	defer ln.mu.Unlock()
	if ln.learner.Load() != nil && slices.Equal(ln.zones, zones) {
		return
	}
	lr, ok := newNameLearner(ln.seed, zones)
	if !ok {
		lr, _ = newNameLearner(ln.seed, nil) // parseZones refused such names already
	}
	ln.zones = slices.Clone(zones)
	ln.learner.Store(lr)
	var q qname
	for _, z := range zones {
		if qnameOf(z, ln.seed, &q) {
			ln.nameZone(q.name(), z)
		}
	}
}

// readName reads the question of msg, a query as it arrived, into q with l's names
// seed; false when the names judge is off or the name does not read.
func (l *Limiter) readName(msg []byte, q *qname) bool {
	ln := l.names.Load()
	if ln == nil || !l.params.Load().names.on {
		return false
	}
	_, err := readQName(msg, ln.seed, q)
	return err == nameOK
}

// readQuestion is readName for a query already unpacked (the Handler's).
func (l *Limiter) readQuestion(req *dns.Msg, q *qname) bool {
	ln := l.names.Load()
	if ln == nil || len(req.Question) != 1 || !l.params.Load().names.on {
		return false
	}
	return qnameOf(req.Question[0].Name, ln.seed, q)
}

// observe teaches l's learner from resp, a response the server computed for a query,
// with the wildcard origin its handler reported ("" for none).
func (l *Limiter) observe(resp *dns.Msg, wildcard string) {
	l.observeAt(resp, wildcard, coarseNanos())
}

// observeAt is observe at now, on the clock of the Limiter's judgements.
func (l *Limiter) observeAt(resp *dns.Msg, wildcard string, now int64) {
	ln := l.names.Load()
	if ln == nil || !l.params.Load().names.on {
		return
	}
	ln.learner.Load().observe(resp, wildcard, uint64(max(now, 0)))
	for _, rr := range resp.Ns {
		if soa, ok := rr.(*dns.SOA); ok {
			var q qname
			if qnameOf(soa.Hdr.Name, ln.seed, &q) && q.labels > 0 {
				ln.nameZone(q.name(), soa.Hdr.Name)
			}
			break
		}
	}
}

// zoneRate is one named zone's rate of queries for unknown names.
type zoneRate struct {
	key  nameKey
	name string
	rate float64
}

// zoneRates appends to out the named zones' rates of queries for unknown names at
// now, those at least min.
func (l *Limiter) zoneRates(now int64, min float64, out []zoneRate) []zoneRate {
	ln := l.names.Load()
	if ln == nil {
		return out
	}
	t := uint64(max(now, 0))
	ln.zoneNames.Range(func(k, v any) bool {
		if r := ln.sketch.rate(mix64(l.mix0^uint64(k.(nameKey))), t).Float64(); r >= min {
			out = append(out, zoneRate{k.(nameKey), v.(string), r})
		}
		return true
	})
	return out
}

// namesVerdict is what the names judge made of a query.
type namesVerdict uint8

const (
	namesNotJudged namesVerdict = iota // off, no name, exempt
	namesKnown
	namesUnknown // passed the names judge
	namesRefused
)

// judgeName is the names judge of the rule: it classifies q and counts an unknown
// name in the zone sketch, and refuses it when the draw (rand rotated by 16 bits)
// is over the zone's limit. While the controller watches the zone of an unknown
// name (it is being limited), the name's key and the client network of addr are
// counted for the events' figures (names_count.go).
func (l *Limiter) judgeName(p *limiterParams, st *statShard, q *qname, addr netip.Addr, t uint64, rand uint32) namesVerdict {
	ln := l.names.Load()
	if ln == nil {
		return namesNotJudged
	}
	c := ln.learner.Load().classify(q, t)
	if c.known {
		st.namesKnown.Add(1)
		return namesKnown
	}
	st.namesUnknown.Add(1)
	if s := ln.counters.slot(c.zone); s != nil {
		s.names.add(uint64(q.name()))
		s.nets.add(networkHash(addr, p.names.netBits[0], p.names.netBits[1], l.mix0))
	}
	cnt := ln.sketch.arrive(mix64(l.mix0^uint64(c.zone)), t)
	if cnt >= p.names.trip && fixed(bits.RotateLeft32(rand, 16)).Mul(arrivalRate(cnt)) >= p.names.limit {
		return namesRefused
	}
	return namesUnknown
}

// setNamesLevel puts the names level in force in l (0 or +Inf: none).
func (l *Limiter) setNamesLevel(level float64) {
	l.updateMu.Lock()
	defer l.updateMu.Unlock()
	old := l.params.Load()
	if !old.names.on || namesLimit(level) == old.names.limit {
		return
	}
	p := *old
	p.applyNamesLevel(level)
	l.params.Store(&p)
}
