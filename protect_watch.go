package rrl

import (
	"sync"
	"time"
)

// kernelWatchInterval is how often a Protection looks at the eBPF filter's limited
// groups while its Config has an event function.
const kernelWatchInterval = time.Second

// kernelWatch reports a Protection's eBPF filter's limiting events (as
// Filter.WatchLimited does) to the event function of the Protection's latest Config.
// One goroutine looks at the filter while there is an event function, and waits
// while there is none; the function and the events-per-second bound are read at
// every look and every report, so Update turns events on or off or redirects them
// from the next report on. The goroutine calls the event function holding no lock,
// so the function may call the Protection, Close included.
type kernelWatch struct {
	filter *Filter

	mu       sync.Mutex
	interval time.Duration
	fn       func(LimitEvent) // nil: events off
	perSec   int
	err      error // the latest look's error
	started  bool  // the goroutine was started
	calling  bool  // the goroutine is in fn
	closed   bool
	wake     chan struct{} // events turned on, or closed
	ended    chan struct{} // closed when the goroutine returns
}

// newKernelWatch returns the watch of f, reporting to fn (none while nil).
func newKernelWatch(f *Filter, fn func(LimitEvent), perSec int) *kernelWatch {
	w := &kernelWatch{filter: f, interval: kernelWatchInterval, wake: make(chan struct{}, 1), ended: make(chan struct{})}
	w.set(fn, perSec)
	return w
}

// set makes the watch report to fn (none when nil), at most perSec events a second.
// It does not wait for a report under way.
func (w *kernelWatch) set(fn func(LimitEvent), perSec int) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	wasOff := w.fn == nil
	w.fn, w.perSec = fn, perSec
	switch {
	case fn == nil:
	case !w.started:
		w.started = true
		go w.run()
	case wasOff:
		w.signal()
	}
}

// signal wakes the goroutine if it waits; w.mu is held.
func (w *kernelWatch) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// close stops the watch: no report starts once it has returned. It waits for the
// goroutine to return unless the goroutine is calling the event function (which
// may be what called close); the goroutine then returns as soon as the function
// does, without touching the filter again.
func (w *kernelWatch) close() {
	if w == nil {
		return
	}
	w.mu.Lock()
	w.closed = true
	wait := w.started && !w.calling
	w.signal()
	w.mu.Unlock()
	if wait {
		<-w.ended
	}
}

// lastErr is the error of the latest look, nil when it succeeded or events are off.
func (w *kernelWatch) lastErr() error {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// run looks at the filter every interval while there is an event function.
func (w *kernelWatch) run() {
	defer close(w.ended)
	w.mu.Lock()
	t := time.NewTicker(w.interval)
	w.mu.Unlock()
	defer t.Stop()
	var lw *limitedWatch // nil while events are off: episodes seen before are forgotten
	for {
		w.mu.Lock()
		closed, on, perSec := w.closed, w.fn != nil, w.perSec
		if !on {
			w.err = nil
		}
		w.mu.Unlock()
		switch {
		case closed:
			return
		case !on:
			lw = nil
			<-w.wake
			continue
		case lw == nil:
			lw = newLimitedWatch(perSec)
		}
		lw.budget.perSec = perSec
		// An error (the filter's maps unreadable, say) is kept for Status, and
		// the looks go on: the next one may succeed.
		events, err := lw.look(w.filter)
		w.mu.Lock()
		w.err = err
		w.mu.Unlock()
		for _, e := range events {
			if !w.report(e) {
				return
			}
		}
		select {
		case <-w.wake:
		case <-t.C:
		}
	}
}

// report gives e to the current event function, if any; false once closed.
func (w *kernelWatch) report(e LimitEvent) bool {
	w.mu.Lock()
	fn, closed := w.fn, w.closed
	if closed || fn == nil {
		w.mu.Unlock()
		return !closed
	}
	w.calling = true
	w.mu.Unlock()
	fn(e)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.calling = false
	return !w.closed
}
