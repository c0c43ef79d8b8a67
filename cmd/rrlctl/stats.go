package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/dnsrake/rrl"
)

var statsCommand = &command{
	name:    "stats",
	args:    "[-watch 1s] [-count N] [-json]",
	summary: "print the filter's counters, or watch their rates",
	help: `Print the pinned filter's counters since it was loaded: packets seen, passed,
dropped by reason (limited by a level, too short, responses, reflection source
ports), exempt, report-only, and how many each level limited; and whether the
kernel verifies DNS server cookies, with how many secrets (never the secrets).

With -watch, refresh every interval and show rates per second: on a terminal a
table redrawn in place, otherwise one compact line per refresh (with -json, one
JSON object per line).`,
	run: func(c *cli, fs *flag.FlagSet, args []string) error {
		const minWatch, maxWatch = 10 * time.Millisecond, 24 * time.Hour // a tighter loop only burns CPU
		watch := fs.Duration("watch", 0, "refresh every `interval` (e.g. 1s), showing rates per second")
		count := fs.Int("count", 0, "with -watch, stop after `N` refreshes (0: until interrupted)")
		asJSON := fs.Bool("json", false, "print JSON")
		if err := c.parseFlags(fs, args); err != nil {
			return err
		}
		switch {
		case *watch < 0 || *watch > 0 && *watch < minWatch || *watch > maxWatch:
			return usagef("-watch %v: want an interval from %v to %v", *watch, minWatch, maxWatch)
		case *count < 0:
			return usagef("-count %d: must not be negative", *count)
		case *count > 0 && *watch == 0:
			return usagef("-count needs -watch")
		}
		f, err := rrl.OpenPinned(c.pin)
		if err != nil {
			return err
		}
		defer f.Close()
		st, err := f.Stats()
		if err != nil {
			return err
		}
		at := time.Now()
		if *watch == 0 {
			if *asJSON {
				return writeJSON(c.stdout, statsReport(c.pin, at, st, nil, 0))
			}
			printStats(c.stdout, c.pin, st, nil, 0)
			return nil
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
		defer stop()
		tick := time.NewTicker(*watch)
		defer tick.Stop()
		tty := isTerminal(c.stdout)
		for i := 0; *count == 0 || i < *count; i++ {
			select {
			case <-ctx.Done():
				return nil
			case <-tick.C:
			}
			f.Config() // picks up limits changed meanwhile (rrlctl set)
			cur, err := f.Stats()
			if err != nil {
				return err
			}
			now := time.Now()
			dt := now.Sub(at).Seconds()
			switch {
			case *asJSON:
				if err := writeJSON(c.stdout, statsReport(c.pin, now, cur, &st, dt)); err != nil {
					return err
				}
			case tty:
				fmt.Fprint(c.stdout, "\033[H\033[2J")
				printStats(c.stdout, c.pin, cur, &st, dt)
				fmt.Fprintf(c.stdout, "\n%s, every %s; ^C to stop\n", now.Format("15:04:05"), *watch)
			default:
				printCompact(c.stdout, now, cur, &st, dt)
			}
			st, at = cur, now
		}
		return nil
	},
}

// reason is one counter with its label and JSON name.
type reason struct {
	label, key string
	indent     bool
	value      func(rrl.FilterStats) uint64
}

var reasons = []reason{
	{"seen", "seen", false, func(s rrl.FilterStats) uint64 { return s.Seen }},
	{"passed", "passed", false, func(s rrl.FilterStats) uint64 { return s.Passed }},
	{"dropped", "dropped", false, func(s rrl.FilterStats) uint64 { return s.Dropped() }},
	{"limited", "limited", true, limited},
	{"too short", "dropped_short", true, func(s rrl.FilterStats) uint64 { return s.DroppedShort }},
	{"responses", "dropped_response", true, func(s rrl.FilterStats) uint64 { return s.DroppedResponse }},
	{"reflection ports", "dropped_reflection", true, func(s rrl.FilterStats) uint64 { return s.DroppedReflection }},
	{"exempt (passed)", "exempt", false, func(s rrl.FilterStats) uint64 { return s.Exempt }},
	{"report-only (passed)", "report_only", false, func(s rrl.FilterStats) uint64 { return s.ReportOnly }},
	{"not DNS (dropped)", "not_dns", false, func(s rrl.FilterStats) uint64 { return s.NotDNS }},
	{"errors (passed)", "errors", false, func(s rrl.FilterStats) uint64 { return s.Errors }},
	{"valid cookie (passed)", "cookie_passed", false, func(s rrl.FilterStats) uint64 { return s.CookiePassed }},
	{"invalid cookie", "cookie_invalid", false, func(s rrl.FilterStats) uint64 { return s.CookieInvalid }},
	{"slipped at XDP (limited, answered TC)", "slipped", false, func(s rrl.FilterStats) uint64 { return s.Slipped }},
}

// limited is the number of packets the levels dropped.
func limited(s rrl.FilterStats) uint64 {
	var n uint64
	for _, l := range s.Nodes {
		n += l.Limited
	}
	if n < s.ReportOnly {
		return 0
	}
	// In report-only mode a level counts what it would have limited, and passes it.
	return n - s.ReportOnly
}

// rate is the per-second increase of a counter between prev and cur over dt seconds.
func rate(cur, prev uint64, dt float64) float64 {
	if dt <= 0 || cur < prev {
		return 0
	}
	return float64(cur-prev) / dt
}

// levelLimited returns the limited count of the level named node in s.
func levelLimited(s rrl.FilterStats, node rrl.LimiterNode) uint64 {
	for _, l := range s.Nodes {
		if l.Node == node {
			return l.Limited
		}
	}
	return 0
}

func printStats(w io.Writer, pin string, st rrl.FilterStats, prev *rrl.FilterStats, dt float64) {
	fmt.Fprintf(w, "%s: %s filter\n\n", pin, st.Mode)
	perSecond := ""
	if prev != nil {
		perSecond = "         /s"
	}
	fmt.Fprintf(w, "  %-24s %12s%s\n", "packets", "total", perSecond)
	for _, r := range reasons {
		label := r.label
		if r.indent {
			label = "  " + label
		}
		fmt.Fprintf(w, "  %-24s %12d", label, r.value(st))
		if prev != nil {
			fmt.Fprintf(w, " %10.0f", rate(r.value(st), r.value(*prev), dt))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "\n  %s\n", cookieLine(st.CookieSecrets))
	printCapacity(w, st.Capacity)
	printNames(w, st.Names)
	if len(st.Nodes) == 0 {
		fmt.Fprintln(w, "\n  no request limit (requests-per-second 0)")
		return
	}
	fmt.Fprintf(w, "\n  %-10s %12s %14s%s\n", "level", "limit/s", "limited", perSecond)
	for _, l := range st.Nodes {
		fmt.Fprintf(w, "  %-10s %12.6g %14d", l.Node, l.Limit, l.Limited)
		if prev != nil {
			fmt.Fprintf(w, " %10.0f", rate(l.Limited, levelLimited(*prev, l.Node), dt))
		}
		fmt.Fprintln(w)
	}
}

// printCapacity prints the capacity mode's state (nothing when it is off).
func printCapacity(w io.Writer, c *rrl.CapacityStats) {
	if c == nil {
		return
	}
	kind := "configured"
	if c.Auto {
		kind = "measured"
	}
	fmt.Fprintf(w, "\n  capacity (%s)         %12.0f/s\n", kind, c.Capacity)
	switch {
	case c.Overloaded:
		fmt.Fprintf(w, "  overloaded since %s: water level %.4g/s, demand %.0f/s, target %.0f/s\n", c.Since.Format(time.TimeOnly), c.Level, c.Demand, c.Target)
	case c.Problem == "":
		fmt.Fprintf(w, "  not overloaded: no limit from the capacity (demand %.0f/s)\n", c.Demand)
	}
	if c.Problem != "" {
		fmt.Fprintf(w, "  %s\n", c.Problem)
	}
}

// printNames prints the names judge's counters (nothing when it is off).
func printNames(w io.Writer, n *rrl.NameStats) {
	if n == nil {
		return
	}
	level := "no limit by name"
	if n.Level > 0 {
		level = fmt.Sprintf("random names limited to %.4g/s per zone", n.Level)
	}
	fmt.Fprintf(w, "\n  names: %s; %d known, %d unknown (%d limited, %d passed)\n", level, n.Known, n.Unknown, n.Limited, n.UnknownPassed)
}

// printCompact prints one line of rates: seen, passed and dropped always, other
// reasons and levels when they moved.
func printCompact(w io.Writer, now time.Time, st rrl.FilterStats, prev *rrl.FilterStats, dt float64) {
	var b strings.Builder
	b.WriteString(now.Format("15:04:05"))
	for i, r := range reasons {
		v := rate(r.value(st), r.value(*prev), dt)
		if i < 3 || v > 0 {
			fmt.Fprintf(&b, "  %s %.0f/s", r.key, v)
		}
	}
	for _, l := range st.Nodes {
		if v := rate(l.Limited, levelLimited(*prev, l.Node), dt); v > 0 {
			fmt.Fprintf(&b, "  %s %.0f/s", l.Node, v)
		}
	}
	fmt.Fprintln(w, b.String())
}

// statsJSON is the JSON form of stats; Rates and the levels' LimitedPerSecond are
// there only while watching.
type statsJSON struct {
	PinDir   string             `json:"pin_dir"`
	Time     time.Time          `json:"time"`
	Mode     string             `json:"mode"`
	Counters map[string]uint64  `json:"counters"`
	Levels   []levelJSON        `json:"levels"`
	Interval float64            `json:"interval_seconds,omitempty"`
	Rates    map[string]float64 `json:"rates_per_second,omitempty"`
	// Capacity is the capacity mode's state, when it is on.
	Capacity *rrl.CapacityStats `json:"capacity,omitempty"`
	// CookieSecrets is how many server cookie secrets the kernel verifies
	// cookies with (0: it verifies none); never the secrets.
	CookieSecrets int `json:"cookie_secrets"`
	// Names is the names judge's counters and level, when it is on.
	Names *rrl.NameStats `json:"names,omitempty"`
}

type levelJSON struct {
	Node             rrl.LimiterNode `json:"node"`
	Limit            float64         `json:"limit"`
	Limited          uint64          `json:"limited"`
	LimitedPerSecond *float64        `json:"limited_per_second,omitempty"`
}

func statsReport(pin string, at time.Time, st rrl.FilterStats, prev *rrl.FilterStats, dt float64) statsJSON {
	out := statsJSON{PinDir: pin, Time: at, Mode: st.Mode.String(), Counters: map[string]uint64{}, Levels: []levelJSON{}, Capacity: st.Capacity, CookieSecrets: st.CookieSecrets, Names: st.Names}
	for _, r := range reasons {
		out.Counters[r.key] = r.value(st)
	}
	if prev != nil {
		out.Interval = dt
		out.Rates = map[string]float64{}
		for _, r := range reasons {
			out.Rates[r.key] = rate(r.value(st), r.value(*prev), dt)
		}
	}
	for _, l := range st.Nodes {
		lj := levelJSON{Node: l.Node, Limit: l.Limit, Limited: l.Limited}
		if prev != nil {
			v := rate(l.Limited, levelLimited(*prev, l.Node), dt)
			lj.LimitedPerSecond = &v
		}
		out.Levels = append(out.Levels, lj)
	}
	return out
}

func writeJSON(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// cookieLine says whether the kernel verifies server cookies, and with how many
// secrets, never which.
func cookieLine(secrets int) string {
	switch secrets {
	case 0:
		return "server cookies: not verified in the kernel (no cookie-secret set: rrlctl set cookie-secret HEX)"
	case 1:
		return "server cookies: verified in the kernel, with the cookie-secret set"
	}
	return "server cookies: verified in the kernel, with the cookie-secret set and the previous one"
}
