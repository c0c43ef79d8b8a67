package rrl

import (
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// RRL is a response rate limiter: it keeps the response accounts and per-client
// request accounts of BIND's rate-limit clause and judges every response with Debit.
// Every account holds a balance of seconds of credit: a debit costs 1/allowance
// seconds, the balance earns back one second per second between -window and one
// second, and a response whose debit leaves it negative is limited.
// docs/response-accounts.md has how accounts are keyed and charged, and where this
// differs from markdingo/rrl.
//
// An RRL is safe for concurrent use: calls for different client networks proceed in
// parallel, and Update changes the settings while they go on, keeping the accounts.
// With Config.SetEventFunc it reports when it starts and stops limiting an account
// (LimitEvent). Create it with New or NewRRL; the zero value is not usable.
type RRL struct {
	state atomic.Pointer[rrlState] // settings and table, replaced by Update

	scaleSec   atomic.Int64  // the second whose rate scale was computed for
	scale      atomic.Uint64 // fixed factor >= 1 applied to response costs
	seed       uint64        // keys account and name hashes
	nowFunc    func() time.Time
	epoch      time.Time     // nowFunc's reading at New
	epochNanos int64         // coarse clock reading at New
	last       atomic.Uint64 // latest fixed time read: the clock never runs backwards
	stripes    stripes       // per-P statistics and query counts
	tracker    *eventTracker // the events tracker, kept across Updates (under updateMu)

	updateMu  sync.Mutex // serialises Update
	statsMu   sync.Mutex
	statsBase Stats // the counts at the last GetStats(true)
	oldEvicts int64 // evictions of tables Update replaced
}

// rrlState is what a Config sets and the account table, swapped as a whole by
// Update so that Debit reads one consistent set with one atomic load and no lock.
type rrlState struct {
	costs     [AllowanceLast]fixed // per category; 0 disables it
	reqCost   fixed                // requests-per-second; 0 disables it
	allCost   fixed                // all-per-second; 0 disables it
	window    fixed
	maxCost   fixed // costs are clamped to window + 1 s, which keeps sums in range
	slipRatio uint64
	v4Mask    uint32
	v6MaskHi  uint64
	v6MaskLo  uint64
	exempt    *prefixSet // nil when exempt-clients is empty: one test per Debit
	report    bool
	qpsScale  uint64 // queries per second; 0 disables qps-scale

	rates            [AllowanceLast]float64 // the allowances, for events
	reqRate, allRate float64
	v4Len, v6Len     int
	tableSize        int
	events           *eventTracker   // limiting events; nil when the Config sets no EventFunc
	follow           episodeFollower // events as the table sees them (nil with events nil), made once here rather than per Debit

	shardShift uint
	shards     []shard
}

// Kinds of accounts, mixed into their keys.
const (
	kindRequest  = 1
	kindAll      = 2
	kindResponse = 3
)

// NewRRL returns an RRL for cfg, as markdingo/rrl's NewRRL does. A nil cfg means
// NewConfig(). NewRRL never fails: a Config whose values were not set through
// SetValue (a zero Config literal, say) has its out-of-range values replaced by the
// defaults. Use New to have them reported instead.
func NewRRL(cfg *Config) *RRL {
	if cfg == nil {
		cfg = NewConfig()
	}
	c := cfg.clone()
	c.repair()
	r, err := New(c)
	if err != nil {
		panic("rrl: NewRRL: " + err.Error()) // unreachable: c is valid now
	}
	return r
}

// New returns an RRL for cfg, or an error naming every setting of cfg that is out
// of range (possible only for a Config not built by NewConfig and SetValue). The RRL
// takes a copy of cfg: later changes to cfg do not affect it.
func New(cfg *Config) (*RRL, error) {
	if cfg == nil {
		return nil, errors.New("rrl: nil Config")
	}
	if err := validate(cfg); err != nil {
		return nil, err
	}
	r := &RRL{
		seed:    rand.Uint64(),
		nowFunc: cfg.nowFunc,
	}
	st := newState(cfg)
	st.newTable(cfg.maxTableSize)
	r.tracker = r.newTracker(cfg)
	st.setEvents(r.tracker)
	r.state.Store(st)
	r.scale.Store(uint64(fixedOne))
	if r.nowFunc != nil {
		r.epoch = r.nowFunc()
	} else {
		r.epochNanos = coarseNanos()
	}
	r.stripes.init()
	r.last.Store(uint64(clockOffset))
	return r, nil
}

// newState returns the settings of cfg, a valid Config, without a table.
func newState(cfg *Config) *rrlState {
	st := &rrlState{
		window:    fixedFromInt(uint64(cfg.window)),
		slipRatio: uint64(cfg.slipRatio),
		v4Mask:    ^uint32(0) << (32 - cfg.ipv4PrefixLength),
		report:    cfg.reportOnly,
		qpsScale:  uint64(math.Ceil(cfg.qpsScale)),
		v4Len:     cfg.ipv4PrefixLength,
		v6Len:     cfg.ipv6PrefixLength,
		tableSize: cfg.maxTableSize,
		reqRate:   cfg.requestsPerSecond,
		allRate:   cfg.allPerSecond,
	}
	st.maxCost = st.window + fixedOne
	if ex := newPrefixSet(cfg.exempt); !ex.empty() {
		st.exempt = &ex
	}
	st.v6MaskHi, st.v6MaskLo = prefixMask128(cfg.ipv6PrefixLength)
	for cat := range AllowanceLast {
		st.rates[cat] = cfg.allowance(cat)
		st.costs[cat] = st.costOf(st.rates[cat])
	}
	st.reqCost = st.costOf(cfg.requestsPerSecond)
	st.allCost = st.costOf(cfg.allPerSecond)
	return st
}

// setEvents gives st the events tracker ev (nil for none).
func (st *rrlState) setEvents(ev *eventTracker) {
	st.events = ev
	if ev != nil {
		st.follow = ev // not a nil *eventTracker: the table tests the interface for nil
	}
}

// newTable gives st an empty account table for size accounts.
func (st *rrlState) newTable(size int) {
	n := 1
	for n < maxShards && size/(2*n) >= minShardAccounts {
		n *= 2
	}
	st.shards = make([]shard, n)
	per := size / n
	for i := range st.shards {
		st.shards[i].init(per)
	}
	if m := st.shards[0].maxSlots; uint64(m)*uint64(n)*uint64(unsafe.Sizeof(entry{})) <= preallocBytes {
		// One allocation for all shards, so that large tables can sit on huge pages.
		all := make([]entry, m*n)
		adviseHugePages(unsafe.Pointer(unsafe.SliceData(all)), len(all)*int(unsafe.Sizeof(entry{})))
		for i := range st.shards {
			st.shards[i].setSlots(all[i*m : (i+1)*m : (i+1)*m])
		}
	}
	st.shardShift = uint(64 - bitsLen(n))
}

func bitsLen(n int) int {
	l := 0
	for 1<<l < n {
		l++
	}
	return l
}

// validate reports the settings of cfg that SetValue would have refused: for each
// keyword of the table whose check fails, a ConfigError naming it.
func validate(cfg *Config) error {
	var errs []error
	for _, k := range keywords {
		if k.check == nil {
			continue
		}
		if err := k.check(cfg); err != nil {
			v, _ := k.get(cfg)
			if k.secret {
				v = redacted
			}
			errs = append(errs, &ConfigError{Keyword: k.name, Value: v, Reason: err.Error()})
		}
	}
	return errors.Join(errs...)
}

// repair replaces each of c's values that validate refuses by NewConfig's, in table
// order (the request levels after the prefix lengths they are checked with). An
// allowance keeps its set flag: one set to a rate out of range is set to 0.
func (c *Config) repair() {
	def := NewConfig()
	for _, k := range keywords {
		if k.check != nil && k.check(c) != nil {
			k.reset(c, def)
		}
	}
}

// costOf returns the cost of one debit at allowance a per second: 1/a seconds,
// truncated so that a whole-number allowance n admits exactly n debits from one
// second of credit; 0 for a disabled allowance.
func (st *rrlState) costOf(a float64) fixed {
	switch {
	case !(a > 0):
		return 0
	case a == math.Trunc(a):
		return max(fixedFromRatio(1, uint64(a)), 1)
	}
	return min(max(fixedFromFloat(1/a), 1), st.maxCost)
}

// prefixMask128 returns the mask of an IPv6 prefix of length bits as two words.
func prefixMask128(bits int) (hi, lo uint64) {
	if bits >= 64 {
		return ^uint64(0), ^uint64(0) << (128 - bits) // a shift by 64 gives 0
	}
	return ^uint64(0) << (64 - bits), 0
}

// clientNet is a client network: the masked source address as two words and its
// family (4, 6, or 0 for a source that is no IP address).
type clientNet struct {
	hi, lo uint64
	fam    uint64
}

// network returns the client network of a, an unmapped address.
func (st *rrlState) network(a netip.Addr) clientNet {
	switch {
	case a.Is4():
		b := a.As4()
		return clientNet{0, uint64(binary.BigEndian.Uint32(b[:]) & st.v4Mask), 4}
	case a.Is6():
		b := a.As16()
		return clientNet{
			binary.BigEndian.Uint64(b[:8]) & st.v6MaskHi,
			binary.BigEndian.Uint64(b[8:]) & st.v6MaskLo, 6}
	}
	return clientNet{}
}

// Debit judges a response about to be sent to src and debits the accounts it is
// charged to. It returns what to do with the response and why. src is the query's
// source: a *net.UDPAddr (response accounts apply) or any other net.Addr (only
// requests-per-second applies, RTNotUDP); *net.UDPAddr, *net.TCPAddr and *net.IPAddr
// are read without allocating, other types through their String method. A nil tuple
// counts as the zero ResponseTuple.
//
// The rules, in order: a source in exempt-clients is sent (IPExempt);
// requests-per-second limits the client network for every transport (Drop,
// IPRateLimit); only UDP responses go further (RTNotUDP); all-per-second limits all
// UDP responses of the client network (Drop, IPAllRateLimit); then the response
// account of the tuple's category limits (RTRateLimit) with Drop or Slip by
// slip-ratio, unless the category's allowance is 0 (RTNotConfigured). In report-only
// mode the action is always Send and the reasons and Stats tell what would have
// happened.
func (r *RRL) Debit(src net.Addr, tuple *ResponseTuple) (Action, IPReason, RTReason) {
	var ip net.IP
	udp := false
	switch a := src.(type) {
	case *net.UDPAddr:
		if a != nil {
			ip, udp = a.IP, true
		}
	case *net.TCPAddr:
		if a != nil {
			ip = a.IP
		}
	case *net.IPAddr:
		if a != nil {
			ip = a.IP
		}
	case nil:
	default:
		udp = strings.HasPrefix(src.Network(), "udp")
		return r.debit(parseAddr(src.String()), udp, tuple, true)
	}
	addr, _ := netip.AddrFromSlice(ip)
	return r.debit(addr, udp, tuple, true)
}

// parseAddr reads the address of a net.Addr's string form: "host:port", "host" or
// "[host%zone]:port". It returns the zero Addr if there is none.
func parseAddr(s string) netip.Addr {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().WithZone("")
	}
	s = strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")
	a, _ := netip.ParseAddr(s)
	return a.WithZone("")
}

