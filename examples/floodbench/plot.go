package main

import (
	"bufio"
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
)

// The figure is a plain SVG line chart drawn here: a plotting library would be the
// only dependency of the module that the library itself does not need.

// plotWindow is the resolution of the plot, the window that decides convergence:
// it holds a hundred packets of a group at a 500 pps limit, and every
// legitimate client's packets in whole numbers.
const plotWindow = window

var groupColors = [numGroups]string{
	"#1f77b4", // legit: blue
	"#2ca02c", // legit-edns: green
	"#d62728", // attack: red
}

// Tile geometry, in SVG user units (pixels).
const (
	tileW, tileH         = 440, 240
	marginL, marginR     = 56, 12
	marginT, marginB     = 28, 36
	plotW                = tileW - marginL - marginR
	plotH                = tileH - marginT - marginB
	fontTitle, fontLabel = 11, 10
	fontTick             = 9
)

// chartLine is one line of a chart.
type chartLine struct {
	name   string
	color  string
	dashes string // SVG stroke-dasharray, or ""
	x, y   []float64
}

// chart is one scenario's plot.
type chart struct {
	title      string
	xMax, yMax float64
	lines      []chartLine
}

// scenarioChart describes one result: delivered packets per second of every group
// over time, with the attack group's limit dashed.
func scenarioChart(r *Result) chart {
	c := chart{title: fmt.Sprintf("%s (%s): %s", r.Scenario, r.Family, r.Description), xMax: r.DurationS}
	for g, gr := range r.Groups {
		t, pps := smoothed(gr.Received, plotWindow)
		s := chartLine{name: gr.Name, color: groupColors[g%numGroups], x: t, y: pps}
		if g == groupLegitEDNS { // it often runs on top of the minimal queries' line
			s.dashes = "4 2"
		}
		c.lines = append(c.lines, s)
		for _, v := range pps {
			c.yMax = max(c.yMax, v)
		}
	}
	if r.LimitedBy != "none" {
		c.lines = append(c.lines, chartLine{name: fmt.Sprintf("limit (%s)", r.LimitedBy), color: "#606060",
			dashes: "3 3", x: []float64{0, r.DurationS}, y: []float64{r.GroupLimitPPS, r.GroupLimitPPS}})
		// The first packets of a flood pass before the estimate catches up: keep
		// that spike from flattening the rest of the plot (lines are clipped).
		c.yMax = 3 * max(r.GroupLimitPPS, r.LimitPPS)
	}
	if c.xMax <= 0 {
		c.xMax = 1
	}
	if c.yMax <= 0 {
		c.yMax = 1
	}
	return c
}

// niceTicks returns tick positions from 0 to at least max, about n of them, at
// steps of 1, 2 or 5 times a power of ten, and the axis end (the last tick).
func niceTicks(maxV float64, n int) (ticks []float64, end float64) {
	raw := maxV / float64(n)
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	step := p
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= raw {
			step = m * p
			break
		}
	}
	for v := 0.0; ; v += step {
		ticks = append(ticks, v)
		if v >= maxV-step*1e-9 {
			return ticks, v
		}
	}
}

