//go:build linux

package rrl

import (
	"context"
	"net/netip"
	"time"
)

// The kernel filter's limiting events. The program only records the groups it
// refuses (limited.go); WatchLimited turns the changes of that list into the same
// LimitEvents an RRL and a Limiter report, so that one log shows who is limited
// wherever the limiting happens.

// limitedKey identifies one kernel group between two looks at the list.
type limitedKey struct {
	node  LimiterNode
	group netip.Prefix
	port  uint16
}

// WatchLimited reports through fn when the kernel filter starts limiting a source
// group and when it stops (the group has left LimitedGroups), looking every interval
// (a second when 0) until ctx is done or the Filter is closed. The events have Account
// AccountGroup, the group's level in Node, its prefix in Network (the zero Prefix for
// the port and total levels) and its source port in Port; a start comes when the
// group is first listed, a stop when it no longer is, about five seconds after its
// last recorded refusal. As for an RRL, at most perSecond events are reported in a
// second (the default when 0), the rest counted in the next event's Suppressed, and a
// group whose start was suppressed reports no stop.
func (f *Filter) WatchLimited(ctx context.Context, interval time.Duration, perSecond int, fn func(LimitEvent)) error {
	if interval <= 0 {
		interval = time.Second
	}
	if perSecond <= 0 {
		perSecond = defaultEventsPerSecond
	}
	w := limitedWatch{budget: eventBudget{perSec: perSecond}, started: map[limitedKey]LimitEvent{}}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		groups, err := f.LimitedGroups()
		if err != nil {
			return err
		}
		for _, e := range w.changes(groups, time.Now()) {
			fn(e)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// limitedWatch follows the kernel's list of limited groups from one look to the next.
type limitedWatch struct {
	budget  eventBudget
	started map[limitedKey]LimitEvent // groups whose start was reported
	seen    map[limitedKey]bool       // groups listed at the previous look
}

// changes returns the events between the previous look and groups, seen at now.
func (w *limitedWatch) changes(groups []LimitedGroup, now time.Time) []LimitEvent {
	var out []LimitEvent
	listed := make(map[limitedKey]bool, len(groups))
	for _, g := range groups {
		k := limitedKey{g.Node, g.Group, g.Port}
		listed[k] = true
		if e, ok := w.started[k]; ok {
			e.Rate, e.Limit = g.Rate, g.Limit // for the stop
			w.started[k] = e
			continue
		}
		if w.seen[k] {
			continue // its start was suppressed: no stop either
		}
		if !w.budget.take(now.UnixNano()) {
			continue
		}
		e := LimitEvent{Time: now, Account: AccountGroup, Node: g.Node, Port: g.Port, Rate: g.Rate, Limit: g.Limit}
		if g.Node != NodePort && g.Node != NodeTotal {
			e.Network = g.Group
		}
		w.budget.stamp(&e)
		w.started[k] = e
		out = append(out, e)
	}
	for k, e := range w.started {
		if listed[k] || !w.budget.take(now.UnixNano()) {
			continue
		}
		e.Stop, e.Duration, e.Time = true, now.Sub(e.Time), now
		w.budget.stamp(&e)
		delete(w.started, k)
		out = append(out, e)
	}
	w.seen = listed
	return out
}
