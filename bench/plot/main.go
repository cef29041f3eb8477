// Command plot draws the forwarding benchmark's chart from the runner's
// results.json: round trips per second, p99 round-trip time and CPU per
// datagram against offered load, one line per forwarder. It is its own
// module so that the plotting library stays out of cidroute's go.mod.
//
//	go run . -in ../out/results.json -out ../out/chart   # writes chart.svg and chart.png
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"image/color"
	"io"
	"os"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// The part of results.json the chart needs.
type results struct {
	Command     string `json:"command"`
	RateClients int    `json:"rate_clients"`
	Summary     []struct {
		Forwarder string `json:"forwarder"`
		Point     struct {
			Scenario string `json:"scenario"`
			Rate     uint64 `json:"rate"`
		} `json:"point"`
		Median struct {
			OfferedPPS float64 `json:"offered_pps"`
			RoundTrips float64 `json:"round_trips_per_s"`
			P99        float64 `json:"p99_us"`
			TotalUS    float64 `json:"cpu_us_per_datagram"`
		} `json:"median"`
	}
}

func main() {
	in := flag.String("in", "../out/results.json", "the runner's results.json")
	out := flag.String("out", "../out/chart", "output path without extension: writes .svg and .png")
	flag.Parse()
	if err := run(*in, *out); err != nil {
		fmt.Fprintln(os.Stderr, "plot:", err)
		os.Exit(1)
	}
}

// A series is one forwarder's points of the load sweep, by offered load.
type series struct {
	name                  string
	offered, rt, p99, cpu []float64
}

func load(path string) ([]series, *results, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	var r results
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	var out []series
	idx := map[string]int{}
	for _, s := range r.Summary {
		if s.Point.Scenario != "rate" || s.Median.OfferedPPS <= 0 {
			continue
		}
		i, ok := idx[s.Forwarder]
		if !ok {
			i = len(out)
			idx[s.Forwarder] = i
			out = append(out, series{name: s.Forwarder})
		}
		se := &out[i]
		se.offered = append(se.offered, s.Median.OfferedPPS)
		se.rt = append(se.rt, s.Median.RoundTrips)
		se.p99 = append(se.p99, s.Median.P99)
		se.cpu = append(se.cpu, s.Median.TotalUS)
	}
	if len(out) == 0 {
		return nil, nil, errors.New("no load-sweep points in " + path)
	}
	return out, &r, nil
}

// Fixed colours and dashes per forwarder, so charts of different runs
// compare at a glance.
var palette = []color.Color{
	color.RGBA{0x1f, 0x77, 0xb4, 0xff}, color.RGBA{0x2c, 0xa0, 0x2c, 0xff}, color.RGBA{0x00, 0x00, 0x00, 0xff},
	color.RGBA{0xff, 0x7f, 0x0e, 0xff}, color.RGBA{0xd6, 0x27, 0x28, 0xff}, color.RGBA{0x94, 0x67, 0xbd, 0xff},
}

func panel(title, ylabel string, ss []series, y func(series) []float64, logY bool) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "offered load (datagrams sent per second, thousands)"
	p.Y.Label.Text = ylabel
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())
	if logY {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	}
	for i, s := range ss {
		ys := y(s)
		var pts plotter.XYs
		for j := range s.offered {
			if logY && ys[j] <= 0 {
				continue
			}
			pts = append(pts, plotter.XY{X: s.offered[j] / 1000, Y: ys[j]})
		}
		slices.SortFunc(pts, func(a, b plotter.XY) int {
			switch {
			case a.X < b.X:
				return -1
			case a.X > b.X:
				return 1
			}
			return 0
		})
		if len(pts) == 0 {
			continue
		}
		l, sc, err := plotter.NewLinePoints(pts)
		if err != nil {
			return nil, err
		}
		c := palette[i%len(palette)]
		l.Color, sc.Color = c, c
		l.Width = vg.Points(1.5)
		if i >= 3 {
			l.Dashes = []vg.Length{vg.Points(4), vg.Points(2)}
		}
		sc.Shape = draw.CircleGlyph{}
		p.Add(l, sc)
		p.Legend.Add(s.name, l, sc)
	}
	return p, nil
}

func run(in, out string) error {
	ss, r, err := load(in)
	if err != nil {
		return err
	}
	sub := fmt.Sprintf(" (%d clients)", r.RateClients)
	rt, err := panel("Throughput"+sub, "round trips per second", ss, func(s series) []float64 { return s.rt }, false)
	if err != nil {
		return err
	}
	p99, err := panel("p99 round-trip time"+sub, "µs (log scale)", ss, func(s series) []float64 { return s.p99 }, true)
	if err != nil {
		return err
	}
	cpu, err := panel("Forwarder CPU per datagram", "µs (user + system)", ss, func(s series) []float64 { return s.cpu }, false)
	if err != nil {
		return err
	}
	plots := [][]*plot.Plot{{rt, p99, cpu}}
	w, h := 18*vg.Inch, 5.5*vg.Inch
	draw3 := func(c draw.Canvas) {
		tiles := draw.Tiles{Rows: 1, Cols: 3, PadX: vg.Millimeter * 6, PadY: vg.Millimeter * 4,
			PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 4}
		cs := plot.Align(plots, tiles, c)
		for j, p := range plots[0] {
			p.Draw(cs[0][j])
		}
	}
	svg := vgsvg.New(w, h)
	draw3(draw.New(svg))
	if err := writeTo(out+".svg", svg.WriteTo); err != nil {
		return err
	}
	img := vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(96))
	draw3(draw.New(img))
	return writeTo(out+".png", vgimg.PngCanvas{Canvas: img}.WriteTo)
}

func writeTo(path string, write func(w io.Writer) (int64, error)) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