// DebitAddrPort is Debit for a source given as a netip.AddrPort, with udp telling
// whether the query came over UDP. It is the fastest way in for servers that read
// with ReadMsgUDPAddrPort. The port is not used.
func (r *RRL) DebitAddrPort(src netip.AddrPort, udp bool, tuple *ResponseTuple) (Action, IPReason, RTReason) {
	return r.debit(src.Addr().WithZone(""), udp, tuple, true)
}

// debitResponse is DebitAddrPort for a UDP query that has already passed a request
// limiter enforcing requests-per-second per source group (the kernel filter, or the
// Go Limiter of a Protection) made from the same Config. It skips the
// requests-per-second account, which would otherwise apply the same limit a second
// time to traffic the limiter already trimmed to it (and, fed at exactly its rate,
// drift into refusing nearly all of it); the IP reason is then IPNotReached unless
// all-per-second or exempt-clients decide. Everything else is as DebitAddrPort with
// udp true.
func (r *RRL) debitResponse(src netip.AddrPort, tuple *ResponseTuple) (Action, IPReason, RTReason) {
	return r.debit(src.Addr().WithZone(""), true, tuple, false)
}

// timeNow returns the current time as a fixed number of seconds since the RRL's
// epoch plus clockOffset; times before the epoch read as the epoch.
func (r *RRL) timeNow() fixed {
	var ns int64
	if r.nowFunc != nil {
		ns = int64(r.nowFunc().Sub(r.epoch))
	} else {
		ns = coarseNanos() - r.epochNanos
	}
	return fixedFromNanos(min(ns, maxClockNanos)) + clockOffset
}

