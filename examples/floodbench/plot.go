package main

import (
	"fmt"
	"image/color"
	"os"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// plotWindow is the resolution of the plot, the window that decides convergence:
// it holds a hundred packets of a group at a 500 pps limit, and every
// legitimate client's packets in whole numbers.
const plotWindow = window

var groupColors = [numGroups]color.Color{
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}, // legit: blue
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}, // legit-edns: green
	color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}, // attack: red
}

// scenarioPlot draws one result: delivered packets per second of every group over
// time, with the attack group's limit dashed.
func scenarioPlot(r *Result) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s (%s): %s", r.Scenario, r.Family, r.Description)
	p.Title.TextStyle.Font.Size = vg.Points(9)
	p.X.Label.Text = "seconds"
	p.Y.Label.Text = "delivered packets/s"
	for _, a := range []*plot.Axis{&p.X, &p.Y} {
		a.Label.TextStyle.Font.Size = vg.Points(8)
		a.Tick.Label.Font.Size = vg.Points(7)
	}
	p.X.Min, p.X.Max = 0, r.DurationS
	p.Y.Min = 0
	p.Legend.Top = true
	p.Legend.TextStyle.Font.Size = vg.Points(7)
	p.Add(plotter.NewGrid())
	for g, gr := range r.Groups {
		t, pps := smoothed(gr.Received, plotWindow)
		xy := make(plotter.XYs, len(t))
		for i := range t {
			xy[i] = plotter.XY{X: t[i], Y: pps[i]}
		}
		l, err := plotter.NewLine(xy)
		if err != nil {
			return nil, err
		}
		l.Color = groupColors[g]
		l.Width = vg.Points(1)
		if g == groupLegitEDNS { // it often runs on top of the minimal queries' line
			l.Dashes = []vg.Length{vg.Points(4), vg.Points(2)}
		}
		p.Add(l)
		p.Legend.Add(gr.Name, l)
	}
	if r.LimitedBy != "none" {
		limit, err := plotter.NewLine(plotter.XYs{{X: 0, Y: r.GroupLimitPPS}, {X: r.DurationS, Y: r.GroupLimitPPS}})
		if err != nil {
			return nil, err
		}
		limit.Dashes = []vg.Length{vg.Points(3), vg.Points(3)}
		limit.Color = color.Gray{Y: 0x60}
		p.Add(limit)
		p.Legend.Add(fmt.Sprintf("limit (%s)", r.LimitedBy), limit)
		// The first packets of a flood pass before the estimate catches up: keep
		// that spike from flattening the rest of the plot (lines are clipped).
		p.Y.Max = 3 * max(r.GroupLimitPPS, r.LimitPPS)
	}
	return p, nil
}

// writeSVG writes one plot per result, IPv4 and IPv6 runs of a scenario side by
// side, as SVG, or as PNG when path ends in .png.
func writeSVG(path string, results []*Result) error {
	var rows [][]*plot.Plot
	index := map[string]int{}
	cols := 1
	for _, r := range results {
		p, err := scenarioPlot(r)
		if err != nil {
			return err
		}
		col := 0
		if r.Family == "ipv6" {
			col, cols = 1, 2
		}
		row, ok := index[r.Scenario]
		if !ok {
			row = len(rows)
			index[r.Scenario] = row
			rows = append(rows, make([]*plot.Plot, 2))
		}
		rows[row][col] = p
	}
	for i := range rows {
		rows[i] = rows[i][:cols]
	}
	w, h := vg.Length(cols)*11*vg.Centimeter, vg.Length(len(rows))*6*vg.Centimeter
	var canvas vg.CanvasWriterTo = vgsvg.New(w, h)
	if strings.HasSuffix(path, ".png") {
		canvas = vgimg.PngCanvas{Canvas: vgimg.New(w, h)}
	}
	tiles := draw.Tiles{Rows: len(rows), Cols: cols, PadX: vg.Centimeter, PadY: vg.Centimeter / 2,
		PadTop: vg.Centimeter / 4, PadBottom: vg.Centimeter / 4, PadLeft: vg.Centimeter / 4, PadRight: vg.Centimeter / 4}
	dc := draw.New(canvas)
	canvases := plot.Align(rows, tiles, dc)
	for i := range rows {
		for j, p := range rows[i] {
			if p != nil {
				p.Draw(canvases[i][j])
			}
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := canvas.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
