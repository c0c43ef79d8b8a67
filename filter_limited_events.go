package rrl

import (
	"context"
	"net/netip"
	"time"
)

// The kernel filter's limiting events. The program only records the groups it
// refuses (filter_limited.go); WatchLimited turns what it finds there, look after look, into
// the same LimitEvents an RRL and a Limiter report, so that one log shows who is
// limited wherever the limiting happens.
//
// A group's episode starts at the first look that lists it (a refusal of it recorded
// in the last five seconds) and stops at the first later look that finds its
// estimated rate under its limit, when the filter lets all its packets through again
// (the moment a Limiter's sweep ends a group's episode), or finds it no longer listed.
// It starts again only once a refusal is recorded after that look. The looks alone
// drive this, so a burst followed by silence is reported in full: its start at the
// first look after its first recorded refusal, its stop at the first look after the
// estimate has decayed under the limit.

// WatchLimited reports through fn when the kernel filter starts limiting a source
// group and when it stops, looking at LimitedGroups every interval (a second when 0)
// until ctx is done or an error ends it, which it returns (ErrClosed once the Filter
// is closed). A start comes at the first look that lists the group, a stop at the
// first later look that finds its estimated rate under its limit (or the group no
// longer listed): with the default interval, about a second after the first refusal
// the program records (one in sixteen, so a group refused only a few times may go
// unseen) and about a second after the group's rate fell under its limit.
//
// The events have Account AccountGroup, the group's level in Node, its prefix in
// Network (the zero Prefix for the port and total levels), its source port in Port,
// and ReportOnly set when the filter only reports what it would limit. As for an
// RRL, at most perSecond events are reported in a second (the default when 0), the
// rest counted in the next event's Suppressed, and a group whose start was
// suppressed reports no stop.
func (f *Filter) WatchLimited(ctx context.Context, interval time.Duration, perSecond int, fn func(LimitEvent)) error {
	if interval <= 0 {
		interval = time.Second
	}
	if perSecond <= 0 {
		perSecond = defaultEventsPerSecond
	}
	w := newLimitedWatch(perSecond)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		events, err := w.look(f)
		if err != nil {
			return err
		}
		for _, e := range events {
			fn(e)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// limitedKey identifies one kernel group between two looks at the list.
type limitedKey struct {
	node  LimiterNode
	group netip.Prefix
	port  uint16
}

// episodeState is where a listed group's episode stands.
type episodeState uint8

const (
	episodeStarted    episodeState = iota // its start was reported
	episodeSuppressed                     // its start was suppressed: no stop either
	episodeRecovered                      // it stopped, and is listed for refusals before that
)

// limitedEpisode is one group's episode.
type limitedEpisode struct {
	state       episodeState
	ev          LimitEvent // started: the start reported
	rate, limit float64    // started: as of the latest look
	at          time.Time  // recovered: the look that found it recovered
}

// limitedWatch follows the kernel's list of limited groups from one look to the next.
// Its user serialises calls; budget.perSec may change between looks.
type limitedWatch struct {
	budget eventBudget
	groups map[limitedKey]*limitedEpisode // listed groups, and started ones not yet stopped
}

func newLimitedWatch(perSecond int) *limitedWatch {
	return &limitedWatch{budget: eventBudget{perSec: perSecond}, groups: map[limitedKey]*limitedEpisode{}}
}

// look reads f's list and returns the events since the previous look.
func (w *limitedWatch) look(f *Filter) ([]LimitEvent, error) {
	groups, reportOnly, err := f.limitedLook()
	if err != nil {
		return nil, err
	}
	return w.changes(groups, reportOnly, time.Now()), nil
}

// changes returns the events between the previous look and groups, listed at now by
// a filter in report-only mode or not.
func (w *limitedWatch) changes(groups []GroupRate, reportOnly bool, now time.Time) []LimitEvent {
	var out []LimitEvent
	listed := make(map[limitedKey]bool, len(groups))
	for _, g := range groups {
		k := limitedKey{g.Node, g.Group, g.Port}
		listed[k] = true
		recovered := g.Limit == 0 || g.Rate < g.Limit
		ep := w.groups[k]
		switch {
		case ep == nil || ep.state == episodeRecovered && g.Last.After(ep.at):
			out = w.start(out, k, g, reportOnly, now)
		case ep.state == episodeStarted:
			ep.rate, ep.limit = g.Rate, g.Limit
			if recovered && w.stop(&out, ep, now) {
				ep.state, ep.at = episodeRecovered, now
			}
		case ep.state == episodeSuppressed && recovered:
			ep.state, ep.at = episodeRecovered, now
		}
	}
	for k, ep := range w.groups {
		switch {
		case listed[k]:
		case ep.state != episodeStarted || w.stop(&out, ep, now):
			delete(w.groups, k)
		}
	}
	return out
}

// start begins the episode of g, reporting its start if the budget allows.
func (w *limitedWatch) start(out []LimitEvent, k limitedKey, g GroupRate, reportOnly bool, now time.Time) []LimitEvent {
	if !w.budget.take(now.UnixNano()) {
		w.groups[k] = &limitedEpisode{state: episodeSuppressed}
		return out
	}
	e := LimitEvent{Time: now, Account: AccountGroup, Node: g.Node, Port: g.Port, Rate: g.Rate, Limit: g.Limit, ReportOnly: reportOnly}
	if g.Node != NodePort && g.Node != NodeTotal {
		e.Network = g.Group
	}
	w.budget.stamp(&e)
	w.groups[k] = &limitedEpisode{state: episodeStarted, ev: e, rate: g.Rate, limit: g.Limit}
	return append(out, e)
}

// stop reports the end of a started episode if the budget allows; if not, it is
// tried again at the next look.
func (w *limitedWatch) stop(out *[]LimitEvent, ep *limitedEpisode, now time.Time) bool {
	if !w.budget.take(now.UnixNano()) {
		return false
	}
	e := ep.ev
	e.Stop, e.Time, e.Duration = true, now, now.Sub(ep.ev.Time)
	e.Rate, e.Limit = ep.rate, ep.limit
	w.budget.stamp(&e)
	*out = append(*out, e)
	return true
}