// maxClockNanos bounds times at 68 years after the epoch, far enough below the 2^32
// seconds a fixed holds that sums of times, costs and windows cannot overflow. A
// clock that jumps further stands still there.
const maxClockNanos = 1 << 31 * nanosPerSecond

var zeroTuple ResponseTuple

func (r *RRL) debit(addr netip.Addr, udp bool, tuple *ResponseTuple, requests bool) (act Action, ipr IPReason, rtr RTReason) {
	if tuple == nil {
		tuple = &zeroTuple
	}
	p := r.state.Load()
	cat := tuple.AllowanceCategory
	addr = addr.Unmap() // zones are dropped by parseAddr and DebitAddrPort
	cn := p.network(addr)
	netHash := mix64(mix64(r.seed^cn.hi) ^ cn.lo ^ cn.fam<<48)
	s := &p.shards[netHash>>p.shardShift&uint64(len(p.shards)-1)]
	if p.exempt != nil && p.exempt.contains(addr) {
		r.count(p.report, cat, Send, Send, IPExempt, RTNotReached)
		return Send, IPExempt, RTNotReached
	}
	var cost fixed
	var respKey uint64
	if cat < AllowanceLast {
		cost = p.costs[cat]
	}
	if udp && cost != 0 {
		respKey = r.responseKey(netHash, tuple)
	}
	now := r.clock(r.timeNow())
	scale := fixedOne
	if p.qpsScale != 0 {
		sec := int64(now.Int())
		st := r.stripes.own()
		st.countQuery(sec)
		r.stripes.done(st)
		scale = r.rateScale(sec, p.qpsScale)
	}
	fol := p.follow      // nil without events
	var trans transition // limiting began or ended for an account: rare

	act, ipr, rtr = Send, IPNotConfigured, RTNotReached
	if !requests {
		ipr = IPNotReached
	} else if p.reqCost != 0 {
		key := accountKey(netHash, kindRequest)
		limited, _, t := s.debit(key, now, p.reqCost, p.window, 0, fol)
		if t != 0 {
			trans |= t
			r.transition(p, s, key, t, now, cn, kindRequest, tuple, p.reqCost)
		}
		if limited {
			act, ipr = Drop, IPRateLimit
			goto done
		}
		ipr = IPOk
	}
	if !udp {
		rtr = RTNotUDP
		goto done
	}
	if p.allCost != 0 {
		key, c := accountKey(netHash, kindAll), p.scaled(p.allCost, scale)
		limited, _, t := s.debit(key, now, c, p.window, 0, fol)
		if t != 0 {
			trans |= t
			r.transition(p, s, key, t, now, cn, kindAll, tuple, c)
		}
		if limited {
			act, ipr = Drop, IPAllRateLimit
			goto done
		}
	}
	if cost == 0 {
		rtr = RTNotConfigured
		goto done
	}
	rtr = RTOk
	cost = p.scaled(cost, scale)
	if limited, slipped, t := s.debit(respKey, now, cost, p.window, p.slipRatio, fol); limited || t != 0 {
		if t != 0 {
			trans |= t
			r.transition(p, s, respKey, t, now, cn, kindResponse, tuple, cost)
		}
		if limited {
			rtr = RTRateLimit
			act = Drop
			if slipped {
				act = Slip
			}
		}
	}
done:
	if ev := p.events; ev != nil && (trans.ended() != 0 || uint64(now) >= ev.next.Load()) {
		// The table in force now, not p's: an Update since this Debit began must not
		// make the episodes of the new table look like those of a replaced one.
		ev.sweep(now, &r.state.Load().shards[0])
	}
	would := act
	if p.report {
		act = Send
	}
	r.count(p.report, cat, act, would, ipr, rtr)
	return act, ipr, rtr
}

