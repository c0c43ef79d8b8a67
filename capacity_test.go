package rrl

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"
)

// fillReference is the sum over rates of min(r, x), written out.
func fillReference(rates []float64, x float64) float64 {
	s := 0.0
	for _, r := range rates {
		s += min(r, x)
	}
	return s
}

// levelReference finds the water level of rates for target by bisection on
// fillReference.
func levelReference(rates []float64, target float64) float64 {
	total := fillReference(rates, math.Inf(1))
	if target >= total {
		return math.Inf(1)
	}
	lo, hi := 0.0, slices.Max(rates)
	for range 200 {
		mid := (lo + hi) / 2
		if fillReference(rates, mid) < target {
			lo = mid
		} else {
			hi = mid
		}
	}
	return (lo + hi) / 2
}

func TestFillCurveLevel(t *testing.T) {
	cases := []struct {
		name   string
		rates  []float64
		target float64
		want   float64
	}{
		{"one heavy", []float64{1000, 10, 10, 10}, 530, 500},
		{"all equal", []float64{5, 5, 5, 5}, 10, 2.5},
		{"under target", []float64{5, 5}, 10, math.Inf(1)},
		{"at target", []float64{5, 5}, 10, math.Inf(1)},
		{"zero target", []float64{5, 5}, 0, 0},
		{"zeros ignored", []float64{0, 8, 0, 2}, 6, 4},
		{"two heavy", []float64{100, 60, 1, 1}, 82, 40},
		{"empty", nil, 1, math.Inf(1)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			curve := newFillCurve(steadyCells(c.rates), fillCurve{})
			got := curve.level(c.target)
			if math.IsInf(c.want, 1) != math.IsInf(got, 1) || (!math.IsInf(got, 1) && math.Abs(got-c.want) > 1e-9*max(1, c.want)) {
				t.Errorf("level(%v, %g) = %g, want %g", c.rates, c.target, got, c.want)
			}
			for _, x := range []float64{0, 0.5, 1, 3, 50, 1e6, math.Inf(1)} {
				if got, want := curve.fill(x), fillReference(c.rates, x); math.Abs(got-want) > 1e-9*max(1, want) {
					t.Errorf("fill(%g) = %g, want %g", x, got, want)
				}
			}
		})
	}
}

// TestFillCurveLevelRandom checks the water level against the bisection reference on
// random rate distributions, heavy-tailed like real traffic.
func TestFillCurveLevelRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 300 {
		n := 1 + r.IntN(3000)
		rates := make([]float64, n)
		for j := range rates {
			if r.IntN(4) == 0 {
				continue // empty cells
			}
			rates[j] = math.Exp(r.NormFloat64() * 2)
		}
		total := fillReference(rates, math.Inf(1))
		target := total * r.Float64() * 1.2
		got := newFillCurve(steadyCells(rates), fillCurve{}).level(target)
		want := levelReference(rates, target)
		if math.IsInf(want, 1) != math.IsInf(got, 1) || (!math.IsInf(got, 1) && math.Abs(got-want) > 1e-6*max(1, want)) {
			t.Fatalf("case %d: level(%d rates, %g of %g) = %g, want %g", i, n, target, total, got, want)
		}
		if !math.IsInf(got, 1) && total > 0 {
			if adm := fillReference(rates, got); math.Abs(adm-target) > 1e-6*total {
				t.Fatalf("case %d: admits %g at level %g, want %g", i, adm, got, target)
			}
		}
	}
}

// curveNode makes a capacityNode of the given family and factor whose two rows hold
// rates (the same groups, no collisions).
func curveNode(fam int, factor, base float64, rates []float64) capacityNode {
	n := capacityNode{fam: fam, factor: factor, base: base}
	for row := range n.rows {
		n.rows[row] = newFillCurve(steadyCells(rates), fillCurve{})
	}
	return n
}

// latticeReference is capacityAdmitted written out plainly from the rates.
func latticeReference(fams [][]struct {
	factor, base float64
	rates        []float64
}, port *struct {
	factor, base float64
	rates        []float64
}, level float64) float64 {
	sum := 0.0
	for _, nodes := range fams {
		least := math.Inf(1)
		for _, n := range nodes {
			least = min(least, fillReference(n.rates, min(n.base, level*n.factor)))
		}
		if !math.IsInf(least, 1) {
			sum += least
		}
	}
	if port != nil {
		sum = min(sum, fillReference(port.rates, min(port.base, level*port.factor)))
	}
	return sum
}

