package rrl

import (
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dnsrake/rrl/internal/sockopt"
)

// Running the capacity controller: a goroutine of the process that owns the limiter
// (the kernel Filter's, see capacity_linux.go, or a Protection's Go Limiter) samples
// a capacitySource every few tens of milliseconds (capacityController.sampleEvery),
// steps the controller and puts the
// water level in force, and keeps the status that Stats reports.

// capacitySource is what a controller is run over.
type capacitySource interface {
	// sample reads the counters and the queues at now.
	sample(now int64) (capacityInput, error)
	// nodes reads the adjusted nodes' cells at now.
	nodes(now int64) []capacityNode
	// apply puts the water level in force (0: none).
	apply(level float64) error
}

// sharedSource is what a source adds whose filter other processes share (a pinned
// filter's, capacity_linux.go): whether another process's write lifted the level,
// which must then be written again, and the status to tell them at every step.
type sharedSource interface {
	takeRewrite() bool
	publish(CapacityStats)
}

// errNoSocket: capacity auto has no receive queue to watch.
var errNoSocket = errors.New("rrl: capacity auto: no socket whose receive queue can be read; the static limits stay in force")

// errCapacityOff: a pinned filter's Config has the capacity mode off
// (RunCapacity).
var errCapacityOff = errors.New("rrl: capacity: off in the configuration (keyword capacity); the controller waits for it")

// capacityRun is one running controller.
//
// Its goroutine calls the event function (overload events) holding no lock, as the
// last thing of a sample, and the function may call anything, Close included, on the
// Protection or Filter the controller runs for, from that goroutine. So whoever stops
// the controller waits for its goroutine only when it is not in the event function
// (halt): waiting there would wait for the caller itself, or for a function blocked
// on a lock the one who stops holds. A controller told to stop while in the function
// touches nothing more, and its goroutine returns as soon as the function does.
type capacityRun struct {
	stop chan struct{} // closed by halt
	done chan struct{} // closed when the goroutine has returned
	// samples counts the samples taken: the pace the controller keeps (tests).
	samples atomic.Uint64

	mu      sync.Mutex
	stopped bool // halt was called
	calling bool // the goroutine is in the event function
	status  CapacityStats
	cfg     *Config // for events and the configured capacity; replaced by update
	events  eventBudget
	// started: the current overload's start was reported (so its stop is too).
	started bool
	// names computes the names level (capacity_names.go); the goroutine's own.
	names *namesController
	// pendingNames are the names events to report at the end of the step.
	pendingNames []LimitEvent
}

// startCapacity starts a controller over src for cfg's capacity keyword, sampling
// with clock (nanoseconds of a monotonic clock); the caller stops it with stop.
func startCapacity(cfg *Config, src capacitySource, clock func() int64) *capacityRun {
	r := &capacityRun{stop: make(chan struct{}), done: make(chan struct{}), cfg: cfg}
	r.events.perSec = cfg.eventsPerSec()
	r.status = idleCapacityStats(cfg)
	go r.run(src, clock)
	return r
}

// idleCapacityStats is the status of cfg's capacity mode before any sample: auto
// or the configured capacity, nothing measured, no overload.
func idleCapacityStats(cfg *Config) CapacityStats {
	return CapacityStats{Auto: cfg.capacity < 0, Capacity: max(cfg.capacity, 0)}
}

// halt tells the controller to stop: it ends at once when it waits for its next
// sample, else once the sample under way is done, and reports no more events. It
// returns whether the controller may be waited for: false while its goroutine is in
// the event function.
func (r *capacityRun) halt() (waitable bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.stopped {
		r.stopped = true
		close(r.stop)
	}
	return !r.calling
}

// stopAndWait ends the controller and waits for it, unless its goroutine is in the
// event function (see halt); the limits it set stay.
func (r *capacityRun) stopAndWait() {
	if r == nil {
		return
	}
	if r.halt() {
		<-r.done
	}
}

