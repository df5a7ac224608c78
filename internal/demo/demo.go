package demo

import (
	"context"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Config configures Run. Zero fields take the defaults listed.
type Config struct {
	// Story is what the driver plays; default PartnerStory(Duration, 100).
	Story *Story
	// Duration is the default story's length; default 90s.
	Duration time.Duration
	// Serve keeps the deployment up after the story until ctx is done.
	Serve bool
	// Out receives the live view and the summary; default os.Stdout.
	Out io.Writer
	// Terminal redraws the live view in place; default IsTerminal(Out).
	Terminal *bool
	// Embedded forces the in-process store even when redis-server exists.
	Embedded bool
	// RebalanceInterval is the coordinator's; default 1s. ReportInterval
	// is the regions' demand report interval; default 500ms. LeaseTTL is
	// the regions' lease; default 3s.
	RebalanceInterval, ReportInterval, LeaseTTL time.Duration
	// FailOnPhase names, per phase index, regions that fail when the
	// phase starts: the node is cut off from etcd (Deployment.CrashRegion),
	// so its share moves only after its lease TTL plus the skew margin, as
	// in a real regional failure. Default for the default story: us-east
	// fails when its traffic fails over.
	FailOnPhase map[int][]string
	// Chart, when set, is the path Run writes the run's picture to (an SVG:
	// see Chart) and prints after the summary.
	Chart string
}

// Summary is what a run measured.
type Summary struct {
	Store   string // "redis-server" or "embedded"
	Figures Figures
	// PhaseAdmitted and PhaseOffered are the global rates per phase, over
	// the second half of each phase (after the shares had time to move).
	PhaseAdmitted, PhaseOffered []float64
	// PhaseShares are the shares reported at the end of each phase.
	PhaseShares [][]float64
	// ChartPath is the absolute path of the chart written, if any.
	ChartPath string
	Errors    int64
	Shed      int64
	// Degraded counts decisions a failure mode made instead of the store.
	Degraded int64
	Dropped  int64
}

// Run starts the deployment, plays the story with a live view, prints the
// summary, and stops everything it started (also when ctx is cancelled,
// e.g. on Ctrl-C). It returns the summary of the story (nil when the
// deployment could not start).
func Run(ctx context.Context, cfg Config) (*Summary, error) {
	if cfg.Out == nil {
		cfg.Out = os.Stdout
	}
	if cfg.Duration == 0 {
		cfg.Duration = 90 * time.Second
	}
	if cfg.Duration < 3*time.Second || cfg.Duration > MaxLength {
		return nil, fmt.Errorf("demo: duration %v, want 3s to %v", cfg.Duration, MaxLength)
	}
	if cfg.RebalanceInterval == 0 {
		cfg.RebalanceInterval = time.Second
	}
	if cfg.ReportInterval == 0 {
		cfg.ReportInterval = 500 * time.Millisecond
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = 3 * time.Second
	}
	story := cfg.Story
	if story == nil {
		s := PartnerStory(cfg.Duration, 100)
		story = &s
		if cfg.FailOnPhase == nil {
			cfg.FailOnPhase = map[int][]string{2: {"us-east"}}
		}
	}
	if err := story.Validate(); err != nil {
		return nil, err
	}
	terminal := IsTerminal(cfg.Out)
	if cfg.Terminal != nil {
		terminal = *cfg.Terminal
	}
	// The driver's goroutine (failure lines) and the view's write to Out.
	cfg.Out = &lockedWriter{w: cfg.Out}
	say := func(format string, a ...any) { fmt.Fprintf(cfg.Out, format+"\n", a...) }

	// The failover phase must be long enough to show the share moving:
	// lease TTL + skew margin + a round. The demo uses short ones.
	const skewMargin = 500 * time.Millisecond
	dep, err := Deploy(ctx, DeployConfig{Regions: story.Regions, Policies: PolicyDoc(story), Embedded: cfg.Embedded,
		RebalanceInterval: cfg.RebalanceInterval, ReportInterval: cfg.ReportInterval, LeaseTTL: cfg.LeaseTTL,
		SkewMargin: skewMargin, Say: say})
	if err != nil {
		return nil, err
	}
	defer dep.Close()
	for i, r := range story.Regions {
		say("region %-9s gRPC %s  HTTP http://%s", r, dep.GRPC[i], dep.HTTP[i])
	}
	say("logs: %s (removed at exit)", dep.LogPath)
	say("timing: rebalance every %v, demand reports every %v, region lease %v + skew margin %v before a dead region's share moves (short, so the failover shows)",
		cfg.RebalanceInterval, cfg.ReportInterval, cfg.LeaseTTL, skewMargin)
	say("story: %v, budget %.0f requests/s (burst %d) for subject %s under policy %s", story.Length(), story.RefillPerSecond, story.Capacity, story.Subject, story.Policy)
	store, checker, coord := dep.Store, dep.Checks, dep.Coord

	// Start from the equal split the coordinator reaches with no demand
	// (the first allocation follows the regions' registrations).
	equal := make([]float64, len(story.Regions))
	for i := range equal {
		equal[i] = 1 / float64(len(story.Regions))
	}
	if _, err := dep.Settle(ctx, story.Policy, equal, 0.05, 0); err != nil {
		say("shares did not settle before the story: %v", err)
	}

	rec := NewRecorder(len(story.Regions), story.Length())
	phaseEnds := make([]time.Duration, len(story.Phases))
	var acc time.Duration
	for i, p := range story.Phases {
		acc += p.For
		phaseEnds[i] = acc
	}
	sum := &Summary{Store: store, PhaseShares: make([][]float64, len(story.Phases))}
	start := time.Now()
	view := &View{Out: cfg.Out, Terminal: terminal, Story: story}
	chart := ChartOf(story)
	chart.AddShares(0, rec.Rates(0, 1).Share)
	// Shares as the coordinator published them for the story's subject.
	shareCtx, shareCancel := context.WithCancel(ctx)
	shareDone := make(chan struct{})
	go func() {
		defer close(shareDone)
		dep.WatchShares(shareCtx, story.Policy, story.Subject, rec.SetShares)
	}()
	defer func() { shareCancel(); <-shareDone }()
	drv := &Driver{Story: *story, Checker: checker, Recorder: rec,
		OnPhase: func(i int, p Phase) {
			view.SetNote("")
			if i > 0 {
				sum.PhaseShares[i-1] = rec.Rates(0, 1).Share
			}
			for _, r := range cfg.FailOnPhase[i] {
				now := time.Since(start)
				if err := dep.CrashRegion(r); err != nil {
					view.SetNote(err.Error())
					continue
				}
				msg := fmt.Sprintf("%s fails at t=%.1fs: its node is cut off from etcd; its share moves once its lease (%v) expired plus the skew margin (%v) and a round (%v): by about t=%.1fs",
					r, now.Seconds(), cfg.LeaseTTL, skewMargin, cfg.RebalanceInterval, (now + cfg.LeaseTTL + skewMargin + cfg.RebalanceInterval).Seconds())
				if terminal {
					view.SetNote(msg) // a line printed between redraws would break them
				} else {
					fmt.Fprintln(cfg.Out, msg)
					view.SetNote(fmt.Sprintf("%s failed at t=%.0fs; its share moves after lease %v + skew %v", r, now.Seconds(), cfg.LeaseTTL, skewMargin))
				}
			}
		}}
	viewDone := make(chan struct{})
	viewCtx, viewCancel := context.WithCancel(ctx)
	go func() {
		defer close(viewDone)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-viewCtx.Done():
				return
			case <-t.C:
				now := time.Since(start)
				w := rec.Rates(now-time.Second, now)
				chart.AddShares(now, w.Share)
				view.Show(now, w)
			}
		}
	}()
	runErr := drv.Run(ctx)
	viewCancel()
	<-viewDone
	sum.PhaseShares[len(story.Phases)-1] = rec.Rates(0, 1).Share

	events, dropped := rec.Events()
	if sum.Figures, err = Measure(events, story.Capacity, story.RefillPerSecond, OvershootWindows); err != nil {
		return sum, err
	}
	sum.Dropped = dropped
	sum.Degraded = checker.Degraded()
	w := rec.Rates(0, story.Length())
	for i := range w.Errors {
		sum.Errors += w.Errors[i]
		sum.Shed += w.Shed[i]
	}
	var from time.Duration
	for _, end := range phaseEnds {
		mid := from + (end-from)/2
		pw := rec.Rates(mid, end)
		var a, o float64
		for j := range pw.Admitted {
			a += pw.Admitted[j]
			o += pw.Offered[j]
		}
		sum.PhaseAdmitted = append(sum.PhaseAdmitted, a)
		sum.PhaseOffered = append(sum.PhaseOffered, o)
		from = end
	}
	printSummary(cfg.Out, story, sum)
	if cfg.Chart != "" {
		chart.AddShares(min(time.Since(start), story.Length()), rec.Rates(0, 1).Share)
		chart.FillAdmitted(rec, story.Length())
		if sum.ChartPath, err = WriteChartFile(cfg.Chart, chart); err != nil {
			return sum, err
		}
		say("chart of the run (admitted rate and share per region, global line, phases): %s", sum.ChartPath)
	}
	if runErr != nil {
		return sum, runErr
	}
	if cfg.Serve {
		for _, rs := range cfg.FailOnPhase {
			for _, r := range rs {
				if err := dep.HealRegion(r); err == nil {
					say("%s is reconnected to etcd", r)
				}
			}
		}
		say("serving until Ctrl-C:")
		for i, r := range story.Regions {
			if dep.Running(r) {
				say("  %s: Admission and Envoy RLS gRPC on %s, metrics http://%s/metrics", r, dep.GRPC[i], dep.HTTP[i])
			}
		}
		say("  coordinator: operator API %s, etcd %s, metrics http://%s/metrics", coord.GRPCAddr, coord.EtcdAddr, coord.HTTPAddr)
		say("  try: go run ./cmd/quotacheck -addr %s -subject %s -policy %s", dep.GRPC[1], story.Subject, story.Policy)
		say("       go run ./cmd/quotactl -coordinator %s -token-file %s alloc show %s", coord.GRPCAddr, coord.TokenFile, story.Policy)
		<-ctx.Done()
	}
	return sum, nil
}

