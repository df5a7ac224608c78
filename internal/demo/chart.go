package demo

import (
	"bufio"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Chart is the picture of a run: each region's admitted rate over time
// against the global line (the budget every region together may admit),
// and each region's share of that budget, with the story's phases marked.
// WriteSVG draws it as one self-contained SVG document.
type Chart struct {
	// Regions name the series, in the story's order.
	Regions []string
	// Phases are the story's phases with their start and end offsets.
	Phases []ChartPhase
	// Budget is the global line: requests per second all regions together
	// may admit (the policy's refill rate).
	Budget float64
	// Step is the width of one admitted-rate point.
	Step time.Duration
	// Admitted is [region][point] in requests per second; point i covers
	// [i·Step, (i+1)·Step).
	Admitted [][]float64
	// Shares are the published shares, sampled over the run, in time
	// order; at most MaxShareSamples are kept.
	Shares []ShareSample
}

// ChartPhase is one phase on the chart.
type ChartPhase struct {
	Name       string
	Start, End time.Duration
}

// ShareSample is every region's share at one offset.
type ShareSample struct {
	At     time.Duration
	Shares []float64
}

// MaxShareSamples bounds Chart.Shares: AddShares thins the samples to
// every other one when the bound is reached, so a long run keeps an even
// spread.
const MaxShareSamples = 2048

// MaxChartPoints bounds the admitted-rate points ChartOf draws per region.
const MaxChartPoints = 2048

// AddShares appends a share sample (copied), thinning the samples when
// MaxShareSamples is reached.
func (c *Chart) AddShares(at time.Duration, shares []float64) {
	if len(c.Shares) >= MaxShareSamples {
		kept := c.Shares[:0]
		for i := 0; i < len(c.Shares); i += 2 {
			kept = append(kept, c.Shares[i])
		}
		c.Shares = kept
	}
	c.Shares = append(c.Shares, ShareSample{At: at, Shares: append([]float64(nil), shares...)})
}

// ChartOf starts the chart of story s: regions, phases and the global
// line; the admitted rates are filled by FillAdmitted and the shares by
// AddShares.
func ChartOf(s *Story) *Chart {
	c := &Chart{Regions: append([]string(nil), s.Regions...), Budget: s.RefillPerSecond}
	var at time.Duration
	for _, p := range s.Phases {
		c.Phases = append(c.Phases, ChartPhase{Name: p.Name, Start: at, End: at + p.For})
		at += p.For
	}
	return c
}

// FillAdmitted takes the admitted rates over [0, length) from rec, in
// points of one second, or wider when the run has more than
// MaxChartPoints seconds.
func (c *Chart) FillAdmitted(rec *Recorder, length time.Duration) {
	c.Step = max(time.Second, (length/MaxChartPoints/Bin+1)*Bin)
	n := int((length + c.Step - 1) / c.Step)
	c.Admitted = make([][]float64, len(c.Regions))
	for r := range c.Admitted {
		c.Admitted[r] = make([]float64, n)
	}
	for i := 0; i < n; i++ {
		w := rec.Rates(time.Duration(i)*c.Step, time.Duration(i+1)*c.Step)
		for r := range c.Admitted {
			if r < len(w.Admitted) {
				c.Admitted[r][i] = w.Admitted[r]
			}
		}
	}
}

// The chart's layout, in SVG user units.
const (
	chartWidth   = 960.0
	chartLeft    = 70.0
	chartRight   = 180.0 // room for the legend
	rateTop      = 50.0
	rateHeight   = 260.0
	shareTop     = 370.0
	shareHeight  = 160.0
	chartHeight  = 580.0
	plotWidth    = chartWidth - chartLeft - chartRight
	legendX      = chartWidth - chartRight + 20
	totalColor   = "#222222"
	budgetColor  = "#d62728"
	phaseColor   = "#888888"
	chartFont    = "font-family=\"sans-serif\" font-size=\"12\""
	maxChartText = 200
)

// regionColors are the series colours, reused cyclically.
var regionColors = []string{"#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"}

// ErrChart reports a chart WriteSVG cannot draw.
var ErrChart = errors.New("demo: invalid chart")

// WriteSVG draws c: above, each region's admitted rate and their total
// against the global line; below, each region's share; dashed verticals at
// the phase boundaries with the phases' names. Every series is a <g> with
// data-region (or data-series="total"/"budget"), every phase a <g> with
// data-phase, so tools and tests can find them.
func (c *Chart) WriteSVG(w io.Writer) error {
	if len(c.Regions) == 0 || len(c.Phases) == 0 || len(c.Admitted) != len(c.Regions) || c.Step <= 0 {
		return fmt.Errorf("%w: %d regions, %d phases, %d admitted series, step %v", ErrChart, len(c.Regions), len(c.Phases), len(c.Admitted), c.Step)
	}
	length := c.Phases[len(c.Phases)-1].End
	if length <= 0 {
		return fmt.Errorf("%w: the phases end at %v", ErrChart, length)
	}
	n := len(c.Admitted[0])
	total := make([]float64, n)
	for _, s := range c.Admitted {
		if len(s) != n {
			return fmt.Errorf("%w: admitted series of different lengths", ErrChart)
		}
		for i, v := range s {
			total[i] += v
		}
	}
	top := c.Budget
	for _, v := range total {
		top = max(top, v)
	}
	top = niceCeil(top * 1.15)
	x := func(at time.Duration) float64 { return chartLeft + plotWidth*float64(at)/float64(length) }
	yRate := func(v float64) float64 { return rateTop + rateHeight*(1-v/top) }
	yShare := func(v float64) float64 { return shareTop + shareHeight*(1-v) }

	b := bufio.NewWriter(w)
	fmt.Fprintf(b, `<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" %s>
<title>Quota demo: admitted rate and share per region against the global budget</title>
<rect x="0" y="0" width="%.0f" height="%.0f" fill="white"/>
`, chartWidth, chartHeight, chartWidth, chartHeight, chartFont, chartWidth, chartHeight)
	fmt.Fprintf(b, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"14\" font-weight=\"bold\">admitted requests per second (global budget %s/s)</text>\n", chartLeft, rateTop-20, fmtNum(c.Budget))
	fmt.Fprintf(b, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"14\" font-weight=\"bold\">share of the global budget</text>\n", chartLeft, shareTop-20)
	// Axes and grid.
	axis(b, yRate, top, "%s/s")
	axis(b, yShare, 1, "%s")
	fmt.Fprintf(b, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">seconds since the start of the story</text>\n", chartLeft+plotWidth/2, chartHeight-10)
	for s := 0.0; s <= length.Seconds(); s += tickStep(length.Seconds()) {
		xs := x(time.Duration(s * float64(time.Second)))
		fmt.Fprintf(b, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%s</text>\n", xs, shareTop+shareHeight+16, fmtNum(s))
	}
	// Phases.
	for _, p := range c.Phases {
		fmt.Fprintf(b, "<g class=\"phase\" data-phase=\"%s\">\n", escape(p.Name))
		for _, yr := range [][2]float64{{rateTop, rateTop + rateHeight}, {shareTop, shareTop + shareHeight}} {
			fmt.Fprintf(b, "<line x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\" stroke=\"%s\" stroke-dasharray=\"4 3\"/>\n", x(p.Start), yr[0], x(p.Start), yr[1], phaseColor)
		}
		fmt.Fprintf(b, "<text x=\"%.1f\" y=\"%.0f\" fill=\"%s\">%s</text>\n</g>\n", x(p.Start)+4, rateTop-4, phaseColor, escape(clip(p.Name)))
	}
	// The global line and the total.
	fmt.Fprintf(b, "<g class=\"series\" data-series=\"budget\"><line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\" stroke-dasharray=\"8 4\"/></g>\n",
		chartLeft, yRate(c.Budget), chartLeft+plotWidth, yRate(c.Budget), budgetColor)
	stepX := func(i int) float64 { return x(time.Duration(i)*c.Step + c.Step/2) }
	fmt.Fprintf(b, "<g class=\"series\" data-series=\"total\">%s</g>\n", polyline(total, stepX, yRate, totalColor, 2))
	// Regions: admitted above, shares below.
	for r, name := range c.Regions {
		col := regionColors[r%len(regionColors)]
		fmt.Fprintf(b, "<g class=\"region\" data-region=\"%s\" data-panel=\"admitted\">%s</g>\n", escape(name), polyline(c.Admitted[r], stepX, yRate, col, 1.5))
		sh := make([]float64, len(c.Shares))
		for i, s := range c.Shares {
			if r < len(s.Shares) {
				sh[i] = s.Shares[r]
			}
		}
		fmt.Fprintf(b, "<g class=\"region\" data-region=\"%s\" data-panel=\"share\">%s</g>\n", escape(name),
			polyline(sh, func(i int) float64 { return x(c.Shares[i].At) }, yShare, col, 1.5))
	}
	// Legend.
	ly := rateTop
	legend := func(col, dash, text string) {
		fmt.Fprintf(b, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"%s\" stroke-width=\"2\"%s/><text x=\"%.0f\" y=\"%.0f\">%s</text>\n",
			legendX, ly, legendX+24, ly, col, dash, legendX+30, ly+4, escape(clip(text)))
		ly += 18
	}
	legend(budgetColor, ` stroke-dasharray="8 4"`, "global budget")
	legend(totalColor, "", "all regions")
	for r, name := range c.Regions {
		legend(regionColors[r%len(regionColors)], "", name)
	}
	b.WriteString("</svg>\n")
	return b.Flush()
}

// WriteChartFile writes c's SVG to path (creating its directory) and
// returns the absolute path.
func WriteChartFile(path string, c *Chart) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", fmt.Errorf("demo: chart path: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(abs), 0o755); err != nil {
		return "", fmt.Errorf("demo: chart directory: %w", err)
	}
	f, err := os.Create(abs)
	if err != nil {
		return "", fmt.Errorf("demo: chart: %w", err)
	}
	if err := c.WriteSVG(f); err != nil {
		_ = f.Close()
		return "", err
	}
	if err := f.Close(); err != nil {
		return "", fmt.Errorf("demo: chart: %w", err)
	}
	return abs, nil
}

