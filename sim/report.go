package sim

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// WriteTable prints one line per run.
func WriteTable(w io.Writer, results []*Result) error {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%-12s %9s %-16s %10s %10s %10s %10s %9s %8s %12s %12s\n", "scenario", "rebalance", "protocol", "over_1s", "over_10s", "over_60s", "over_win", "under", "maxΣ", "admitted", "ideal")
	for _, r := range results {
		fmt.Fprintf(&b, "%-12s %8gs %-16s %10.4f %10.4f %10.4f %10.4f %9.4f %8.4f %12d %12d\n", r.Scenario, r.RebalanceIntervalS, r.protocol(),
			r.Overshoot1s, r.Overshoot10s, r.Overshoot60s, r.OvershootWindow, r.UnderAdmission, r.MaxShareSum, r.Admitted, r.IdealAdmitted)
	}
	_, err := w.Write(b.Bytes())
	return err
}

// WriteReport writes report.json, report.csv, report.md and the SVG plots
// into dir, creating it. The output depends only on results.
func WriteReport(dir string, results []*Result) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("sim: report directory: %w", err)
	}
	js, err := json.MarshalIndent(results, "", "  ")
	if err != nil {
		return fmt.Errorf("sim: encoding report: %w", err)
	}
	files := map[string][]byte{"report.json": append(js, '\n')}
	var c bytes.Buffer
	cw := csv.NewWriter(&c)
	cw.Write([]string{"scenario", "rebalance_interval_s", "protocol", "algorithm", "overcommit", "overshoot_1s", "overshoot_10s", "overshoot_60s",
		"under_admission", "admitted", "ideal_admitted", "offered", "max_share_sum", "epochs", "overshoot_window"})
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	for _, r := range results {
		cw.Write([]string{r.Scenario, f(r.RebalanceIntervalS), r.Protocol, r.Algorithm, f(r.Overcommit), f(r.Overshoot1s), f(r.Overshoot10s),
			f(r.Overshoot60s), f(r.UnderAdmission), strconv.FormatInt(r.Admitted, 10), strconv.FormatInt(r.IdealAdmitted, 10),
			strconv.FormatInt(r.Offered, 10), f(r.MaxShareSum), strconv.Itoa(r.Epochs), f(r.OvershootWindow)})
	}
	cw.Flush()
	files["report.csv"] = c.Bytes()
	files["overshoot.svg"] = sweepPlot(results, "worst overshoot (1 s, 10 s, 60 s and policy windows) vs rebalance interval", "worst overshoot",
		func(r *Result) float64 { return r.Figures.worst() }, BaselineIndependent, "independent buckets",
		func(f Figures) float64 { return f.worst() })
	files["under_admission.svg"] = sweepPlot(results, "under-admission vs rebalance interval", "under-admission",
		func(r *Result) float64 { return r.UnderAdmission }, "", "", nil)
	var md bytes.Buffer
	md.WriteString("# Simulation report\n\nOvershoot(W) = max over windows of length W of admitted / (C + r·W) − 1 (for a window algorithm, C for each policy window the interval touches); over_win = max over the policy's aligned windows of admitted / C − 1; under-admission = 1 − admitted / admitted by an ideal global bucket on the same request stream.\n\n")
	md.WriteString("![overshoot](overshoot.svg)\n![under-admission](under_admission.svg)\n\n")
	md.WriteString("| scenario | rebalance | protocol | overshoot 1s | 10s | 60s | policy window | under-admission | max Σ shares |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range results {
		fmt.Fprintf(&md, "| %s | %gs | %s | %.4f | %.4f | %.4f | %.4f | %.4f | %.4f |\n", r.Scenario, r.RebalanceIntervalS, r.protocol(),
			r.Overshoot1s, r.Overshoot10s, r.Overshoot60s, r.OvershootWindow, r.UnderAdmission, r.MaxShareSum)
	}
	md.WriteString("\n## Baselines (same stream)\n\n| scenario | baseline | overshoot 60s | under-admission |\n|---|---|---|---|\n")
	seen := map[string]bool{}
	for _, r := range results {
		if seen[r.Scenario] || r.Baselines == nil {
			continue
		}
		seen[r.Scenario] = true
		for _, b := range []string{BaselineIndependent, BaselineStaticEqual} {
			fmt.Fprintf(&md, "| %s | %s | %.4f | %.4f |\n", r.Scenario, b, r.Baselines[b].Overshoot60s, r.Baselines[b].UnderAdmission)
		}
	}
	md.WriteString("\n## Admitted rate per region\n\n")
	// One series plot per scenario: its first run with the shortest interval.
	first := map[string]*Result{}
	for _, r := range results {
		if p, ok := first[r.Scenario]; r.Series != nil && (!ok || r.RebalanceIntervalS < p.RebalanceIntervalS) {
			first[r.Scenario] = r
		}
	}
	names := make([]string, 0, len(first))
	for n := range first {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		file := "series-" + safeName(n) + ".svg"
		files[file] = seriesPlot(first[n])
		fmt.Fprintf(&md, "![%s](%s)\n", n, file)
	}
	files["report.md"] = md.Bytes()
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return fmt.Errorf("sim: writing report: %w", err)
		}
	}
	return nil
}

// protocol names r's protocol in tables and plots, marked when the run
// decided without the nodes' share rules (Config.NoShareRules).
func (r *Result) protocol() string {
	if r.NoShareRules {
		return r.Protocol + "-norules"
	}
	return r.Protocol
}

func safeName(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			return r
		}
		return '_'
	}, s)
}