// TestCapacitySolveBruteForce: on random lattices, the solved level admits the target
// by the plain reference, and any lower level admits less.
func TestCapacitySolveBruteForce(t *testing.T) {
	type node = struct {
		factor, base float64
		rates        []float64
	}
	r := rand.New(rand.NewPCG(3, 4))
	for i := range 200 {
		var fams [][]node
		var nodes []capacityNode
		total := 0.0
		for fam := range 2 {
			var fn []node
			// A family's levels group the same traffic coarser and coarser: each
			// level's groups are sums of the finer level's.
			groups := make([]float64, 1+r.IntN(500))
			for j := range groups {
				groups[j] = math.Exp(r.NormFloat64() * 2.5)
			}
			for lv := range 1 + r.IntN(3) {
				factor := math.Pow(4, float64(lv))
				base := math.Inf(1)
				if r.IntN(5) == 0 {
					base = 1 + r.Float64()*100
				}
				fn = append(fn, node{factor, base, slices.Clone(groups)})
				nodes = append(nodes, curveNode(fam, factor, base, groups))
				var coarser []float64
				for j := 0; j < len(groups); j += 4 {
					s := 0.0
					for _, g := range groups[j:min(j+4, len(groups))] {
						s += g
					}
					coarser = append(coarser, s)
				}
				groups = coarser
			}
			if fam == 0 {
				total += fillReference(groups, math.Inf(1))
			}
			fams = append(fams, fn)
		}
		var port *node
		if r.IntN(2) == 0 {
			p := make([]float64, 1+r.IntN(100))
			for j := range p {
				p[j] = math.Exp(r.NormFloat64() * 2)
			}
			port = &node{1, math.Inf(1), p}
			nodes = append(nodes, curveNode(2, 1, math.Inf(1), p))
		}
		target := r.Float64() * 2 * max(total, 1)
		level := capacitySolve(nodes, target)
		unlimited := latticeReference(fams, port, math.Inf(1))
		if math.IsInf(level, 1) {
			if unlimited > target*(1+1e-9) {
				t.Fatalf("case %d: no limit, but the lattice admits %g unlimited, over %g", i, unlimited, target)
			}
			continue
		}
		got := latticeReference(fams, port, level)
		if got < target*(1-1e-6) && level > capacityMinLevel {
			t.Fatalf("case %d: level %g admits %g, want %g", i, level, got, target)
		}
		if below := latticeReference(fams, port, level*(1-1e-5)); below > target*(1+1e-6) {
			t.Fatalf("case %d: level %g is not the least: %g below it admits %g over %g", i, level, level*(1-1e-5), below, target)
		}
		if a := capacityAdmitted(nodes, level); math.Abs(a-got) > 1e-6*max(1, got) {
			t.Fatalf("case %d: capacityAdmitted %g, reference %g", i, a, got)
		}
	}
}

// ---- The simulated server ----

// simSource is a set of senders in the simulation: Poisson arrivals at rate per
// second from from to to (0: the end), each from addr's draw.
type simSource struct {
	name     string
	rate     float64
	from, to time.Duration
	addr     func(r *rand.Rand) netip.AddrPort
	proven   bool // with a valid server cookie: judged at its own address only
	regular  bool // arrivals evenly spaced, not Poisson
	// query draws the query's message, judged by name as a Protection's reader
	// does (simServer.names); nil: judged by source only.
	query func(r *rand.Rand) []byte
}

// subnet24 draws sources from one /24, random host and port.
func subnet24(a, b, c byte) func(r *rand.Rand) netip.AddrPort {
	return func(r *rand.Rand) netip.AddrPort {
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte{a, b, c, byte(1 + r.IntN(254))}), uint16(1024+r.IntN(60000)))
	}
}

// host draws one address with random ports.
func host(a, b, c, d byte) func(r *rand.Rand) netip.AddrPort {
	return func(r *rand.Rand) netip.AddrPort {
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte{a, b, c, d}), uint16(1024+r.IntN(60000)))
	}
}