// report gives ev to fn unless the controller was told to stop, marking the
// goroutine as in the event function meanwhile.
func (r *capacityRun) report(fn func(LimitEvent), ev LimitEvent) {
	r.mu.Lock()
	if r.stopped {
		r.mu.Unlock()
		return
	}
	r.calling = true
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.calling = false
		r.mu.Unlock()
	}()
	fn(ev)
}

// update gives the controller a new Config (the capacity keyword, events).
func (r *capacityRun) update(cfg *Config) {
	r.mu.Lock()
	r.cfg = cfg
	r.events.perSec = cfg.eventsPerSec()
	r.mu.Unlock()
}

// stats returns the status, nil for no controller.
func (r *capacityRun) stats() *CapacityStats {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.status
	return &s
}

func (r *capacityRun) run(src capacitySource, clock func() int64) {
	defer close(r.done)
	t := time.NewTimer(capacitySampleIdle)
	defer t.Stop()
	r.mu.Lock()
	configured := r.cfg.capacity
	r.mu.Unlock()
	ctrl := newCapacityController(configured)
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
		}
		r.mu.Lock()
		cfg := r.cfg
		r.mu.Unlock()
		if cfg.capacity != configured {
			// Another capacity: start afresh (the controller keeps nothing
			// that the next samples do not give it again).
			configured = cfg.capacity
			ctrl = newCapacityController(configured)
		}
		r.step(ctrl, src, clock(), cfg)
		r.samples.Add(1)
		t.Reset(ctrl.sampleEvery())
	}
}

// step samples src once and applies the controller's decision.
func (r *capacityRun) step(ctrl *capacityController, src capacitySource, now int64, cfg *Config) {
	var problem error
	in, err := src.sample(now)
	var dec capacityDecision
	shared, _ := src.(sharedSource)
	if shared != nil && shared.takeRewrite() && !math.IsInf(ctrl.written, 1) {
		ctrl.written = -1 // another process's write lifted the level: write it again
	}
	switch {
	case err != nil:
		problem = err
		dec = ctrl.reset()
	case cfg.capacity == 0:
		// Only a pinned filter's controller runs with the mode off, waiting for it.
		problem = errCapacityOff
		dec = ctrl.reset()
	case in.Sockets == 0 && ctrl.configured <= 0:
		problem = errNoSocket
		dec = ctrl.reset()
	default:
		ctrl.absorb = r.names.absorb() // capacity_names.go
		dec = ctrl.step(in, func() []capacityNode { return src.nodes(now) })
	}
	if dec.Write {
		level := dec.Level
		if math.IsInf(level, 1) {
			level = 0
		}
		if err := src.apply(level); err != nil {
			problem = err
			ctrl.written = -1 // write again at the next sample
		}
	}
	st := ctrl.status()
	if err == nil {
		problem = r.stepNames(src, in, st, problem) // capacity_names.go
	}
	ev, report := r.event(dec, st, now, cfg)
	r.mu.Lock()
	r.status = CapacityStats{
		Auto: ctrl.configured <= 0, Capacity: st.capacity, Overloaded: st.overloaded,
		Demand: st.demand, Target: st.target, Overloads: st.overloads,
	}
	if st.overloaded {
		r.status.Since = time.Now().Add(-time.Duration(now - st.since))
		if !math.IsInf(st.level, 1) {
			r.status.Level = st.level
		}
	}
	if problem != nil {
		r.status.Problem = problem.Error()
	}
	published := r.status
	r.mu.Unlock()
	if shared != nil {
		shared.publish(published) // a pinned filter's controller tells every process
	}
	if report {
		// Last, holding no lock: the function may call Stats, Update or Close.
		r.report(cfg.eventFunc, ev)
	}
	r.reportNames(cfg.eventFunc) // capacity_names.go
}