// clock returns now, or the latest time any Debit has read if that is later: time
// stepping backwards stands still instead, so it can never add credit. The shared
// word is written about once per tick of the clock, so it stays in every core's
// cache.
func (r *RRL) clock(now fixed) fixed {
	for {
		last := r.last.Load()
		if uint64(now) <= last {
			return fixed(last)
		}
		if r.last.CompareAndSwap(last, uint64(now)) {
			return now
		}
	}
}

// count records a Debit call's outcome in the caller's stripe.
func (r *RRL) count(report bool, cat AllowanceCategory, act, would Action, ipr IPReason, rtr RTReason) {
	st := r.stripes.own()
	st.c.count(cat, act, would, ipr, rtr, report)
	r.stripes.done(st)
}

// scaled returns cost scaled for qps-scale, within maxCost.
func (st *rrlState) scaled(cost, scale fixed) fixed {
	if scale == fixedOne {
		return cost
	}
	return min(cost.Mul(scale), st.maxCost)
}

// rateScale returns the factor qps-scale applies to costs in second sec: the total
// query rate of the previous second divided by qps-scale, or 1 when that rate is not
// above qps-scale. One caller per second sums the stripes' counts, without locks.
func (r *RRL) rateScale(sec int64, qpsScale uint64) fixed {
	if old := r.scaleSec.Load(); old != sec && r.scaleSec.CompareAndSwap(old, sec) {
		var total uint64
		r.stripes.all(func(st *stripe) { total += st.queriesIn(sec - 1) })
		f := fixedOne
		if total > qpsScale {
			f = fixedFromRatio(min(total, 1<<31), qpsScale)
		}
		r.scale.Store(uint64(f))
		return f
	}
	return fixed(r.scale.Load())
}