// randomNets draws sources from n random /24s, fixed for the simulation.
func randomNets(seed uint64, n int) func(r *rand.Rand) netip.AddrPort {
	nr := rand.New(rand.NewPCG(seed, 99))
	nets := make([][3]byte, n)
	for i := range nets {
		nets[i] = [3]byte{byte(11 + nr.IntN(200)), byte(nr.IntN(256)), byte(nr.IntN(256))}
	}
	return func(r *rand.Rand) netip.AddrPort {
		p := nets[r.IntN(n)]
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte{p[0], p[1], p[2], byte(1 + r.IntN(254))}), uint16(1024+r.IntN(60000)))
	}
}

// simServer is a server that reads capacity queries per second from a receive queue
// of queueLen packets, optionally only for quota out of every period (a CPU quota;
// both whole milliseconds, the simulation's step),
// behind a Limiter and the capacity controller.
type simServer struct {
	capacity       float64
	queueLen       int
	period, quota  time.Duration // 0: reads evenly
	configured     float64       // the capacity keyword: 0 auto
	requestsPerSec float64       // the static ceiling, 0 none
	// speed is the share of its capacity the server reads at, at each moment
	// (another process takes its processor, it pauses, it gets faster); nil: 1.
	speed func(at time.Duration) float64
	// names turns the names judge on, its learner taught by teach, and runs the
	// names controller beside the capacity controller as capacityRun.step does;
	// noAbsorb leaves the source lattice aiming at R alone (for comparison).
	names    bool
	teach    func(l *Limiter)
	noAbsorb bool
}

// dip is a speed schedule: share from from to to, 1 otherwise.
func dip(from, to time.Duration, share float64) func(time.Duration) float64 {
	return func(at time.Duration) float64 {
		if at >= from && at < to {
			return share
		}
		return 1
	}
}

// simResult is what each source sent and got answered, per second of send time.
type simResult struct {
	sent, served map[string][]int
	overflow     []int // per second
	served1s     []int // all sources, per second of service
	// Per tenth of a second: what each source sent and got answered (by send
	// time), the queries lost to the full queue, what the server read and what it
	// could have read.
	sentTenth, servedTenth map[string][]int
	overflowTenth          []int
	readTenth              []int
	possible               []float64
	level                  []float64 // the water level at each sample
	levelAt                []time.Duration
	overloaded             []bool
	rate, occupancy        []float64 // R and the queue's fill at each sample
	limiter                *Limiter
	ctrl                   *capacityController
	limits                 [][numNodes]fixed // the limits in force at each sample
}