// axis draws the horizontal grid of a panel from 0 to top with five
// labelled lines.
func axis(b *bufio.Writer, y func(float64) float64, top float64, format string) {
	for i := 0; i <= 4; i++ {
		v := top * float64(i) / 4
		fmt.Fprintf(b, "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"#e5e5e5\"/><text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
			chartLeft, y(v), chartLeft+plotWidth, y(v), chartLeft-6, y(v)+4, fmt.Sprintf(format, fmtNum(v)))
	}
}

// polyline draws values as one <polyline>; non-finite values are drawn at 0.
func polyline(vs []float64, x func(int) float64, y func(float64) float64, color string, width float64) string {
	var pts strings.Builder
	for i, v := range vs {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			v = 0
		}
		fmt.Fprintf(&pts, "%.1f,%.1f ", x(i), y(v))
	}
	return fmt.Sprintf(`<polyline fill="none" stroke="%s" stroke-width="%g" points="%s"/>`, color, width, strings.TrimSpace(pts.String()))
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten (1 for v ≤ 0).
func niceCeil(v float64) float64 {
	if !(v > 0) || math.IsInf(v, 0) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

// tickStep is the spacing of about ten time labels over secs seconds.
func tickStep(secs float64) float64 { return niceCeil(secs / 10) }

func fmtNum(v float64) string { return fmt.Sprintf("%.4g", v) }

// clip shortens text shown on the chart.
func clip(s string) string {
	if len(s) > maxChartText {
		return s[:maxChartText] + "…"
	}
	return s
}

// escape makes s safe as SVG text and attribute values.
func escape(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}