// event returns the overload event of dec, if there is one to report: a start or a
// stop, at most events-per-second of them in a second (as for every limiting event),
// the others counted in the next one's Suppressed; an overload whose start was
// suppressed reports no stop.
func (r *capacityRun) event(dec capacityDecision, st capacityStatus, now int64, cfg *Config) (LimitEvent, bool) {
	if cfg.eventFunc == nil || !dec.Start && !dec.Stop {
		return LimitEvent{}, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if dec.Stop && !r.started {
		return LimitEvent{}, false
	}
	if !r.events.take(now) {
		r.started = false
		return LimitEvent{}, false
	}
	ev := LimitEvent{
		Stop: dec.Stop, Time: time.Now(), Account: AccountCapacity,
		Limit: st.capacity, Rate: st.demand, ReportOnly: cfg.reportOnly,
	}
	if dec.Stop {
		r.started = false
		ev.Duration = time.Duration(now - st.since)
	} else {
		r.started = true
	}
	r.events.stamp(&ev)
	return ev, true
}

// queueSocket is a socket whose receive queue a controller watches, with a key
// identifying it from one read to the next.
type queueSocket struct {
	key  any
	conn syscall.Conn
}

// queueWatch follows the receive queues of a set of sockets: their fill, and the
// packets they lost because they were full.
type queueWatch struct {
	drops    map[any]uint32 // each socket's drop counter at the previous read
	next     map[any]uint32 // storage for the next read's, swapped with drops
	delta    uint64         // drops since the previous read, of sockets read both times
	filtered uint64         // the filter's own drops at the previous account
	started  bool
	carry    int64 // drops not yet told apart from the filter's (see account)
	overflow uint64
	// unit is the least nonzero fill of one socket's queue seen, in bytes: one
	// packet's share of the buffer (its true size, which the kernel charges), by
	// which the bytes queued count packets. 0: none seen yet.
	unit uint64
}

// queueCarryFloor bounds how far the filter's drops may run ahead of the sockets'
// (packets judged but not yet counted by their socket, and drops on sockets not
// watched), so that they cannot hide later overflows for long.
const queueCarryFloor = 256

// read returns the queues' fill summed over the sockets it could read (Queued,
// QueueLimit, Sockets) and notes their drops since the previous read.
func (w *queueWatch) read(socks []queueSocket) capacityInput {
	var in capacityInput
	if w.next == nil {
		w.next = make(map[any]uint32, len(socks))
	}
	next := w.next
	clear(next)
	w.delta = 0
	for _, s := range socks {
		queued, size, drops, err := sockopt.ReceiveQueue(s.conn)
		if err != nil {
			continue
		}
		in.Queued += uint64(queued)
		in.QueueLimit += uint64(size)
		if queued > 0 && (w.unit == 0 || uint64(queued) < w.unit) {
			w.unit = uint64(queued)
		}
		in.Sockets++
		if prev, ok := w.drops[s.key]; ok {
			w.delta += uint64(drops - prev) // modulo 2^32, as the kernel counts
		}
		next[s.key] = drops
	}
	w.drops, w.next = next, w.drops
	if w.unit > 0 {
		// A queue of mixed sizes counts as packets of the smallest: the
		// count errs high, and what the server read (capacityInput.Served less
		// the count) low. The kernel also frees a busy reader's bytes in
		// batches (a quarter of the buffer for UDP), which errs the same way.
		in.QueuedPackets = float64(in.Queued) / float64(w.unit)
	}
	return in
}

// account returns the packets lost to full queues so far, given how many the
// socket filter dropped itself so far (0 where it keeps no count): a socket's drop
// counter counts both.
func (w *queueWatch) account(filtered uint64) uint64 {
	df := uint64(0)
	if w.started && filtered >= w.filtered {
		df = filtered - w.filtered
	}
	w.started, w.filtered = true, filtered
	w.carry = max(w.carry+int64(w.delta)-int64(df), -queueCarryFloor)
	if w.carry > 0 {
		w.overflow += uint64(w.carry)
		w.carry = 0
	}
	return w.overflow
}

// subFloor is a-b, or 0 when b is larger (counters read at slightly different
// moments).
func subFloor(a, b uint64) uint64 {
	if b > a {
		return 0
	}
	return a - b
}
