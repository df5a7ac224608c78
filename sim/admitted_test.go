package sim

import (
	"encoding/json"
	"testing"
	"time"
)

// TestAdmittedStream: Config.Admitted receives every batch the system
// admitted, in time order, adding up to the run's Admitted; recording
// them changes nothing in the result.
func TestAdmittedStream(t *testing.T) {
	for _, name := range []string{"tenant-move", "window-shift"} {
		sc, err := LoadScenario(name)
		if err != nil {
			t.Fatal(err)
		}
		cfg := Config{Scenario: sc, Seed: 3, Subjects: 200, Duration: 5 * time.Minute}
		plain, err := Run(cfg)
		if err != nil {
			t.Fatal(err)
		}
		var sum int64
		var last time.Duration
		regions := map[int]bool{}
		cfg.Admitted = func(a RegionAdmission) {
			if a.At < last || a.Count <= 0 || a.Subject < 0 || a.Subject >= 200 || a.Region < 0 || a.Region >= sc.Regions {
				t.Errorf("%s: admission %+v after %v", name, a, last)
			}
			last, sum = a.At, sum+a.Count
			regions[a.Region] = true
		}
		rec, err := Run(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if sum != rec.Admitted || len(regions) < 2 {
			t.Errorf("%s: the stream admitted %d in %d regions, the run %d", name, sum, len(regions), rec.Admitted)
		}
		a, _ := json.Marshal(plain)
		b, _ := json.Marshal(rec)
		if string(a) != string(b) {
			t.Errorf("%s: recording the admissions changed the result", name)
		}
	}
}