// accountKey returns the key of an account of the client network hashed as
// netHash, of the given kind, with extra bits for the response tuple. The key
// leaves the tag's low bits (slip countdown, lock, event record) clear and is never 0.
func accountKey(netHash, meta uint64) uint64 {
	k := mix64(netHash^meta) & keyMask
	if k == 0 {
		k = 1 << 16
	}
	return k
}

// responseKey returns the key of the response account of tuple for the client
// network hashed as netHash. As in BIND, answers and referrals are keyed by qtype
// and salient name, NODATA and NXDOMAIN by salient name and errors by the client
// network alone. Names compare case-insensitively (ASCII).
func (r *RRL) responseKey(netHash uint64, t *ResponseTuple) uint64 {
	meta := uint64(kindResponse) | uint64(t.AllowanceCategory)<<8
	var name uint64
	switch t.AllowanceCategory {
	case AllowanceAnswer, AllowanceReferral:
		meta |= uint64(t.Type) << 16
		name = r.hashName(t.SalientName)
	case AllowanceNoData, AllowanceNXDomain:
		name = r.hashName(t.SalientName)
	}
	return accountKey(mix64(netHash^meta)^name, 0)
}

// hashName returns a keyed hash of name folded to lower case (ASCII), eight bytes
// at a time and without allocating. It need not resist deliberate collisions: names
// that collide share one account within one client network, which gives whoever
// chooses them no more than asking for one name repeatedly.
func (r *RRL) hashName(name string) uint64 {
	h := r.seed ^ uint64(len(name))
	for ; len(name) >= 8; name = name[8:] {
		w := uint64(name[0]) | uint64(name[1])<<8 | uint64(name[2])<<16 | uint64(name[3])<<24 |
			uint64(name[4])<<32 | uint64(name[5])<<40 | uint64(name[6])<<48 | uint64(name[7])<<56
		h = (h ^ lower8(w)) * nameMul
		h ^= h >> 31
	}
	if len(name) > 0 {
		var w uint64
		for i := range len(name) {
			w |= uint64(name[i]) << (8 * i)
		}
		h = (h ^ lower8(w)) * nameMul
		h ^= h >> 31
	}
	return mix64(h)
}

