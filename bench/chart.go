package bench

import (
	"fmt"
	"html"
	"io"
	"math"
	"strings"
)

var chartColors = []string{"#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"}

// WriteSVG draws a two-panel chart: the TTFT CDF of every summary (left) and
// the prefix cache hit rate per summary (right). Summaries need TTFTCDF.
func WriteSVG(w io.Writer, title string, sums []Summary) error {
	const (
		W, H           = 960, 420
		lx, ly, lw, lh = 70, 60, 520, 300 // CDF panel
		bx, bw         = 660, 260         // bars panel
	)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", W, H, W, H)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", W, H)
	fmt.Fprintf(&b, `<text x="%d" y="24" font-size="16" font-weight="bold">%s</text>`+"\n", lx, html.EscapeString(title))

	// X range: up to the largest p99 (so long tails do not squash the plot).
	xmax := 0.0
	for _, s := range sums {
		if n := len(s.TTFTCDF); n > 0 {
			xmax = math.Max(xmax, Percentile(s.TTFTCDF, 0.99))
		}
	}
	if xmax <= 0 {
		xmax = 1
	}
	xmax = niceCeil(xmax * 1.05)
	fmt.Fprintf(&b, `<text x="%d" y="%d">TTFT CDF (ms)</text>`+"\n", lx, ly-8)
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#333"/>`+"\n", lx, ly, lw, lh)
	for i := 0; i <= 5; i++ {
		x := float64(lx) + float64(lw)*float64(i)/5
		y := float64(ly+lh) - float64(lh)*float64(i)/5
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`, x, ly, x, ly+lh)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`, x, ly+lh+16, fmtNum(xmax*float64(i)/5))
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`, lx, y, lx+lw, y)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%.1f</text>`+"\n", lx-6, y+4, float64(i)/5)
	}
	for i, s := range sums {
		col := chartColors[i%len(chartColors)]
		n := len(s.TTFTCDF)
		if n == 0 {
			continue
		}
		var pts strings.Builder
		step := max(1, n/400)
		for j := 0; j < n; j += step {
			v := math.Min(s.TTFTCDF[j], xmax)
			x := float64(lx) + float64(lw)*v/xmax
			y := float64(ly+lh) - float64(lh)*float64(j+1)/float64(n)
			fmt.Fprintf(&pts, "%.1f,%.1f ", x, y)
		}
		v := math.Min(s.TTFTCDF[n-1], xmax)
		fmt.Fprintf(&pts, "%.1f,%d", float64(lx)+float64(lw)*v/xmax, ly)
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", col, pts.String())
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="12" height="12" fill="%s"/><text x="%d" y="%d">%s (p50 %s ms)</text>`+"\n",
			lx+lw-200, ly+lh-20-18*(len(sums)-i-1)-12, col, lx+lw-184, ly+lh-20-18*(len(sums)-i-1), html.EscapeString(s.Name), fmtNum(s.TTFT.P50))
	}

	// Hit-rate bars.
	fmt.Fprintf(&b, `<text x="%d" y="%d">prefix cache hit rate</text>`+"\n", bx, ly-8)
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>`+"\n", bx, ly+lh, bx+bw, ly+lh)
	for i := 0; i <= 4; i++ {
		y := float64(ly+lh) - float64(lh)*float64(i)/4
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eee"/><text x="%d" y="%.1f" text-anchor="end">%.2f</text>`+"\n", bx, y, bx+bw, y, bx-6, y+4, float64(i)/4)
	}
	if c := ceilingOf(sums); c > 0 {
		y := float64(ly+lh) - float64(lh)*math.Min(1, c)
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#333" stroke-dasharray="6,4"/><text x="%d" y="%.1f" text-anchor="end" font-size="11">pooled-cache ceiling %.3f</text>`+"\n",
			bx, y, bx+bw, y, bx+bw, y-4, c)
	}
	if len(sums) > 0 {
		slot := float64(bw) / float64(len(sums))
		for i, s := range sums {
			col := chartColors[i%len(chartColors)]
			h := float64(lh) * math.Max(0, math.Min(1, s.HitRate))
			x := float64(bx) + slot*float64(i) + slot*0.15
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`, x, float64(ly+lh)-h, slot*0.7, h, col)
			// The value inside a bar tall enough for it: above the bar it
			// met the ceiling's label when the bar came near the ceiling.
			if h >= 22 {
				fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" fill="#fff">%.3f</text>`, x+slot*0.35, float64(ly+lh)-h+15, s.HitRate)
			} else {
				fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%.3f</text>`, x+slot*0.35, float64(ly+lh)-h-4, s.HitRate)
			}
			// Names alternate between two rows so neighbours never overlap.
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle" font-size="11">%s</text>`+"\n", x+slot*0.35, ly+lh+14+14*(i%2), html.EscapeString(s.Name))
		}
	}
	b.WriteString("</svg>\n")
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("cannot write chart: %w", err)
	}
	return nil
}

// ceilingOf returns the pooled-cache ceiling the summaries share (0: none).
func ceilingOf(sums []Summary) float64 {
	for _, s := range sums {
		if s.CeilingHitRate > 0 {
			return s.CeilingHitRate
		}
	}
	return 0
}

func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

func fmtNum(v float64) string {
	switch {
	case math.IsNaN(v):
		return "-"
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}
