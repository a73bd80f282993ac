package mesh

import (
	"fmt"
	"image/color"
	"os"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/eztunnel/eztunnel/internal/stats"
)

// Plot writes the figures as SVG and PNG into dir: latency CDFs of both
// ping-echo variants (every mesh, both modes) and box plots of the per-run
// metrics and of the paced ping-echo latency samples.
func (r *Report) Plot(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, w := range []string{WPaced, WB2B} {
		if !r.hasWorkload(w) {
			continue
		}
		p := r.cdfPlot(w)
		if err := save(p, dir, "cdf-"+w); err != nil {
			return err
		}
		samples := func(x Run) []float64 { return x.Samples }
		if err := save(r.boxPlot("Latency of "+w+" (us)", w, samples), dir, "box-"+w+"-latency"); err != nil {
			return err
		}
	}
	one := func(f func(Run) float64) func(Run) []float64 {
		return func(x Run) []float64 { return []float64{f(x)} }
	}
	boxes := []struct {
		file, title, workload string
		f                     func(Run) []float64
	}{
		{"box-file-transfer-fct", "FCT of file-transfer (s)", WTransfer, one(func(x Run) float64 { return x.FCT })},
		{"box-redis-ops", "OPS of redis", WRedis, one(func(x Run) float64 { return x.Rate })},
		{"box-http-rps", "RPS of http", WHTTP, one(func(x Run) float64 { return x.Rate })},
		{"box-ping-echo-b2b-rps", "RPS of back-to-back ping-echo", WB2B, one(func(x Run) float64 { return x.Rate })},
	}
	for _, b := range boxes {
		if r.hasWorkload(b.workload) {
			if err := save(r.boxPlot(b.title, b.workload, b.f), dir, b.file); err != nil {
				return err
			}
		}
	}
	return nil
}

func save(p *plot.Plot, dir, name string) error {
	for _, ext := range []string{".svg", ".png"} {
		if err := p.Save(7*vg.Inch, 4*vg.Inch, filepath.Join(dir, name+ext)); err != nil {
			return fmt.Errorf("%s%s: %w", name, ext, err)
		}
	}
	return nil
}

// cdfPlot draws one line per mesh and mode, baseline dashed, on a log x axis.
func (r *Report) cdfPlot(w string) *plot.Plot {
	p := plot.New()
	p.Title.Text = "Latency CDF of " + w
	p.X.Label.Text = "round-trip time (us, log scale)"
	p.Y.Label.Text = "fraction of round trips"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Legend.Top, p.Legend.Left = false, false
	p.Legend.YOffs = vg.Points(-40)
	for i, mesh := range r.Meshes {
		for _, mode := range []string{ModeBaseline, ModeEztunnel} {
			var xs []float64
			for _, run := range r.runs(mesh, mode, w) {
				xs = append(xs, run.Samples...)
			}
			x, prob := stats.CDF(xs, 300)
			if len(x) == 0 {
				continue
			}
			pts := make(plotter.XYs, len(x))
			for j := range x {
				pts[j].X, pts[j].Y = max(x[j], 0.1), prob[j]
			}
			l, err := plotter.NewLine(pts)
			if err != nil {
				continue
			}
			l.Color = plotutil.Color(i)
			l.Width = vg.Points(1.5)
			if mode == ModeBaseline {
				l.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
			}
			p.Add(l)
			p.Legend.Add(mesh+" "+mode, l)
		}
	}
	p.Add(plotter.NewGrid())
	return p
}

// boxPlot draws one box per mesh and mode over the values f returns for
// every run (all samples, or one value per run).
func (r *Report) boxPlot(title, w string, f func(Run) []float64) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	var names []string
	pos := 0.0
	for i, mesh := range r.Meshes {
		for _, mode := range []string{ModeBaseline, ModeEztunnel} {
			var vals plotter.Values
			for _, run := range r.runs(mesh, mode, w) {
				vals = append(vals, f(run)...)
			}
			if len(vals) == 0 {
				continue
			}
			b, err := plotter.NewBoxPlot(vg.Points(24), pos, vals)
			if err != nil {
				continue
			}
			b.FillColor = lighter(plotutil.Color(i), mode == ModeBaseline)
			if len(vals) > 1000 {
				b.Outside = nil // thousands of outlier glyphs: noise, and a huge SVG
			}
			p.Add(b)
			names = append(names, mesh+"\n"+mode)
			pos++
		}
	}
	p.NominalX(names...)
	p.Add(plotter.NewGrid())
	return p
}

// lighter returns c, blended halfway to white for the baseline boxes.
func lighter(c color.Color, light bool) color.Color {
	r, g, b, _ := c.RGBA()
	if !light {
		return color.RGBA{uint8(r >> 8), uint8(g >> 8), uint8(b >> 8), 255}
	}
	mix := func(v uint32) uint8 { return uint8((v>>8 + 255) / 2) }
	return color.RGBA{mix(r), mix(g), mix(b), 255}
}