// run simulates dur with 1 ms steps.
func (s simServer) run(t testing.TB, dur time.Duration, sources []simSource) *simResult {
	t.Helper()
	cfg := NewConfig()
	cfg.capacity = capacityAuto
	if s.configured > 0 {
		cfg.capacity = s.configured
	}
	if s.requestsPerSec > 0 {
		cfg.SetValue("requests-per-second", fmt.Sprint(s.requestsPerSec))
	}
	if !s.names {
		cfg.SetValue("names", "off")
	}
	l, err := newLimiterSeed(cfg, 7)
	if err != nil {
		t.Fatal(err)
	}
	ctrl := newCapacityController(s.configured)
	var nctrl *namesController
	if s.names {
		nctrl = newNamesController()
		if s.teach != nil {
			s.teach(l)
		}
	}
	g := &limiterCapacity{l: l}
	r := rand.New(rand.NewPCG(5, 6))
	secs := int(dur/time.Second) + 1
	res := &simResult{sent: map[string][]int{}, served: map[string][]int{}, overflow: make([]int, secs), served1s: make([]int, secs), limiter: l, ctrl: ctrl,
		sentTenth: map[string][]int{}, servedTenth: map[string][]int{}, overflowTenth: make([]int, 10*secs), readTenth: make([]int, 10*secs), possible: make([]float64, 10*secs)}
	for _, src := range sources {
		res.sent[src.name] = make([]int, secs)
		res.served[src.name] = make([]int, secs)
		res.sentTenth[src.name] = make([]int, 10*secs)
		res.servedTenth[src.name] = make([]int, 10*secs)
	}
	type queued struct {
		src  int
		sent int64
	}
	queue := make([]queued, 0, s.queueLen)
	head := 0
	next := make([]float64, len(sources)) // next arrival, seconds
	for i, src := range sources {
		next[i] = src.from.Seconds() + r.ExpFloat64()/src.rate
		if src.regular {
			next[i] = src.from.Seconds() + r.Float64()/src.rate
		}
	}
	var in capacityInput
	var scratch capacityScratch
	tokens := 0.0
	const tick = time.Millisecond
	nextSample := int64(0)
	readRate := s.capacity
	if s.period > 0 {
		readRate = s.capacity * float64(s.period) / float64(s.quota)
	}
	for step := int64(0); step*int64(tick) < int64(dur); step++ {
		now := step * int64(tick)
		end := float64(now+int64(tick)) / 1e9
		// Arrivals of this millisecond, in time order between sources.
		for {
			i := -1
			for j := range sources {
				if next[j] < end && (sources[j].to == 0 || next[j] < sources[j].to.Seconds()) && (i < 0 || next[j] < next[i]) {
					i = j
				}
			}
			if i < 0 {
				break
			}
			src := &sources[i]
			at := int64(next[i] * 1e9)
			if src.regular {
				next[i] += 1 / src.rate
			} else {
				next[i] += r.ExpFloat64() / src.rate
			}
			sec := int(at / 1e9)
			res.sent[src.name][sec]++
			res.sentTenth[src.name][at/1e8]++
			in.Demand++
			switch {
			case src.proven:
				in.fixed++
			case src.query != nil:
				if !judgeRaw(l, src.addr(r), src.query(r), at, r.Uint32()).Allowed {
					continue
				}
				in.Admitted++
			default:
				if !l.allowAt(src.addr(r), at, r.Uint32()) {
					continue
				}
				in.Admitted++
			}
			if len(queue)-head >= s.queueLen {
				in.Overflow++
				res.overflow[sec]++
				res.overflowTenth[at/1e8]++
				continue
			}
			if head > 0 && len(queue) == cap(queue) {
				queue = append(queue[:0], queue[head:]...)
				head = 0
			}
			queue = append(queue, queued{i, at})
			in.Served++ // entered the queue, as the kernel filter counts
		}
		sample := func(before bool) {
			// The controller samples: before the server reads, the queue as a reader
			// waking up would find it; or, under a CPU quota, only while the process
			// runs and after the server read, as a controller sharing the server's
			// process and processor does (it runs once the reader has emptied the
			// queue or its share of the period is spent: it sees a queue that
			// stands, and little of the sawtooth the quota draws).
			if now >= nextSample && (s.period == 0) == before {
				nextSample = now + int64(ctrl.sampleEvery())
				in.Now = now
				in.Queued = uint64(len(queue)-head) * 1000
				in.QueueLimit = uint64(s.queueLen) * 1000
				in.Sockets = 1
				in.QueuedPackets = float64(len(queue) - head)
				if nctrl != nil && !s.noAbsorb {
					ctrl.absorb = nctrl.absorb()
				}
				dec := ctrl.step(in, func() []capacityNode { return l.capacityNodes(now, &scratch) })
				if dec.Write {
					l.setCapacityLevel(dec.Level)
				}
				if nctrl != nil {
					if lv, write := nctrl.step(in, g.namesSample(), ctrl.status(), g.zoneCell); write {
						if math.IsInf(lv, 1) {
							lv = 0
						}
						g.applyNames(lv)
					}
				}
				res.level = append(res.level, dec.Level)
				res.levelAt = append(res.levelAt, time.Duration(now))
				res.overloaded = append(res.overloaded, ctrl.overloaded)
				res.rate = append(res.rate, ctrl.rate)
				res.occupancy = append(res.occupancy, float64(in.Queued)/float64(in.QueueLimit))
				res.limits = append(res.limits, l.params.Load().limit)
			}
		}
		sample(true)
		// The server reads.
		reading := s.period == 0 || time.Duration(now)%s.period < s.quota
		rate := readRate
		if s.speed != nil {
			rate *= s.speed(time.Duration(now))
		}
		if reading {
			res.possible[now/1e8] += rate * tick.Seconds()
			tokens = min(tokens+rate*tick.Seconds(), rate*tick.Seconds()+1)
			for tokens >= 1 && head < len(queue) {
				q := queue[head]
				head++
				tokens--
				res.served[sources[q.src].name][int(q.sent/1e9)]++
				res.servedTenth[sources[q.src].name][q.sent/1e8]++
				res.served1s[int(now/1e9)]++
				res.readTenth[now/1e8]++
			}
			if head == len(queue) {
				tokens = min(tokens, 1) // an idle server saves nothing up
			}
		}
		if s.period > 0 && time.Duration(now)%s.period < s.quota {
			sample(false)
		}
	}
	return res
}

