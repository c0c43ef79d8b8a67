package rrl

import (
	"sync/atomic"
	"time"
)

// The capacity controller of a Go Limiter, for servers where the eBPF filter is not in
// force: a Protection runs it over its Limiter and the UDP sockets whose reads the
// Limiter judges. There it protects the Handler's work, not the sockets: the queries
// it refuses have been read already (a read costs the server about a microsecond,
// answering one many times that), so under a flood the receive queues can still
// overflow when even reading and refusing cannot keep up, and its capacity is the
// rate of queries the server reads and passes on while they overflow. The classic
// prefilter's drops count as overflow there (it keeps no counters).

// limiterCapacity is the capacitySource of a Go Limiter's controller.
type limiterCapacity struct {
	l *Limiter
	// owner is the Protection whose sockets' queues the controller reads: the one
	// that started it, then the successor it is handed to (limiter_handover.go).
	owner   atomic.Pointer[Protection]
	queues  queueWatch
	scratch capacityScratch
}

func (g *limiterCapacity) sample(now int64) (capacityInput, error) {
	var socks []queueSocket
	if p := g.owner.Load(); p != nil {
		socks = p.capacitySockets()
	}
	in := g.queues.read(socks)
	c := g.l.counts()
	judged := c.judged[0] + c.judged[1]
	in.Now = now
	in.Overflow = g.queues.account(0)
	in.Admitted = subFloor(judged, c.refused)
	in.fixed = c.exempt
	in.Served = in.Admitted + in.fixed
	in.Demand = judged + in.fixed + in.Overflow
	return in, nil
}

func (g *limiterCapacity) nodes(now int64) []capacityNode { return g.l.capacityNodes(now, &g.scratch) }

func (g *limiterCapacity) apply(level float64) error {
	g.l.setCapacityLevel(level)
	return nil
}

// limiterNow is the clock of the Go Limiter's sketches (see coarseNanos).
func limiterNow() int64 { return int64(time.Since(clockBase)) }
