// Package traceplot draws the tracer's CDF plots (gonum/plot); it lives in
// the lab so that the agent binary carries no plotting library.
package traceplot

import (
	"fmt"
	"image/color"
	"path/filepath"
	"sort"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/eztunnel/eztunnel/internal/tracer"
)

// cdf returns the empirical CDF of xs, at most points steps.
func cdf(xs []float64, points int) plotter.XYs {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	n := len(s)
	step := 1
	if n > points {
		step = n / points
	}
	var xy plotter.XYs
	for i := step - 1; i < n; i += step {
		xy = append(xy, plotter.XY{X: s[i], Y: float64(i+1) / float64(n)})
	}
	return xy
}

var partColors = map[string]color.RGBA{
	"pod out": {R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}, "host": {R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
	"pod in": {R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}, "total": {A: 0xff},
}

// PlotCDF writes <base>.svg and <base>.png: the CDF of the time in the
// sending pod, the host, the receiving pod and in total, in µs.
func PlotCDF(p *tracer.Report, base, title string) error {
	pl := plot.New()
	pl.Title.Text = title
	pl.X.Label.Text = "latency (µs)"
	pl.Y.Label.Text = "P(X ≤ x)"
	pl.Add(plotter.NewGrid())
	for _, name := range []string{"pod out", "host", "pod in", "total"} {
		xs := p.Part(name)
		if len(xs) == 0 {
			continue
		}
		l, err := plotter.NewLine(cdf(xs, 2000))
		if err != nil {
			return err
		}
		l.Color = partColors[name]
		l.Width = vg.Points(1.5)
		pl.Add(l)
		pl.Legend.Add(fmt.Sprintf("%s (n=%d)", name, len(xs)), l)
	}
	pl.Legend.Top = false
	pl.Legend.Left = false
	for _, ext := range []string{".svg", ".png"} {
		if err := pl.Save(16*vg.Centimeter, 10*vg.Centimeter, base+ext); err != nil {
			return fmt.Errorf("write %s: %w", filepath.Base(base+ext), err)
		}
	}
	return nil
}