// levelInSecond returns the mean water level over the samples of second s that had
// one (NaN: none): a second's level, as steady as the answers it gives.
func (r *simResult) levelInSecond(s int) float64 {
	sum, n := 0.0, 0
	for i, at := range r.levelAt {
		if at >= time.Duration(s)*time.Second && at < time.Duration(s+1)*time.Second && !math.IsInf(r.level[i], 1) {
			sum += r.level[i]
			n++
		}
	}
	return sum / float64(n)
}

// share returns what fraction of name's queries sent in [from, to) seconds were
// answered.
func (r *simResult) share(name string, from, to int) float64 {
	sent, served := 0, 0
	for s := from; s < to && s < len(r.sent[name]); s++ {
		sent += r.sent[name][s]
		served += r.served[name][s]
	}
	if sent == 0 {
		return math.NaN()
	}
	return float64(served) / float64(sent)
}

// sumOver adds the per-second counts of the named sources in [from, to).
func sumOver(m map[string][]int, names []string, from, to int) int {
	n := 0
	for _, name := range names {
		for s := from; s < to && s < len(m[name]); s++ {
			n += m[name][s]
		}
	}
	return n
}

const simC = 4500 // the simulated server's capacity, as the capped server

// lightNets are 50 light /24s at C/200 each.
func lightNets(from time.Duration) ([]simSource, []string) {
	var out []simSource
	var names []string
	for i := range 50 {
		name := fmt.Sprintf("light%d", i)
		out = append(out, simSource{name: name, rate: simC / 200, from: from, addr: subnet24(10, byte(i), 1)})
		names = append(names, name)
	}
	return out, names
}

// TestCapacitySimBelowCapacity: (a) one /24 at half the capacity is never limited,
// though a static limit of 100 per second would trim it to a tenth.
func TestCapacitySimBelowCapacity(t *testing.T) {
	for _, srv := range []simServer{
		{capacity: simC, queueLen: 256},
		{capacity: simC, queueLen: 256, period: 10 * time.Millisecond, quota: 2 * time.Millisecond},
		{capacity: simC, queueLen: 256, configured: simC},
	} {
		t.Run(fmt.Sprintf("quota%v-configured%v", srv.quota, srv.configured), func(t *testing.T) {
			res := srv.run(t, 4*time.Second, []simSource{{name: "big", rate: simC / 2, addr: subnet24(10, 9, 9)}})
			if got := res.share("big", 0, 3); got < 0.999 {
				t.Errorf("answered %.4f of the /24 at C/2, want >= 0.999", got)
			}
			if slices.Contains(res.overloaded, true) {
				t.Errorf("overload found below capacity")
			}
		})
	}
}

