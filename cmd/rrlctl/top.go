package main

import (
	"flag"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/dnsrake/rrl"
)

// maxHeavyCells is how many of the busiest cells top reads; -n cannot list more.
const maxHeavyCells = 1 << 16

var topCommand = &command{
	name:    "top",
	args:    "[-n 20] [-probe ADDR[:PORT],...] [-zones NAME,...] [-json]",
	summary: "show the groups being limited, the heaviest sketch cells, estimates for given sources, and random names by zone",
	help: `Show who the request limiter is limiting now, and what its sketches hold.

The filter records the groups it refuses packets of (one refused packet in sixteen,
in a table of the 4096 groups recorded most recently): top lists those refused in
the last five seconds by address, heaviest first: the level that refused them, the
group (the source prefix at that level, the source port at the port level), its
current rate and the level's limit, the packets refused since it was first
recorded (estimated from the sample) and for how long.

The sketches keep no table of sources: each level is a CountMin sketch of two rows
of 2048 cells, and a source group adds its packets to one cell per row, chosen by
a keyed hash. A cell holds the decayed rate of every group hashing to it, so cells
cannot be turned back into addresses. For every level, top prints the heaviest
rate in the sketch (the smaller of the two rows' heaviest cells: no group there is
heavier), how many cells are over the level's limit, and the -n heaviest cells of
each row.

-probe names sources (addresses, or address:port for the source-port level): for
each, top prints the rate the filter is estimating for every group it belongs to,
the same number it compares with the limit for that source's next packet.

Names (the capacity mode's names judge, keyword names): the filter counts queries
for names the server has not answered as existing (random names) by zone, in a
sketch of its own, and learns which zones and names exist into two tables. Both
hold keyed hashes: a zone can be named only when its name is known here, so top
lists the configured zones (keyword zones), the names given with -zones, and the
root (".": names under no zone the filter knows), heaviest first, with their
random names' rates, whether the filter's table holds them as zones, the limit per
zone in force, and, for the zones it cannot name (learnt from the server's
answers), the bound the sketch puts on the heaviest of all.`,
	run: func(c *cli, fs *flag.FlagSet, args []string) error {
		n := fs.Int("n", 20, "list the `N` heaviest cells of each row of each level (0: none)")
		probe := fs.String("probe", "", "comma-separated `sources` (ADDR or ADDR:PORT) to estimate")
		zones := fs.String("zones", "", "comma-separated zone `names` to estimate, beside the configured zones and the root")
		asJSON := fs.Bool("json", false, "print JSON")
		if err := c.parseFlags(fs, args); err != nil {
			return err
		}
		if *n < 0 || *n > maxHeavyCells {
			return usagef("-n %d: must not be negative, at most %d", *n, maxHeavyCells)
		}
		var sources []netip.AddrPort
		for _, s := range strings.FieldsFunc(*probe, func(r rune) bool { return r == ',' || r == ' ' }) {
			ap, err := netip.ParseAddrPort(s)
			if err != nil {
				a, aerr := netip.ParseAddr(s)
				if aerr != nil {
					return usagef("-probe: %q is not an address or address:port", s)
				}
				ap = netip.AddrPortFrom(a, 0)
			}
			sources = append(sources, ap)
		}
		f, err := rrl.OpenPinned(c.pin)
		if err != nil {
			return err
		}
		defer f.Close()
		// Every busy cell: the level summaries count all of them.
		cells, err := f.HeavyCells(maxHeavyCells)
		if err != nil {
			return err
		}
		limited, err := f.LimitedGroups()
		if err != nil {
			return err
		}
		if limited == nil {
			limited = []rrl.GroupRate{}
		}
		rep := topReport{PinDir: c.pin, Limited: limited, Levels: summarize(cells), Cells: []rrl.SketchCell{}, Probes: []probeJSON{}}
		perRow := map[[2]any]int{}
		for _, cell := range cells {
			k := [2]any{cell.Node, cell.Row}
			if perRow[k] < *n {
				rep.Cells = append(rep.Cells, cell)
			}
			perRow[k]++
		}
		for _, src := range sources {
			groups, err := f.GroupRates(src)
			if err != nil {
				return err
			}
			rep.Probes = append(rep.Probes, probeJSON{Source: src.String(), Groups: groups})
		}
		names, err := f.ZoneRates(strings.FieldsFunc(*zones, func(r rune) bool { return r == ',' || r == ' ' })...)
		if err != nil {
			return err
		}
		rep.Names = names
		if *asJSON {
			return writeJSON(c.stdout, rep)
		}
		printTop(c, rep, time.Now())
		return nil
	},
}

type topReport struct {
	PinDir  string           `json:"pin_dir"`
	Limited []rrl.GroupRate  `json:"limited"`
	Levels  []levelTop       `json:"levels"`
	Cells   []rrl.SketchCell `json:"cells"`
	Probes  []probeJSON      `json:"probes"`
	Names   *rrl.ZoneRates   `json:"names"`
}

// levelTop summarizes one level's sketch.
type levelTop struct {
	Node  rrl.LimiterNode `json:"node"`
	Limit float64         `json:"limit"`
	// Heaviest bounds the heaviest group: the smaller of the rows' heaviest cells.
	Heaviest float64 `json:"heaviest"`
	// OverLimit counts the cells above the limit, per row.
	OverLimit []int `json:"cells_over_limit"`
	Busy      int   `json:"busy_cells"`
}