// lower8 folds the ASCII capitals among the eight bytes of w to lower case.
func lower8(w uint64) uint64 {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	low7 := w &^ highs
	geA := low7 + (0x80-'A')*ones // high bit set where the byte is >= 'A'
	gtZ := low7 + (0x7f-'Z')*ones // high bit set where the byte is > 'Z'
	upper := (geA &^ gtZ) &^ w & highs
	return w | upper>>2 // 0x80 >> 2 is the case bit 0x20
}

// GetStats returns the statistics of the Debit calls since the RRL was made or
// since the last GetStats(true), which zeroes them after the copy. CacheLength is the
// current number of accounts, whatever zeroAfter.
func (r *RRL) GetStats(zeroAfter bool) Stats {
	var st Stats
	r.stripes.all(func(s *stripe) { s.c.addTo(&st) })
	// The counters only grow, written without locks by the goroutines that count:
	// zeroing them is remembering where they stood.
	r.statsMu.Lock()
	defer r.statsMu.Unlock()
	p := r.state.Load()
	for i := range p.shards {
		s := &p.shards[i]
		s.mu.Lock()
		st.Evictions += s.evictions
		st.CacheLength += s.live
		s.mu.Unlock()
	}
	st.Evictions += r.oldEvicts
	total := st
	st.addCounts(&r.statsBase, -1)
	if zeroAfter {
		r.statsBase = total
	}
	return st
}

// Update replaces the RRL's settings with cfg's while Debit calls go on, keeping the
// accounts: limits, window, slip-ratio, exempt-clients, report-only, qps-scale and the
// event settings change in place, and every account keeps its balance. A change of
// ipv4-prefix-length, ipv6-prefix-length or max-table-size changes what an account is
// (or how many there may be), which the table cannot follow: the RRL then starts with
// an empty table and Update reports fresh true. cfg's clock (SetNowFunc) is ignored:
// an RRL keeps the clock it was made with. On error (cfg out of range, as for New)
// nothing changes. Debit calls in progress finish with the old settings.
func (r *RRL) Update(cfg *Config) (fresh bool, err error) {
	if cfg == nil {
		return false, errNilConfig
	}
	if err := validate(cfg); err != nil {
		return false, err
	}
	r.updateMu.Lock()
	defer r.updateMu.Unlock()
	old := r.state.Load()
	st := newState(cfg)
	if st.v4Len == old.v4Len && st.v6Len == old.v6Len && st.tableSize == old.tableSize {
		st.shards, st.shardShift = old.shards, old.shardShift
	} else {
		st.newTable(cfg.maxTableSize)
		fresh = true
	}
	switch {
	case cfg.eventFunc == nil:
		// Accounts keep their record bits until their next debit clears them.
		if r.tracker != nil {
			r.tracker.setTimer(false, 0)
		}
	case r.tracker == nil:
		r.tracker = r.newTracker(cfg)
		st.setEvents(r.tracker)
	default:
		r.tracker.mu.Lock()
		r.tracker.fn, r.tracker.budget.perSec = cfg.eventFunc, cfg.eventsPerSec()
		r.tracker.mu.Unlock()
		st.setEvents(r.tracker)
	}
	if fresh {
		r.statsMu.Lock()
		for i := range old.shards {
			s := &old.shards[i]
			s.mu.Lock()
			r.oldEvicts += s.evictions
			s.mu.Unlock()
		}
		r.statsMu.Unlock()
	}
	r.state.Store(st)
	if st.events != nil {
		st.events.setTimer(true, r.clock(r.timeNow())) // a timer for episodes open while events were off
	}
	return fresh, nil
}

