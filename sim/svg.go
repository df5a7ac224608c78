package sim

import (
	"bytes"
	"fmt"
	"html"
	"math"
	"sort"
)

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}

const (
	plotW, plotH           = 720.0, 400.0
	padL, padR, padT, padB = 70.0, 170.0, 40.0, 50.0
)

type line struct {
	name   string
	xs, ys []float64
	dash   string // stroke-dasharray, "" for solid
	color  string // "" picks the palette's next
}

// plot draws lines on linear or log-x axes, with a legend.
func plot(title, xlabel, ylabel string, lines []line, logX bool) []byte {
	minX, maxX, maxY := math.Inf(1), math.Inf(-1), 0.0
	for _, l := range lines {
		for i := range l.xs {
			minX, maxX, maxY = math.Min(minX, l.xs[i]), math.Max(maxX, l.xs[i]), math.Max(maxY, l.ys[i])
		}
	}
	if math.IsInf(minX, 0) {
		minX, maxX = 0, 1
	}
	tx := func(x float64) float64 { return x }
	if logX {
		tx = func(x float64) float64 { return math.Log10(math.Max(x, 1e-9)) }
	}
	x0, x1 := tx(minX), tx(maxX)
	if x1 == x0 {
		x1 = x0 + 1
	}
	if maxY <= 0 {
		maxY = 1
	}
	yStep := niceStep(maxY * 1.05 / 5)
	maxY = math.Ceil(maxY*1.05/yStep) * yStep
	iw, ih := plotW-padL-padR, plotH-padT-padB
	px := func(x float64) float64 { return padL + (tx(x)-x0)/(x1-x0)*iw }
	py := func(y float64) float64 { return padT + ih - y/maxY*ih }
	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" viewBox="0 0 %g %g" font-family="sans-serif" font-size="12">`+"\n", plotW, plotH, plotW, plotH)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%g" y="22" font-size="15" text-anchor="middle">%s</text>`+"\n", padL+iw/2, html.EscapeString(title))
	fmt.Fprintf(&b, `<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="black"/><line x1="%g" y1="%g" x2="%g" y2="%g" stroke="black"/>`+"\n",
		padL, padT+ih, padL+iw, padT+ih, padL, padT, padL, padT+ih)
	for k := 0; float64(k)*yStep <= maxY*(1+1e-9) && k <= 10; k++ {
		y := float64(k) * yStep
		fmt.Fprintf(&b, `<line x1="%g" y1="%.1f" x2="%g" y2="%.1f" stroke="#ddd"/><text x="%g" y="%.1f" text-anchor="end">%.4g</text>`+"\n",
			padL, py(y), padL+iw, py(y), padL-6, py(y)+4, y)
	}
	var ticks []float64
	seen := map[float64]bool{}
	for _, l := range lines {
		for _, x := range l.xs {
			if !seen[x] && len(ticks) < 12 && logX {
				seen[x] = true
				ticks = append(ticks, x)
			}
		}
	}
	if !logX {
		step := niceStep((maxX - minX) / 5)
		for x := math.Ceil(minX/step) * step; x <= maxX+step*1e-9 && len(ticks) < 20; x += step {
			ticks = append(ticks, x)
		}
	}
	sort.Float64s(ticks)
	for _, x := range ticks {
		fmt.Fprintf(&b, `<text x="%.1f" y="%g" text-anchor="middle">%.4g</text>`+"\n", px(x), padT+ih+18, x)
	}
	fmt.Fprintf(&b, `<text x="%g" y="%g" text-anchor="middle">%s</text>`+"\n", padL+iw/2, plotH-10, html.EscapeString(xlabel))
	fmt.Fprintf(&b, `<text transform="translate(16 %g) rotate(-90)" text-anchor="middle">%s</text>`+"\n", padT+ih/2, html.EscapeString(ylabel))
	for i, l := range lines {
		color := l.color
		if color == "" {
			color = palette[i%len(palette)]
		}
		var pts bytes.Buffer
		for k := range l.xs {
			fmt.Fprintf(&pts, "%.1f,%.1f ", px(l.xs[k]), py(l.ys[k]))
		}
		dash := ""
		if l.dash != "" {
			dash = fmt.Sprintf(` stroke-dasharray="%s"`, l.dash)
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.8"%s points="%s"/>`+"\n", color, dash, bytes.TrimSpace(pts.Bytes()))
		ly := padT + 14 + float64(i)*18
		fmt.Fprintf(&b, `<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="%s" stroke-width="2"%s/><text x="%g" y="%g">%s</text>`+"\n",
			plotW-padR+10, ly, plotW-padR+30, ly, color, dash, plotW-padR+35, ly+4, html.EscapeString(l.name))
	}
	b.WriteString("</svg>\n")
	return b.Bytes()
}