// formatTick writes a tick value without trailing zeros.
func formatTick(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

// draw writes the chart into the tile whose top left corner is (ox, oy).
func (c chart) draw(w io.Writer, id string, ox, oy float64) {
	xt, xEnd := niceTicks(c.xMax, 8)
	yt, yEnd := niceTicks(c.yMax, 5)
	x0, y0 := ox+marginL, oy+marginT // the plot area's top left corner
	px := func(x float64) float64 { return x0 + x/xEnd*plotW }
	py := func(y float64) float64 { return y0 + plotH - y/yEnd*plotH }

	fmt.Fprintf(w, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"%d\" text-anchor=\"middle\">%s</text>\n",
		ox+tileW/2, oy+16, fontTitle, html.EscapeString(c.title))
	fmt.Fprintf(w, "<clipPath id=\"%s\"><rect x=\"%.1f\" y=\"%.1f\" width=\"%d\" height=\"%d\"/></clipPath>\n",
		id, x0, y0, plotW, plotH)
	// Grid and ticks.
	for _, v := range xt {
		x := px(v)
		fmt.Fprintf(w, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#dddddd\"/>\n", x, y0, x, y0+plotH)
		fmt.Fprintf(w, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"%d\" text-anchor=\"middle\">%s</text>\n",
			x, y0+plotH+12, fontTick, formatTick(v))
	}
	for _, v := range yt {
		y := py(v)
		fmt.Fprintf(w, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#dddddd\"/>\n", x0, y, x0+plotW, y)
		fmt.Fprintf(w, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"%d\" text-anchor=\"end\">%s</text>\n",
			x0-4, y+3, fontTick, formatTick(v))
	}
	fmt.Fprintf(w, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"black\"/>\n", x0, y0, plotW, plotH)
	fmt.Fprintf(w, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"%d\" text-anchor=\"middle\">seconds</text>\n",
		x0+plotW/2, oy+tileH-6, fontLabel)
	fmt.Fprintf(w, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"%d\" text-anchor=\"middle\" transform=\"rotate(-90 %.1f %.1f)\">delivered packets/s</text>\n",
		ox+14, y0+plotH/2, fontLabel, ox+14, y0+plotH/2)
	// Lines, clipped to the plot area.
	for _, s := range c.lines {
		if len(s.x) == 0 {
			continue
		}
		var pts strings.Builder
		for i := range s.x {
			fmt.Fprintf(&pts, "%.1f,%.1f ", px(s.x[i]), py(s.y[i]))
		}
		dash := ""
		if s.dashes != "" {
			dash = fmt.Sprintf(" stroke-dasharray=\"%s\"", s.dashes)
		}
		fmt.Fprintf(w, "<polyline clip-path=\"url(#%s)\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.3\"%s points=\"%s\"/>\n",
			id, s.color, dash, strings.TrimSpace(pts.String()))
	}
	// Legend, top right inside the plot area.
	lx, ly := x0+plotW-130, y0+6
	for i, s := range c.lines {
		y := ly + float64(i)*12
		dash := ""
		if s.dashes != "" {
			dash = fmt.Sprintf(" stroke-dasharray=\"%s\"", s.dashes)
		}
		fmt.Fprintf(w, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"1.3\"%s/>\n",
			lx, y+4, lx+18, y+4, s.color, dash)
		fmt.Fprintf(w, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"%d\">%s</text>\n", lx+22, y+7, fontTick, html.EscapeString(s.name))
	}
}

// writeSVG writes one chart per result, IPv4 and IPv6 runs of a scenario side by
// side, as SVG.
func writeSVG(path string, results []*Result) error {
	if strings.HasSuffix(path, ".png") {
		return fmt.Errorf("%s: only SVG is written", path)
	}
	type cell struct {
		c  chart
		ok bool
	}
	var rows [][2]cell
	index := map[string]int{}
	cols := 1
	for _, r := range results {
		col := 0
		if r.Family == "ipv6" {
			col, cols = 1, 2
		}
		row, ok := index[r.Scenario]
		if !ok {
			row = len(rows)
			index[r.Scenario] = row
			rows = append(rows, [2]cell{})
		}
		rows[row][col] = cell{scenarioChart(r), true}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	fmt.Fprintf(w, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"sans-serif\">\n",
		cols*tileW, len(rows)*tileH, cols*tileW, len(rows)*tileH)
	fmt.Fprintf(w, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n")
	for i, row := range rows {
		for j := range cols {
			if row[j].ok {
				row[j].c.draw(w, fmt.Sprintf("clip%d-%d", i, j), float64(j*tileW), float64(i*tileH))
			}
		}
	}
	fmt.Fprintln(w, "</svg>")
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
