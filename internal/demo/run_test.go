package demo

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRunShortStory runs the whole demo (embedded etcd, rebalance loop,
// three regional nodes over real gRPC, a redis-server each when installed)
// for an 18 s story and checks the summary: the global line held, shares
// followed the campaign and, after us-east was cut off from etcd, its
// share moved to eu-west (lease 3 s + skew margin 0.5 s + a round fit in
// the 6 s failover phase), everything stopped; the run's chart is written.
func TestRunShortStory(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 80*time.Second)
	defer cancel()
	var out bytes.Buffer
	plain := false
	chartPath := filepath.Join(t.TempDir(), "out", "run.svg")
	sum, err := Run(ctx, Config{Duration: 18 * time.Second, Out: &out, Terminal: &plain, Chart: chartPath})
	t.Log(out.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"store: ", "summary (", "operator API 127.0.0.1:", "us-east fails at t=", "overshoot (as package sim defines it): 1s=", "under-admission: "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
	// The chart: printed, well formed, every region and phase on it.
	if !strings.Contains(out.String(), "chart of the run (admitted rate and share per region, global line, phases): "+sum.ChartPath) {
		t.Errorf("output does not print the chart's path %q", sum.ChartPath)
	}
	raw, err := os.ReadFile(chartPath)
	if err != nil {
		t.Fatal(err)
	}
	story := PartnerStory(18*time.Second, 100)
	var phases []string
	for _, p := range story.Phases {
		phases = append(phases, p.Name)
	}
	checkChart(t, raw, story.Regions, phases)
	f := sum.Figures
	if f.Offered < 500 || f.Admitted == 0 {
		t.Fatalf("offered %d admitted %d: the driver did not run", f.Offered, f.Admitted)
	}
	if sum.Errors > f.Offered/100 {
		t.Errorf("%d errors of %d checks", sum.Errors, f.Offered)
	}
	// Two-step publishing: the regions together never beat one global
	// bucket by more than measurement noise over 10 s.
	if o := f.Overshoot[10*time.Second]; o > 0.05 {
		t.Errorf("overshoot(10s) = %.3f, want <= 0.05", o)
	}
	// The campaign offers 2.4x the budget: over the second half of the
	// phase (h = 3 s) admitted stays within what one global bucket could
	// admit, (C + r·h)/h.
	if a, bound := sum.PhaseAdmitted[1], (100+100*3.0)/3.0; a > 1.05*bound {
		t.Errorf("campaign admitted %.1f/s, above a global bucket's %.1f/s (degraded decisions: %d)", a, bound, sum.Degraded)
	}
	// Shares followed the campaign into us-east.
	sh := sum.PhaseShares[1]
	if !(sh[0] > sh[1] && sh[0] > sh[2]) {
		t.Errorf("shares at the end of the campaign %v: us-east should hold the most", sh)
	}
	// Failover: us-east's lease expired, its share went to eu-west, which
	// got its traffic (the published shares for the story's subject).
	if sh := sum.PhaseShares[2]; !(sh[0] < 0.1 && sh[1] > 0.5 && sh[1] > sh[2]) {
		t.Errorf("shares at the end of the failover %v: eu-west should hold most of the budget", sh)
	}
}
