package boundcheck

import (
	"fmt"
	"time"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/sim"
)

// MaxSimulated bounds the admitted batches Simulated holds for one run
// (about 80 bytes each).
const MaxSimulated = 1 << 22

// SimWindows are the windows Simulated checks token buckets over by
// default: those of the simulator's overshoot figures, so that a window
// over the bound here is one that makes the run's Overshoot1s, 10s or 60s
// above 0.
var SimWindows = []time.Duration{time.Second, 10 * time.Second, time.Minute}

// Simulated runs cfg in the simulator and checks what its system admitted
// as Check checks the admitted decisions of a live run: every admitted
// batch (sim.Config.Admitted) is an Admission of the scenario's policy,
// named after the scenario, at its limits with the run's overcommit
// (sim.Scenario.Limits), by region sim.RegionName for subject
// sim.SubjectID, at the simulated instant (the run starts at the Unix
// epoch), with no slack: the simulator records the instant it decides at.
// Token buckets are checked over windows (nil: SimWindows) and, as Check
// does, over the whole span of each subject's decisions. cfg.Admitted
// is replaced. A run that admits more than MaxSimulated batches is an
// error wrapping ErrInput (shorten it, or give it fewer subjects).
func Simulated(cfg sim.Config, windows []time.Duration) (*sim.Result, Report, error) {
	if cfg.Scenario == nil {
		return nil, Report{}, fmt.Errorf("%w: no scenario", ErrInput)
	}
	if windows == nil {
		windows = SimWindows
	}
	overcommit := 0.0
	if cfg.Allocator != nil {
		overcommit = cfg.Allocator.Overcommit
	}
	policy := cfg.Scenario.Name
	var (
		adms     []Admission
		over     bool
		regions  [sim.MaxScenarioRegions]string
		subjects = map[int]string{}
	)
	for r := range regions {
		regions[r] = sim.RegionName(r)
	}
	epoch := time.Unix(0, 0).UTC()
	cfg.Admitted = func(a sim.RegionAdmission) {
		if len(adms) >= MaxSimulated {
			over = true
			return
		}
		s, ok := subjects[a.Subject]
		if !ok {
			s = sim.SubjectID(a.Subject)
			subjects[a.Subject] = s
		}
		adms = append(adms, Admission{Policy: policy, Subject: s, Region: regions[a.Region], At: epoch.Add(a.At), Cost: a.Count})
	}
	res, err := sim.Run(cfg)
	if err != nil {
		return nil, Report{}, err
	}
	if over {
		return nil, Report{}, fmt.Errorf("%w: run of %s admitted more than %d batches", ErrInput, policy, MaxSimulated)
	}
	rep, err := Check(Config{Limits: map[string]bucket.Limits{policy: cfg.Scenario.Limits(overcommit)}, Windows: windows}, adms)
	if err != nil {
		return nil, Report{}, err
	}
	return res, rep, nil
}
