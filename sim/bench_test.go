package sim

import (
	"testing"
	"time"
)

// BenchmarkRun reports simulated requests per second (offered requests,
// each decided by the system and the three baselines) on the heavy-tail
// scenario with the default 10,000 subjects.
func BenchmarkRun(b *testing.B) {
	sc, err := LoadScenario("heavy-tail")
	if err != nil {
		b.Fatal(err)
	}
	var reqs int64
	start := time.Now()
	for i := 0; i < b.N; i++ {
		res, err := Run(Config{Scenario: sc, Duration: 5 * time.Minute, Seed: uint64(i)})
		if err != nil {
			b.Fatal(err)
		}
		reqs += res.Offered
	}
	b.ReportMetric(float64(reqs)/time.Since(start).Seconds(), "requests/s")
}
