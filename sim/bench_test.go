package sim

import (
	"context"
	"testing"
	"time"

	"github.com/quotacoord/quota/internal/cputime"
)

// BenchmarkRun reports simulated requests per second (offered requests,
// each decided by the system and the three baselines) on the heavy-tail
// scenario with the default 10,000 subjects: per second of wall time and
// per CPU-second of the process (reportRate).
func BenchmarkRun(b *testing.B) {
	sc, err := LoadScenario("heavy-tail")
	if err != nil {
		b.Fatal(err)
	}
	var reqs int64
	b.ReportAllocs()
	start, cpu0 := time.Now(), cputime.Process()
	for i := 0; i < b.N; i++ {
		res, err := Run(Config{Scenario: sc, Duration: 5 * time.Minute, Seed: uint64(i)})
		if err != nil {
			b.Fatal(err)
		}
		reqs += res.Offered
	}
	reportRate(b, reqs, start, cpu0)
}

// BenchmarkSweep reports simulated requests per second the way the default
// sweep runs them: one scenario (steady, 10,000 subjects, 10 simulated
// minutes) at the five default rebalance intervals and both protocols, the
// baselines decided once for the ten runs. Every offered request of every
// run counts once. Run it on one core (-cpu 1) for the figure of issue 5;
// requests/cpu-s is the one that other processes on the machine do not
// lower.
func BenchmarkSweep(b *testing.B) {
	sc, err := LoadScenario("steady")
	if err != nil {
		b.Fatal(err)
	}
	var cfgs []Config
	for _, iv := range []time.Duration{time.Second, 5 * time.Second, 15 * time.Second, time.Minute, 5 * time.Minute} {
		for _, p := range []Protocol{TwoStep, Naive} {
			cfgs = append(cfgs, Config{Scenario: sc, Duration: 10 * time.Minute, Seed: 1, RebalanceInterval: iv, Protocol: p})
		}
	}
	var reqs int64
	b.ReportAllocs()
	start, cpu0 := time.Now(), cputime.Process()
	for i := 0; i < b.N; i++ {
		res, err := Sweep(context.Background(), cfgs, nil)
		if err != nil {
			b.Fatal(err)
		}
		for _, r := range res {
			reqs += r.Offered
		}
	}
	reportRate(b, reqs, start, cpu0)
}

// reportRate reports reqs per second of wall time since start and, where
// the CPU time is measured, per CPU-second since cpu0.
func reportRate(b *testing.B, reqs int64, start time.Time, cpu0 time.Duration) {
	b.ReportMetric(float64(reqs)/time.Since(start).Seconds(), "requests/s")
	if cpu := cputime.Process() - cpu0; cpu > 0 {
		b.ReportMetric(float64(reqs)/cpu.Seconds(), "requests/cpu-s")
	}
}
