package rrl

import (
	"runtime"
	"sync"
	"sync/atomic"
	_ "unsafe" // for go:linkname
)

// Statistics and the query counts of qps-scale are kept per P, the Go runtime's
// processor (GOMAXPROCS of them run goroutines at once). A Debit counts in the
// stripe of the P its goroutine runs on, pinned to it for the few instructions of
// the count: the stripe's cache lines stay with one core and the counts need no
// atomic read-modify-write, where counters shared by the cores moved a cache line
// between them on most calls. A goroutine on a P beyond the stripes made by New
// (GOMAXPROCS raised later) counts in one spill stripe under a mutex.

// procPin pins the calling goroutine to its P and returns the P's id: until
// procUnpin the goroutine is neither preempted nor moved, so no other goroutine runs
// on that P. (The runtime keeps these two for packages that link to them, as
// sync.Pool-style per-P data needs.)
//
//go:linkname procPin runtime.procPin
func procPin() int

//go:linkname procUnpin runtime.procUnpin
func procUnpin()

// stripe is one P's share of the counts. Only the goroutine pinned to the P
// writes it; GetStats and qps-scale read it at any time.
type stripe struct {
	c counters

	// qps-scale: queries in second qsec and in the second before it.
	qsec  atomic.Int64
	qcur  ownedWord
	qprev ownedWord

	_ [64]byte // keeps the next stripe's counts off this stripe's cache lines
}

// stripes are an RRL's per-P counts.
type stripes struct {
	perP    []stripe
	spillMu sync.Mutex
	spill   stripe
}

func (ss *stripes) init() {
	ss.perP = make([]stripe, max(runtime.GOMAXPROCS(0), runtime.NumCPU()))
}

// own returns the calling goroutine's stripe, which it alone writes until it
// hands the stripe back with done: its P's stripe, the goroutine pinned to the P,
// or the spill stripe, locked. The caller must not block in between.
func (ss *stripes) own() *stripe {
	if pid := procPin(); pid < len(ss.perP) {
		return &ss.perP[pid]
	}
	procUnpin()
	ss.spillMu.Lock()
	return &ss.spill
}

// done hands back a stripe returned by own.
func (ss *stripes) done(st *stripe) {
	if st == &ss.spill {
		ss.spillMu.Unlock()
		return
	}
	procUnpin()
}

// all calls f with every stripe, for reading.
func (ss *stripes) all(f func(*stripe)) {
	for i := range ss.perP {
		f(&ss.perP[i])
	}
	f(&ss.spill)
}

// countQuery counts a query for qps-scale in second sec.
func (st *stripe) countQuery(sec int64) {
	switch cur := st.qsec.Load(); {
	case sec == cur:
	case sec == cur+1:
		st.qprev.store(st.qcur.load())
		st.qcur.store(0)
		st.qsec.Store(sec)
	case sec > cur:
		st.qprev.store(0)
		st.qcur.store(0)
		st.qsec.Store(sec)
	case sec == cur-1: // a reading a tick older than another goroutine's
		st.qprev.inc()
		return
	default:
		return
	}
	st.qcur.inc()
}

// queriesIn returns the stripe's query count of second sec, as far as it knows it.
func (st *stripe) queriesIn(sec int64) uint64 {
	switch st.qsec.Load() {
	case sec:
		return st.qcur.load()
	case sec + 1:
		return st.qprev.load()
	}
	return 0
}