type probeJSON struct {
	Source string          `json:"source"`
	Groups []rrl.GroupRate `json:"groups"`
}

// summarize condenses every busy cell (heaviest first within each level, as
// Filter.HeavyCells returns them) into one line per level.
func summarize(cells []rrl.SketchCell) []levelTop {
	var out []levelTop
	index := map[rrl.LimiterNode]int{}
	var rowMax [][2]float64
	for _, c := range cells {
		i, ok := index[c.Node]
		if !ok {
			i = len(out)
			index[c.Node] = i
			out = append(out, levelTop{Node: c.Node, Limit: c.Limit, OverLimit: make([]int, 2)})
			rowMax = append(rowMax, [2]float64{})
		}
		out[i].Busy++
		if c.Row < 2 {
			rowMax[i][c.Row] = max(rowMax[i][c.Row], c.Rate)
			if c.Rate > c.Limit {
				out[i].OverLimit[c.Row]++
			}
		}
	}
	for i := range out {
		out[i].Heaviest = min(rowMax[i][0], rowMax[i][1])
	}
	return out
}

func printTop(c *cli, rep topReport, now time.Time) {
	w := c.stdout
	if len(rep.Limited) == 0 {
		fmt.Fprintf(w, "%s: no group limited in the last few seconds\n\n", rep.PinDir)
	} else {
		fmt.Fprintf(w, "%s: groups limited now; rates in packets/s, dropped estimated\n\n", rep.PinDir)
		fmt.Fprintf(w, "  %-10s %-26s %12s %12s %12s %8s\n", "level", "group", "rate", "limit", "dropped", "for")
		for _, g := range rep.Limited {
			fmt.Fprintf(w, "  %-10s %-26s %12.1f %12.6g %12d %8s\n", g.Node, groupName(g.Node, g.Group, g.Port), g.Rate, g.Limit, g.Dropped,
				now.Sub(g.First).Round(time.Second))
		}
		fmt.Fprintln(w)
	}
	if len(rep.Levels) == 0 {
		fmt.Fprintf(w, "%s: the sketches are empty (no traffic lately, or requests-per-second 0)\n", rep.PinDir)
	} else {
		fmt.Fprintf(w, "%s: sketch cells hold hashed sums, not addresses (see -h); rates in packets/s\n\n", rep.PinDir)
		fmt.Fprintf(w, "  %-10s %12s %12s %16s %8s\n", "level", "limit", "heaviest", "over limit/row", "busy")
		for _, l := range rep.Levels {
			fmt.Fprintf(w, "  %-10s %12.6g %12.1f %16s %8d\n", l.Node, l.Limit, l.Heaviest, fmt.Sprintf("%d/%d", l.OverLimit[0], l.OverLimit[1]), l.Busy)
		}
	}
	if len(rep.Cells) > 0 {
		fmt.Fprintf(w, "\n  %-10s %4s %7s %12s\n", "level", "row", "column", "rate")
		for _, cell := range rep.Cells {
			fmt.Fprintf(w, "  %-10s %4d %7d %12.1f\n", cell.Node, cell.Row, cell.Column, cell.Rate)
		}
	}
	for _, p := range rep.Probes {
		fmt.Fprintf(w, "\n  source %s\n  %-10s %-26s %12s %12s\n", p.Source, "level", "group", "rate", "limit")
		for _, g := range p.Groups {
			fmt.Fprintf(w, "  %-10s %-26s %12.1f %12.6g\n", g.Node, groupName(g.Node, g.Group, g.Port), g.Rate, g.Limit)
		}
	}
	if rep.Names != nil {
		printZoneRates(c, rep.PinDir, rep.Names)
	}
}

// printNames prints the names judge's zones (see the help).
func printZoneRates(c *cli, pin string, z *rrl.ZoneRates) {
	w := c.stdout
	state := "no limit in force"
	switch {
	case !z.On:
		state = "names judge off: the zone sketch counts nothing"
	case z.Limit > 0:
		state = fmt.Sprintf("limit %.6g/s per zone", z.Limit)
	}
	fmt.Fprintf(w, "\n%s: random names by zone (%s); rates in queries/s\n\n", pin, state)
	fmt.Fprintf(w, "  %-32s %12s  %s\n", "zone", "rate", "filter's table")
	for _, zr := range z.Zones {
		known := "not in the table"
		switch {
		case zr.Zone == ".":
			known = "names under no known zone"
		case zr.Configured:
			known = "configured"
		case zr.Known:
			known = "learnt"
		}
		fmt.Fprintf(w, "  %-32s %12.1f  %s\n", zr.Zone, zr.Rate, known)
	}
	fmt.Fprintf(w, "\n  zone sketch: heaviest zone at most %.1f/s, %d busy cells", z.Heaviest, z.BusyCells)
	if z.Limit > 0 {
		fmt.Fprintf(w, ", %d over the limit", z.OverLimit)
	}
	fmt.Fprintf(w, "\n  tables: %d zones (%d configured), %d names known to exist\n", z.Apexes, z.ConfiguredApexes, z.Names)
	fmt.Fprintln(w, "  zones learnt from answers are held as hashes: only configured zones, -zones names and the root are named")
}

// groupName spells a source group: its prefix, or its port at the port level.
func groupName(node rrl.LimiterNode, group netip.Prefix, port uint16) string {
	switch node {
	case rrl.NodePort:
		return fmt.Sprintf("source port %d", port)
	case rrl.NodeTotal:
		return "all sources"
	}
	return group.String()
}