// niceStep rounds a tick step up to 1, 2 or 5 times a power of ten.
func niceStep(raw float64) float64 {
	if !(raw > 0) || math.IsInf(raw, 0) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if raw <= m*p {
			return m * p
		}
	}
	return 10 * p
}

// sweepPlot draws one line per scenario and protocol (a colour per
// scenario; naive dashed): a figure against the rebalance interval; ylabel
// names the figure. When base is not nil it adds a black dotted line named
// baseLabel: the largest value of baseline baseName's figure over the
// scenarios (baselines do not depend on the interval).
func sweepPlot(results []*Result, title, ylabel string, y func(*Result) float64, baseName, baseLabel string, base func(Figures) float64) []byte {
	byName := map[string]*line{}
	colorOf := map[string]string{}
	var order []string
	var ivs []float64
	seenIv := map[float64]bool{}
	baseMax := 0.0
	for _, r := range results {
		k := r.Scenario + " " + r.protocol()
		l, ok := byName[k]
		if !ok {
			if _, seen := colorOf[r.Scenario]; !seen {
				colorOf[r.Scenario] = palette[len(colorOf)%len(palette)]
			}
			l = &line{name: k, color: colorOf[r.Scenario]}
			if r.Protocol == string(Naive) {
				l.dash = "5 3"
			}
			byName[k] = l
			order = append(order, k)
		}
		l.xs = append(l.xs, r.RebalanceIntervalS)
		l.ys = append(l.ys, y(r))
		if !seenIv[r.RebalanceIntervalS] {
			seenIv[r.RebalanceIntervalS] = true
			ivs = append(ivs, r.RebalanceIntervalS)
		}
		if base != nil && r.Baselines != nil {
			baseMax = max(baseMax, base(r.Baselines[baseName]))
		}
	}
	lines := make([]line, 0, len(order)+1)
	for _, k := range order {
		l := byName[k]
		idx := make([]int, len(l.xs))
		for i := range idx {
			idx[i] = i
		}
		sort.SliceStable(idx, func(a, b int) bool { return l.xs[idx[a]] < l.xs[idx[b]] })
		s := line{name: l.name, color: l.color, dash: l.dash}
		for _, i := range idx {
			s.xs, s.ys = append(s.xs, l.xs[i]), append(s.ys, l.ys[i])
		}
		lines = append(lines, s)
	}
	if base != nil && len(ivs) > 0 {
		sort.Float64s(ivs)
		b := line{name: baseLabel, color: "#000", dash: "2 3"}
		for _, x := range ivs {
			b.xs, b.ys = append(b.xs, x), append(b.ys, baseMax)
		}
		lines = append(lines, b)
	}
	return plot(title, "rebalance interval (s, log scale)", ylabel, lines, true)
}

// seriesPlot draws admitted requests per second per region, their total and
// the ideal global bucket's line.
func seriesPlot(r *Result) []byte {
	s := r.Series
	var lines []line
	xs := make([]float64, len(s.Total))
	for i := range xs {
		xs[i] = float64(i) * s.BinSeconds / 60
	}
	for i, ys := range s.Regions {
		lines = append(lines, line{name: fmt.Sprintf("region %d", i), xs: xs, ys: ys})
	}
	lines = append(lines, line{name: "all regions", xs: xs, ys: s.Total})
	lines = append(lines, line{name: "ideal global", xs: xs, ys: s.Ideal, color: "#000", dash: "6 4"})
	title := fmt.Sprintf("%s: admitted per region (%s, rebalance %gs)", r.Scenario, r.protocol(), r.RebalanceIntervalS)
	return plot(title, "time (min)", "admitted requests / s", lines, false)
}
