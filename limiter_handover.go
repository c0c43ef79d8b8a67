package rrl

// A reload's successor carries on with its predecessor's Go Limiter. A host that
// reloads (CoreDNS) makes a new Protection for the same sockets, which takes the
// kernel filter over with its sketches (takeOver); where the Go Limiter judges
// queries (the classic prefilter, sockets without the eBPF filter), what it has
// measured and learnt must pass on the same way, or a reload during a flood would
// start every estimate from nothing and make every existing name unknown again,
// until the server's answers teach them once more (docs/names.md).

// inheritLimiter makes pred's Go Limiter p's, when p has none yet: its sketches, its
// water level and names level, the names it learnt and the names judge's zone
// sketch carry on under p's Config (Limiter.Update), and so does its capacity
// controller, which from now on reads p's sockets and reports to p's event
// function. pred still judges with it the queries it drains, but no longer updates
// it nor stops its timers when it closes. holders and p.mu are held.
func (p *Protection) inheritLimiter(pred *Protection) {
	p.limMu.Lock()
	defer p.limMu.Unlock()
	if p.limiter.Load() != nil || p.capClosed {
		return
	}
	pred.limMu.Lock()
	defer pred.limMu.Unlock()
	l := pred.limiter.Load()
	if l == nil || pred.limGiven {
		return
	}
	if err := l.Update(p.limCfg); err != nil {
		return // NewProtection checked the Config: p makes a Limiter of its own
	}
	p.limiter.Store(l)
	pred.limGiven = true
	p.capacity, p.capSrc = pred.capacity, pred.capSrc
	pred.capacity, pred.capSrc = nil, nil
	if p.capSrc != nil {
		p.capSrc.owner.Store(p)
	}
	p.updateCapacity(p.limCfg) // capacity_go.go: the new Config's capacity keyword
}
