package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"
)

// binWidth is the resolution at which the server's receptions are counted.
const binWidth = 10 * time.Millisecond

// window is the width of the sliding window that decides convergence and release:
// wide enough to hold about a hundred packets at a 500 pps limit, so that the
// limiter's random drops do not throw a window out of the ±10% band by chance.
const window = 200 * time.Millisecond

// tolerance is the band around a target rate that counts as holding it.
const tolerance = 0.10

// series counts one traffic group's packets per binWidth since the run began: how
// many were sent and how many the server received (in classic mode: received and
// allowed by the Go limiter).
type series struct {
	Offered   []int
	Delivered []int
}

func newSeries(d time.Duration) series {
	n := int((d + binWidth - 1) / binWidth)
	return series{Offered: make([]int, n), Delivered: make([]int, n)}
}

func binOf(t time.Duration) int { return int(t / binWidth) }

// add counts one packet at t in bins, growing it when t is past its end (late
// receptions after the last send).
func add(bins *[]int, t time.Duration) {
	i := binOf(t)
	if i < 0 {
		i = 0
	}
	for i >= len(*bins) {
		*bins = append(*bins, 0)
	}
	(*bins)[i]++
}

// sum returns the number of packets in the bins covering [from, to).
func sum(bins []int, from, to time.Duration) int {
	n := 0
	for i := max(binOf(from), 0); i < binOf(to) && i < len(bins); i++ {
		n += bins[i]
	}
	return n
}

// rate is the packets per second in bins over [from, to).
func rate(bins []int, from, to time.Duration) float64 {
	if to <= from {
		return 0
	}
	return float64(sum(bins, from, to)) / (to - from).Seconds()
}

// within reports whether got lies within tol of want; for want 0, whether got is 0.
func within(got, want, tol float64) bool {
	return got >= want*(1-tol) && got <= want*(1+tol)
}

// hold is how long after a convergence or release time the group must, on average,
// stay where it got: a single window of about a hundred packets is within ±10% of
// its mean only two times in three, so without this a chance dip would count as
// converged early.
const hold = 500 * time.Millisecond

// firstTime returns the time from event to the first window centre c (c at event or
// later, the window lying before end) at which ok holds for the window [c-w/2,
// c+w/2), cut to start no earlier than event, and for the span [c, c+hold) (or up
// to end). Taking the centre makes a step in the rate show within half a window of
// where it happened, whichever way it goes.
func firstTime(event, end, w time.Duration, ok func(from, to time.Duration) bool) (time.Duration, bool) {
	for c := event; c+w/2 <= end; c += binWidth {
		if ok(max(c-w/2, event), c+w/2) && ok(c, min(c+hold, end)) {
			return c - event, true
		}
	}
	return 0, false
}

// convergence is the time from the attack's start until the group's admitted rate
// is within tolerance of limit, in a window and on average for a while after.
func convergence(s series, start, end time.Duration, limit float64) (time.Duration, bool) {
	return firstTime(start, end, window, func(from, to time.Duration) bool {
		return within(rate(s.Delivered, from, to), limit, tolerance)
	})
}

// release is the time from the attack's end until the group, sending within its
// limit again, gets what it sends (less tolerance), in a window and on average for
// a while after.
func release(s series, stop, end time.Duration) (time.Duration, bool) {
	return firstTime(stop, end, window, func(from, to time.Duration) bool {
		o := sum(s.Offered, from, to)
		return o > 0 && float64(sum(s.Delivered, from, to)) >= float64(o)*(1-tolerance)
	})
}

// smoothed returns the delivered rate in packets per second over consecutive
// windows of width w: what the plot draws (single 10 ms bins of a 500 pps group hold
// five packets, too few to read a rate from).
func smoothed(bins []int, w time.Duration) (t, pps []float64) {
	per := int(w / binWidth)
	for i := 0; i+per <= len(bins); i += per {
		n := 0
		for _, v := range bins[i : i+per] {
			n += v
		}
		t = append(t, (time.Duration(i)*binWidth + w/2).Seconds())
		pps = append(pps, float64(n)/w.Seconds())
	}
	return t, pps
}

// Result is one scenario's outcome, as printed in the table and written by -json.
type Result struct {
	Scenario    string  `json:"scenario"`
	Family      string  `json:"family"` // "ipv4" or "ipv6"
	Mode        string  `json:"mode"`   // "ebpf" or "classic+go"
	Sources     string  `json:"sources"`
	Description string  `json:"description"`
	DurationS   float64 `json:"duration_s"`
	LimitPPS    float64 `json:"requests_per_second"`

	LegitSent        int     `json:"legit_sent"`
	LegitDelivered   int     `json:"legit_delivered"`
	LegitDeliveryPct float64 `json:"legit_delivery_pct"`

	// The attack group: what it offered while attacking, the limit of the group it
	// belongs to (LimitedBy names the node; "none" when no limit applies), and what
	// was admitted in steady state, from one second after the attack began.
	AttackOfferedPPS  float64  `json:"attack_offered_pps"`
	GroupLimitPPS     float64  `json:"group_limit_pps"`
	LimitedBy         string   `json:"limited_by"`
	AttackAdmittedPPS float64  `json:"attack_admitted_pps"`
	AdmittedX         *float64 `json:"admitted_x_limit"` // nil when no limit applies or the limit is 0
	ConvergeS         *float64 `json:"converge_s"`       // nil when it never converged or no limit applies
	ReleaseS          *float64 `json:"release_s"`        // nil when not measured (the attack runs to the end) or never released

	FilterPassed uint64 `json:"filter_passed"` // eBPF mode only
	Read         uint64 `json:"read"`          // datagrams the server read
	Overflowed   int64  `json:"overflowed"`    // datagrams lost to a full receive queue
	Meaningful   bool   `json:"meaningful"`

	Checks []Check  `json:"checks"`
	Groups []Group  `json:"groups"`
	Notes  []string `json:"notes,omitempty"`
}

