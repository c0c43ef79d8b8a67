package rrl

import "time"

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
	l       *Limiter
	conns   func() []queueSocket
	queues  queueWatch
	scratch capacityScratch
}

func (g *limiterCapacity) sample(now int64) (capacityInput, error) {
	in := g.queues.read(g.conns())
	st := g.l.Stats()
	judged := st.IPv4 + st.IPv6
	in.Now = now
	in.Overflow = g.queues.account(0)
	in.Admitted = subFloor(judged, st.Limited)
	in.fixed = st.Exempt
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

// startCapacity starts the controller of p's Go Limiter l when p's Config has
// capacity on; p.limMu is held.
func (p *Protection) startCapacity(l *Limiter) {
	if l == nil || p.limCfg.capacity == 0 || p.capacity != nil {
		return
	}
	src := &limiterCapacity{l: l, conns: p.capacitySockets}
	p.capacity = startCapacity(p.limCfg, src, limiterNow)
	l.capacity.Store(p.capacity)
}

// capacitySockets returns the UDP sockets p serves through servers of its own
// (Protect, AddUDP): their receive queues are the ones the controller can read.
func (p *Protection) capacitySockets() []queueSocket {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]queueSocket, 0, len(p.udp))
	for _, c := range p.udp {
		out = append(out, queueSocket{key: c, conn: c})
	}
	return out
}

// updateCapacity follows an Update of p to cfg; p.limMu is held. A controller turned
// off is told to stop, not waited for: it ends at its next sample, and the water
// level it may still set is nothing to a Limiter whose capacity is off. The Go
// Limiter, made when a query first needs it, starts its controller then.
func (p *Protection) updateCapacity(cfg *Config) {
	l := p.limiter.Load()
	switch {
	case l == nil:
	case p.capacity != nil && cfg.capacity == 0:
		close(p.capacity.stop)
		l.capacity.Store(nil)
		p.capacity = nil
	case p.capacity != nil:
		p.capacity.update(cfg)
	default:
		p.startCapacity(l)
	}
}

// stopCapacity ends p's controller and waits for it. Neither p.mu nor p.limMu may
// be held: the controller reads p's sockets under p.mu.
func (p *Protection) stopCapacity() {
	p.limMu.Lock()
	r := p.capacity
	p.capacity = nil
	p.limMu.Unlock()
	r.stopAndWait()
}