// TestCapacitySimFlood: (b) one /24 at 3 C and 50 light /24s at C/200: the light ones
// get 99% from a second after the flood starts, the queue stops overflowing within
// that second, the server stays at least 85% busy; (d) after the flood stops the
// limits lift within 2 s, and during the flood the light load's answered rate varies
// by less than 10% from one second to the next.
//
// Its first server is the race detector's check of the controller's simulation
// (exhaustive_test.go): the other scenarios run without the detector.
func TestCapacitySimFlood(t *testing.T) {
	for i, srv := range []simServer{
		{capacity: simC, queueLen: 256},
		{capacity: simC, queueLen: 256, period: 10 * time.Millisecond, quota: 2 * time.Millisecond},
		{capacity: simC, queueLen: 256, configured: simC},
	} {
		t.Run(fmt.Sprintf("quota%v-configured%v", srv.quota, srv.configured), func(t *testing.T) {
			if i > 0 {
				exhaustiveOnly(t, "TestCapacitySimFlood/quota0s-configured0")
			}
			light, names := lightNets(0)
			floodFrom, floodTo := 1*time.Second, 7*time.Second
			sources := append(light, simSource{name: "flood", rate: 3 * simC, from: floodFrom, to: floodTo, addr: subnet24(10, 200, 7)})
			res := srv.run(t, 10*time.Second, sources)
			sent := sumOver(res.sent, names, 2, 7)
			got := float64(sumOver(res.served, names, 2, 7)) / float64(sent)
			if got < 0.99 {
				t.Errorf("light /24s answered %.4f from 1 s after the flood started, want >= 0.99", got)
			}
			for s := 2; s < 7; s++ {
				if res.overflow[s] != 0 {
					t.Errorf("second %d: %d queries lost to the full queue, want none from 1 s into the flood", s, res.overflow[s])
				}
				if float64(res.served1s[s]) < 0.85*simC {
					t.Errorf("second %d: served %d, want >= 85%% of C (%d)", s, res.served1s[s], simC)
				}
			}
			// Steady: the light load's answered rate, second to second.
			for s := 3; s < 7; s++ {
				a, b := sumOver(res.served, names, s-1, s), sumOver(res.served, names, s, s+1)
				if math.Abs(float64(b-a)) > 0.1*float64(a) {
					t.Errorf("light load answered %d then %d in seconds %d and %d: more than 10%% apart", a, b, s-1, s)
				}
			}
			// Steady, once settled: the water level, and the flood's answered rate.
			for s := 4; s < 7; s++ {
				a, b := res.levelInSecond(s-1), res.levelInSecond(s)
				if math.Abs(b-a) > 0.1*a {
					t.Errorf("mean water level %.0f then %.0f in seconds %d and %d: more than 10%% apart", a, b, s-1, s)
				}
				fa, fb := res.served["flood"][s-1], res.served["flood"][s]
				if math.Abs(float64(fb-fa)) > 0.1*float64(fa) {
					t.Errorf("flood answered %d then %d in seconds %d and %d: more than 10%% apart", fa, fb, s-1, s)
				}
			}
			lifted := -1
			for i, at := range res.levelAt {
				if at >= floodTo && math.IsInf(res.level[i], 1) && !res.overloaded[i] {
					lifted = i
					break
				}
			}
			if lifted < 0 || res.levelAt[lifted]-floodTo > 2*time.Second {
				t.Errorf("limits not lifted within 2 s of the flood's end")
			} else {
				t.Logf("lifted %v after the flood", res.levelAt[lifted]-floodTo)
			}
			// Its fair share: what the light ones leave of the target.
			fair := (simC - 50.0*simC/200) / (3 * simC)
			if got := res.share("flood", 2, 7); got < 0.8*fair || got > 1.2*fair {
				t.Errorf("flood answered %.3f, want its fair share %.3f ± 20%%", got, fair)
			}
			t.Logf("capacity %.0f, level at 5 s %.0f, light %.4f, flood %.3f", res.ctrl.rate, res.level[200], got, res.share("flood", 2, 7))
		})
	}
}

// TestCapacitySimSpread: (c) 3 C spread over 5,000 random /24s and three resolvers
// with valid cookies: the resolvers get 99%, served first; the spread flood fills
// what they leave.
func TestCapacitySimSpread(t *testing.T) {
	exhaustiveOnly(t, "TestCapacitySimFlood/quota0s-configured0")
	res := simServer{capacity: simC, queueLen: 256}.run(t, 6*time.Second, []simSource{
		{name: "resolver1", rate: simC / 100, addr: host(192, 0, 2, 1), proven: true},
		{name: "resolver2", rate: simC / 100, addr: host(192, 0, 2, 2), proven: true},
		{name: "resolver3", rate: simC / 100, addr: host(198, 51, 100, 3), proven: true},
		{name: "spread", rate: 3 * simC, from: time.Second, addr: randomNets(1, 5000)},
	})
	for _, name := range []string{"resolver1", "resolver2", "resolver3"} {
		if got := res.share(name, 2, 6); got < 0.99 {
			t.Errorf("%s answered %.4f, want >= 0.99", name, got)
		}
	}
	for s := 2; s < 6; s++ {
		if float64(res.served1s[s]) < 0.85*simC {
			t.Errorf("second %d: served %d, want >= 85%% of C", s, res.served1s[s])
		}
	}
	t.Logf("spread answered %.3f, level %.2f", res.share("spread", 2, 6), res.level[len(res.level)-1])
}