// Check is one target of issue 6, applied to one scenario.
type Check struct {
	Target string `json:"target"`
	Pass   bool   `json:"pass"`
	Detail string `json:"detail"`
}

// Group is one traffic group's packet counts per 10 ms.
type Group struct {
	Name      string `json:"name"`
	Legit     bool   `json:"legit"`
	Sent      int    `json:"sent"`
	Delivered int    `json:"delivered"`
	Offered   []int  `json:"offered_per_10ms"`
	Received  []int  `json:"delivered_per_10ms"`
}

// Passed reports whether every check passed.
func (r *Result) Passed() bool {
	for _, c := range r.Checks {
		if !c.Pass {
			return false
		}
	}
	return true
}

func fptr(v float64) *float64 { return &v }

func fmtSeconds(p *float64) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprintf("%.2fs", *p)
}

// writeTable prints results as an aligned table followed by every check that failed.
func writeTable(w io.Writer, results []*Result) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tfamily\tmode\tlegit delivered\tattack pps\tgroup limit\tadmitted\tconverge\trelease\toverflow\ttargets\t")
	for _, r := range results {
		limit := "none"
		if r.LimitedBy != "none" {
			limit = fmt.Sprintf("%.0f %s", r.GroupLimitPPS, r.LimitedBy)
		}
		admitted := fmt.Sprintf("%.0f pps", r.AttackAdmittedPPS)
		if r.AdmittedX != nil {
			admitted = fmt.Sprintf("%.0f = %.2fx", r.AttackAdmittedPPS, *r.AdmittedX)
		}
		overflow := fmt.Sprint(r.Overflowed)
		if !r.Meaningful {
			overflow += " NOT MEANINGFUL"
		}
		targets := "met"
		if !r.Passed() {
			targets = "MISSED"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.2f%%\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t\n",
			r.Scenario, r.Family, r.Mode, r.LegitDeliveryPct, r.AttackOfferedPPS, limit, admitted,
			fmtSeconds(r.ConvergeS), fmtSeconds(r.ReleaseS), overflow, targets)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range results {
		for _, c := range r.Checks {
			if !c.Pass {
				fmt.Fprintf(w, "missed: %s/%s: %s: %s\n", r.Scenario, r.Family, c.Target, c.Detail)
			}
		}
		for _, n := range r.Notes {
			fmt.Fprintf(w, "note: %s/%s: %s\n", r.Scenario, r.Family, n)
		}
	}
	return nil
}

// writeJSON writes results as one indented JSON document.
func writeJSON(w io.Writer, mode string, results []*Result) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(struct {
		Mode    string    `json:"mode"`
		BinMS   int       `json:"bin_ms"`
		Results []*Result `json:"results"`
	}{mode, int(binWidth / time.Millisecond), results})
}

// checks applies the targets to r: legitimate delivery, admission within ±10% of
// the group's limit, convergence and release within a second, and no overflow.
func (r *Result) check(legitWithinLimits, measuresRelease bool) {
	r.Checks = nil
	add := func(target string, pass bool, format string, args ...any) {
		r.Checks = append(r.Checks, Check{target, pass, fmt.Sprintf(format, args...)})
	}
	add("no receive-buffer overflow", r.Meaningful, "%d datagrams lost to a full queue", r.Overflowed)
	if legitWithinLimits {
		add("legit delivery >= 99%", r.LegitDeliveryPct >= 99, "%.2f%% of %d", r.LegitDeliveryPct, r.LegitSent)
	}
	if r.LimitedBy == "none" {
		return
	}
	add("admitted within ±10% of the group limit", within(r.AttackAdmittedPPS, r.GroupLimitPPS, tolerance),
		"%.0f pps admitted, limit %.0f", r.AttackAdmittedPPS, r.GroupLimitPPS)
	add("converge within 1 s", r.ConvergeS != nil && *r.ConvergeS <= 1, "converged after %s", fmtSeconds(r.ConvergeS))
	if measuresRelease {
		add("release within 1 s", r.ReleaseS != nil && *r.ReleaseS <= 1, "released after %s", fmtSeconds(r.ReleaseS))
	}
}

// progressLine is the one-line status shown while a scenario runs.
func progressLine(i, n int, name, family string, elapsed, dur time.Duration, rates []string) string {
	return fmt.Sprintf("[%d/%d] %s/%s %4.1f/%.1fs  %s", i, n, name, family, elapsed.Seconds(), dur.Seconds(), strings.Join(rates, "  "))
}

// round3 keeps JSON and table numbers to a millisecond or 0.1%.
func round3(v float64) float64 { return math.Round(v*1000) / 1000 }