func printSummary(out io.Writer, s *Story, sum *Summary) {
	fmt.Fprintf(out, "\nsummary (%s store; budget %.0f/s, burst %d)\n", sum.Store, s.RefillPerSecond, s.Capacity)
	fmt.Fprintf(out, "%-32s %12s %12s   shares at phase end (%s)\n", "phase (second half)", "offered/s", "admitted/s", strings.Join(s.Regions, " "))
	for i, p := range s.Phases {
		var sh []string
		for _, v := range sum.PhaseShares[i] {
			sh = append(sh, strconv.FormatFloat(v, 'f', 3, 64))
		}
		fmt.Fprintf(out, "%-32s %12.1f %12.1f   %s\n", p.Name, sum.PhaseOffered[i], sum.PhaseAdmitted[i], strings.Join(sh, " "))
	}
	f := sum.Figures
	ws := make([]time.Duration, 0, len(f.Overshoot))
	for w := range f.Overshoot {
		ws = append(ws, w)
	}
	sort.Slice(ws, func(i, j int) bool { return ws[i] < ws[j] })
	var ov []string
	for _, w := range ws {
		ov = append(ov, fmt.Sprintf("%v=%.3f", w, f.Overshoot[w]))
	}
	fmt.Fprintf(out, "overshoot (as package sim defines it): %s\n", strings.Join(ov, " "))
	fmt.Fprintf(out, "under-admission: %.3f (admitted %d of %d offered; an ideal global bucket admits %d)\n", f.UnderAdmission, f.Admitted, f.Offered, f.Ideal)
	fmt.Fprintf(out, "errors %d, degraded decisions %d, shed by the driver %d\n", sum.Errors, sum.Degraded, sum.Shed)
}

// PolicyDoc is the policy document (own YAML format) for s: one policy,
// capacity C, refill r, token bucket, local failure mode, no minimum share
// beyond 5% per region.
func PolicyDoc(s *Story) []byte {
	return []byte(fmt.Sprintf(`policies:
  - name: %s
    version: 1
    subject: tenant
    capacity: %d
    refill_per_second: %g
    failure_mode: local
    min_share:
      default: 0.05
`, s.Policy, s.Capacity, s.RefillPerSecond))
}
