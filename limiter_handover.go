package rrl

// A reload's successor carries on with its predecessor's Go Limiter. A host that
// reloads (CoreDNS) makes a new Protection for the same sockets, which takes the
// kernel filter over with its sketches (takeOver); where the Go Limiter judges
// queries (the classic prefilter, sockets without the eBPF filter), what it has
// measured and learnt must pass on the same way, or a reload during a flood would
// start every estimate from nothing and make every existing name unknown again,
// until the server's answers teach them once more (docs/names.md). A Protection
// made WithoutFilter takes its predecessor's Limiter over by the sockets given to
// both (AttachLocal), when only one such predecessor holds them.

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

// goPredecessor returns the Protection whose Go Limiter p, made WithoutFilter, takes
// over when it is given sockets (AttachLocal): the one other open Protection without
// a filter that holds one of socks and still has its Limiter. With several (the
// Protections of several servers sharing the sockets, each with limits of its own)
// which one p succeeds is not known, and it returns nil: p starts afresh. holders and
// p.mu are held.
func goPredecessor(p *Protection, socks []foundSocket) *Protection {
	var found *Protection
	for q := range holders.open {
		if q == p || !q.opts.noFilter {
			continue
		}
		q.mu.Lock()
		holds := false
		for _, s := range q.socks {
			for _, f := range socks {
				holds = holds || (s.id != socketID{} && s.id == f.id)
			}
		}
		q.mu.Unlock()
		q.limMu.Lock()
		has := q.limiter.Load() != nil && !q.limGiven
		q.limMu.Unlock()
		if !holds || !has {
			continue
		}
		if found != nil {
			return nil
		}
		found = q
	}
	return found
}