// stopEventTicks turns the events' timer off (a Protection's Close): events come
// only with Debit calls from now on, until an Update turns the timer on again.
func (r *RRL) stopEventTicks() {
	r.updateMu.Lock()
	defer r.updateMu.Unlock()
	if r.tracker != nil {
		r.tracker.setTimer(false, 0)
	}
}

// newTracker returns the events tracker for cfg (nil without an event function): it
// reads the RRL's wall clock and, on the default clock, has a timer for its sweep.
func (r *RRL) newTracker(cfg *Config) *eventTracker {
	return newEventTracker(cfg, r.nowFunc == nil, r.timeOf, r.eventTick)
}

// eventTick is the timer's sweep: it reports what is due when no Debit came to do it.
func (r *RRL) eventTick(ev *eventTracker) {
	ev.ticked()
	p := r.state.Load()
	if p.events != ev { // events are off; Update stopped the timer
		return
	}
	ev.sweep(r.clock(r.timeNow()), &p.shards[0]) // arms the timer again while episodes are open
}

// transition hands what the debit of account key (in shard s of state p) changed in
// the limiting episodes to the tracker, with the event an episode that began reports.
func (r *RRL) transition(p *rrlState, s *shard, key uint64, t transition, now fixed, cn clientNet, kind int, tuple *ResponseTuple, cost fixed) {
	ev := p.events
	if ev == nil {
		return
	}
	var e LimitEvent
	if t.began() != 0 {
		e.Network = cn.prefix(p)
		e.ReportOnly = p.report
		switch kind {
		case kindRequest:
			e.Account, e.Limit = AccountRequests, p.reqRate
		case kindAll:
			e.Account, e.Limit = AccountAll, p.allRate
		default:
			e.Account, e.Category = AccountResponses, tuple.AllowanceCategory
			e.Limit = p.rates[tuple.AllowanceCategory]
			switch tuple.AllowanceCategory {
			case AllowanceAnswer, AllowanceReferral:
				e.Type = tuple.Type
				e.Name = strings.Clone(tuple.SalientName)
			case AllowanceNoData, AllowanceNXDomain:
				e.Name = strings.Clone(tuple.SalientName)
			}
		}
	}
	ev.transition(t, key, &p.shards[0], s, cost, now, &e)
}

// timeOf returns the wall-clock time of an RRL time.
func (r *RRL) timeOf(t fixed) time.Time {
	d := time.Duration(fixedNanos(t - clockOffset))
	if r.nowFunc != nil {
		return r.epoch.Add(d)
	}
	return clockBase.Add(time.Duration(r.epochNanos) + d)
}

// prefix returns the client network as a prefix.
func (cn clientNet) prefix(p *rrlState) netip.Prefix {
	switch cn.fam {
	case 4:
		return netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(cn.lo >> 24), byte(cn.lo >> 16), byte(cn.lo >> 8), byte(cn.lo)}), p.v4Len)
	case 6:
		var b [16]byte
		binary.BigEndian.PutUint64(b[:8], cn.hi)
		binary.BigEndian.PutUint64(b[8:], cn.lo)
		return netip.PrefixFrom(netip.AddrFrom16(b), p.v6Len)
	}
	return netip.Prefix{}
}
