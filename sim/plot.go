package sim

import (
	"fmt"
	"image/color"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// layoutStyle: one colour and marker per layout, the same in every plot.
var layoutStyle = map[Layout]struct {
	c     color.RGBA
	shape draw.GlyphDrawer
}{
	TP:       {color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}, draw.BoxGlyph{}},
	DPGather: {color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}, draw.CircleGlyph{}},
	DPEP:     {color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}, draw.TriangleGlyph{}},
}

// Plot draws the sweep's decode throughput against its axis, one line per
// layout, to path (.png, .svg or .pdf, by its extension); batch and rank
// axes are logarithmic.
func Plot(points []Point, axis Axis, title, path string) error {
	ext := strings.ToLower(strings.TrimPrefix(filepath.Ext(path), "."))
	if ext != "png" && ext != "svg" && ext != "pdf" {
		return fmt.Errorf("sim: plot %s: the file must end in .png, .svg or .pdf", path)
	}
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = map[Axis]string{AxisBatch: "requests decoding at once (all ranks)", AxisRanks: "ranks (GPUs)",
		AxisContext: "prompt tokens per request"}[axis]
	p.Y.Label.Text = "decode tokens/s (all ranks)"
	if axis != AxisContext {
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	}
	p.Legend.Top, p.Legend.Left = true, true
	p.Add(plotter.NewGrid())
	drawn := 0
	for _, l := range Layouts {
		var xy plotter.XYs
		for _, pt := range points {
			if pt.Layout == l && pt.Result != nil && pt.X > 0 {
				xy = append(xy, plotter.XY{X: float64(pt.X), Y: pt.Result.TokensPerSec})
			}
		}
		if len(xy) == 0 {
			continue
		}
		line, pts, err := plotter.NewLinePoints(xy)
		if err != nil {
			return fmt.Errorf("sim: plot: %w", err)
		}
		st := layoutStyle[l]
		line.Color, line.Width = st.c, vg.Points(1.5)
		pts.Color, pts.Shape = st.c, st.shape
		p.Add(line, pts)
		p.Legend.Add(string(l), line, pts)
		drawn++
	}
	if drawn == 0 {
		return fmt.Errorf("sim: plot %s: no point of the sweep fits", path)
	}
	if err := p.Save(8*vg.Inch, 5*vg.Inch, path); err != nil {
		return fmt.Errorf("sim: plot: %w", err)
	}
	return nil
}