// TestCapacitySimCeiling: requests-per-second stays a ceiling: the flood's /24 never
// gets more than it, overload or not.
func TestCapacitySimCeiling(t *testing.T) {
	light, _ := lightNets(0)
	res := simServer{capacity: simC, queueLen: 256, requestsPerSec: 200}.run(t, 4*time.Second,
		append(light, simSource{name: "flood", rate: 3 * simC, from: time.Second, addr: subnet24(10, 200, 7)}))
	for i, lim := range res.limits {
		if lim[nodeIPv4First+1] > fixedFromFloat(200) {
			t.Fatalf("sample %d: /24 limit %v over requests-per-second", i, lim[nodeIPv4First+1].Float64())
		}
	}
	// The ceiling alone keeps the server out of overload.
	if got := res.share("flood", 2, 4); got > 1.2*200/(3*simC) {
		t.Errorf("flood answered %.4f, over the ceiling's share", got)
	}
	if slices.Contains(res.overloaded, true) {
		t.Errorf("overloaded although the ceiling keeps the arrivals under the capacity")
	}
}

// TestCapacitySimConfigured: a configured capacity below the server's own is what the
// limits aim at, whatever the queues show: over the flood the server reads it
// within 3%, each second within the noise of random arrivals and draws (7%).
func TestCapacitySimConfigured(t *testing.T) {
	exhaustiveOnly(t, "TestCapacitySimFlood/quota0s-configured0")
	light, _ := lightNets(0)
	res := simServer{capacity: simC, queueLen: 256, configured: 3000}.run(t, 6*time.Second,
		append(light, simSource{name: "flood", rate: 3 * simC, from: time.Second, addr: subnet24(10, 200, 7)}))
	total := 0
	for s := 2; s < 6; s++ {
		got := res.served1s[s]
		total += got
		if got < 0.9*3000 || got > 1.07*3000 {
			t.Errorf("second %d: served %d, want 90%% to 107%% of 3000", s, got)
		}
	}
	if mean := float64(total) / 4; mean < 0.95*3000 || mean > 1.03*3000 {
		t.Errorf("served %.0f a second over the flood, want 3000 within 3%%", mean)
	}
}

// TestCapacitySimDip: the server slows to half its capacity for 300 ms during a
// flood: the capacity falls with it, so that the queue stops overflowing, and comes
// back within two seconds of the end of the slowdown.
func TestCapacitySimDip(t *testing.T) {
	exhaustiveOnly(t, "TestCapacitySimFlood/quota0s-configured0")
	light, names := lightNets(0)
	srv := simServer{capacity: simC, queueLen: 256, speed: dip(3*time.Second, 3300*time.Millisecond, 0.5)}
	res := srv.run(t, 7*time.Second, append(light, simSource{name: "flood", rate: 3 * simC, from: time.Second, addr: subnet24(10, 200, 7)}))
	for s := 5; s < 7; s++ {
		if float64(res.served1s[s]) < 0.85*simC {
			t.Errorf("second %d: served %d, want >= 85%% of C again", s, res.served1s[s])
		}
	}
	if res.overflow[4] != 0 {
		t.Errorf("%d lost to the full queue in the second after the slowdown", res.overflow[4])
	}
	got := float64(sumOver(res.served, names, 4, 7)) / float64(sumOver(res.sent, names, 4, 7))
	if got < 0.99 {
		t.Errorf("light /24s answered %.4f after the slowdown, want >= 0.99", got)
	}
	t.Logf("served per second %v, lost %v, R at the end %.0f", res.served1s, res.overflow, res.ctrl.rate)
}

// TestCapacitySimSlower: the server becomes a third slower for good during a flood
// (another process keeps part of its processor). The first fall may be a pause, so
// the capacity returns towards its measurement once; when that overflows again the
// server is slower, and the capacity stays down: from then on nothing is lost to the
// full queue.
func TestCapacitySimSlower(t *testing.T) {
	exhaustiveOnly(t, "TestCapacitySimFlood/quota0s-configured0")
	light, names := lightNets(0)
	srv := simServer{capacity: simC, queueLen: 256, speed: dip(3*time.Second, time.Hour, 0.65)}
	res := srv.run(t, 12*time.Second, append(light, simSource{name: "flood", rate: 3 * simC, from: time.Second, addr: subnet24(10, 200, 7)}))
	t.Logf("served per second %v, lost %v, R at the end %.0f", res.served1s, res.overflow, res.ctrl.rate)
	for s := 8; s < 12; s++ {
		if res.overflow[s] != 0 {
			t.Errorf("second %d: %d lost to the full queue, want none once the capacity followed the slower server", s, res.overflow[s])
		}
		if float64(res.served1s[s]) < 0.85*0.65*simC {
			t.Errorf("second %d: served %d, want >= 85%% of the slower capacity", s, res.served1s[s])
		}
	}
	got := float64(sumOver(res.served, names, 8, 12)) / float64(sumOver(res.sent, names, 8, 12))
	if got < 0.99 {
		t.Errorf("light /24s answered %.4f once the capacity followed, want >= 0.99", got)
	}
}

// TestCapacitySimSlowStart: the server is slow while the first measurement is taken
// (another process has its processor for the flood's first 200 ms), so the capacity
// first comes out low. Its queue, still full from the start while the limits take
// hold, shows the server reading faster, and the capacity rises to it: from 2 s into
// the flood it answers at least 85% of C, without overflowing.
func TestCapacitySimSlowStart(t *testing.T) {
	exhaustiveOnly(t, "TestCapacitySimFlood/quota0s-configured0")
	light, names := lightNets(0)
	srv := simServer{capacity: simC, queueLen: 256, speed: dip(time.Second, 1200*time.Millisecond, 0.6)}
	res := srv.run(t, 7*time.Second, append(light, simSource{name: "flood", rate: 3 * simC, from: time.Second, addr: subnet24(10, 200, 7)}))
	t.Logf("served per second %v, lost %v, R at the end %.0f", res.served1s, res.overflow, res.ctrl.rate)
	for s := 3; s < 7; s++ {
		if float64(res.served1s[s]) < 0.85*simC {
			t.Errorf("second %d: served %d, want >= 85%% of C (%d)", s, res.served1s[s], simC)
		}
		if res.overflow[s] != 0 {
			t.Errorf("second %d: %d lost to the full queue", s, res.overflow[s])
		}
	}
	if got := float64(sumOver(res.served, names, 2, 7)) / float64(sumOver(res.sent, names, 2, 7)); got < 0.99 {
		t.Errorf("light /24s answered %.4f, want >= 0.99", got)
	}
}

// TestCapacityReadsSpaceOut: under an auto overload the controller reads the
// sketches every capacityStepEvery while the level they give moves, and twice as
// late at each read, up to a second, while it holds; the first reads of an overload
// come every capacityStepEvery again. The queue stands at half full throughout, the
// server reading 1,000 a second; the cells send 200 groups of 50 a second, or 200 and
// 140 in turn at each read (the level moves by 30%).
func TestCapacityReadsSpaceOut(t *testing.T) {
	groups := func(n int) []float64 {
		out := make([]float64, n)
		for i := range out {
			out[i] = 50
		}
		return out
	}
	for _, c := range []struct {
		name     string
		moving   bool
		min, max int // reads from the overload's second to its fourth
	}{
		{"steady", false, 2, 5},
		{"moving", true, 9, 11},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctrl := newCapacityController(0)
			var in capacityInput
			in.QueueLimit, in.Sockets = 1000, 1
			reads, counted, n := 0, false, 200
			nodes := func() []capacityNode {
				if counted {
					reads++
				}
				if c.moving {
					n = 340 - n
				}
				return []capacityNode{curveNode(0, 1, math.Inf(1), groups(n))}
			}
			for now := int64(0); now < int64(4*time.Second); now += int64(capacitySampleEvery) {
				in.Now = now
				in.Queued = 500
				in.Served += 25 // 1,000 a second
				in.Admitted += 25
				in.Demand += 250
				ctrl.step(in, nodes)
				counted = ctrl.overloaded && now >= int64(2*time.Second)
			}
			if !ctrl.overloaded {
				t.Fatal("no overload with the queue standing")
			}
			if reads < c.min || reads > c.max {
				t.Errorf("%d reads in 2 s of overload, want %d to %d", reads, c.min, c.max)
			}
		})
	}
}
