package sim

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/quotacoord/quota/bucket"
)

// ErrScenario is wrapped by every error about a bad scenario.
var ErrScenario = errors.New("sim: invalid scenario")

// Limits on what a scenario may ask for, so that input cannot exhaust
// memory or time.
const (
	MaxScenarioRegions = 16
	MaxSubjects        = 1_000_000
	MaxGroups          = 32
	MaxEvents          = 1024
	MaxDuration        = 7 * 24 * time.Hour
	MinTick            = time.Millisecond
	maxScenarioLen     = 1 << 20
)

//go:embed scenarios/*.json
var builtinFS embed.FS

// Duration is a time.Duration that reads and writes as "1h30m" in JSON.
type Duration time.Duration

// MarshalJSON writes d as a Go duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads a Go duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string such as \"90s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// Scenario describes a workload and the failures injected into it. Rates
// are in units of the policy's refill r: a subject with rate 2 offers
// twice its global budget.
type Scenario struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	// Regions and Subjects are defaults; Config may override them.
	Regions  int      `json:"regions"`
	Subjects int      `json:"subjects"`
	Duration Duration `json:"duration"`
	// Tick is the arrival granularity: arrivals of one subject in one
	// region within a tick arrive together at the tick's start, and are
	// decided one by one (exactly as unit requests at that instant).
	Tick Duration `json:"tick"`
	// Capacity (C) and RefillPerSecond (r) are each subject's global limits.
	// For a window algorithm C is the cost admitted per Window and r is
	// C/Window, the rate group rates are multiples of.
	Capacity        int64   `json:"capacity"`
	RefillPerSecond float64 `json:"refill_per_second"`
	// Algorithm is the policy's bucket algorithm (bucket.Algorithm; empty:
	// token bucket); Window its window (window algorithms only).
	Algorithm bucket.Algorithm `json:"algorithm,omitempty"`
	Window    Duration         `json:"window,omitempty"`
	Groups    []Group          `json:"groups"`
	Events    []Event          `json:"events,omitempty"`
	// Shifts are the instants demand moves; convergence is measured
	// after each.
	Shifts []Duration `json:"shifts,omitempty"`
}

// Group is a set of subjects with one arrival pattern.
type Group struct {
	Name string `json:"name"`
	// Fraction of the scenario's subjects in this group (0..1), or Count
	// subjects when Count > 0. The group's subjects are First, First+1, …
	// (default from subject 0; groups may share subjects), at most up to
	// the last subject.
	Fraction float64 `json:"fraction,omitempty"`
	Count    int     `json:"count,omitempty"`
	First    int     `json:"first,omitempty"`
	// Rate is each subject's mean offered rate over all regions, in units
	// of r. Zipf > 0 skews it across the group's subjects (mean kept).
	Rate float64 `json:"rate"`
	Zipf float64 `json:"zipf,omitempty"`
	// Profile says how the rate is spread over regions and time.
	Profile Profile `json:"profile"`
	// Retries is how many times a denied request is sent again at the next
	// tick (clients ignoring Retry-After).
	Retries int `json:"retries,omitempty"`
}

// Profile kinds.
const (
	ProfileWeights = "weights" // constant split by Weights (missing = 1)
	ProfileDiurnal = "diurnal" // follow the sun: 1+Amplitude·cos(2π(t/Period − i/N))
	ProfileFlash   = "flash"   // Weights, times Factor in Region from At for For
	ProfileHop     = "hop"     // everything in one region, moving on every Every
	ProfileSteps   = "steps"   // Weights, then each step's weights from its At on
)

// Step is a change of a steps profile's weights at At (since the run's
// start). Weights all 0 make the group send nothing until the next step.
type Step struct {
	At      Duration  `json:"at"`
	Weights []float64 `json:"weights"`
}

// Profile spreads a group's rate over regions and time.
type Profile struct {
	Kind      string    `json:"kind"`
	Weights   []float64 `json:"weights,omitempty"`
	Amplitude float64   `json:"amplitude,omitempty"`
	Period    Duration  `json:"period,omitempty"`
	Region    int       `json:"region,omitempty"`
	Factor    float64   `json:"factor,omitempty"`
	At        Duration  `json:"at,omitempty"`
	For       Duration  `json:"for,omitempty"`
	Every     Duration  `json:"every,omitempty"`
	Steps     []Step    `json:"steps,omitempty"`
}

// Event kinds.
const (
	EventRegionDown      = "region_down"      // the region serves nothing and reports nothing; its traffic moves to live regions
	EventRegionUp        = "region_up"        // the region returns at its safe share
	EventCoordinatorDown = "coordinator_down" // no rebalancing until coordinator_up
	EventCoordinatorUp   = "coordinator_up"   // a new leader resumes from the published state
)

// Event is a failure injected at At.
type Event struct {
	At     Duration `json:"at"`
	Kind   string   `json:"kind"`
	Region int      `json:"region,omitempty"`
}

// Validate reports whether s is usable with n regions.
func (s *Scenario) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w %q: %s", ErrScenario, s.Name, fmt.Sprintf(format, a...))
	}
	switch {
	case s.Name == "":
		return fmt.Errorf("%w: no name", ErrScenario)
	case s.Regions < 1 || s.Regions > MaxScenarioRegions:
		return bad("regions %d, want 1 to %d", s.Regions, MaxScenarioRegions)
	case s.Subjects < 1 || s.Subjects > MaxSubjects:
		return bad("subjects %d, want 1 to %d", s.Subjects, MaxSubjects)
	case s.Duration <= 0 || time.Duration(s.Duration) > MaxDuration:
		return bad("duration %v, want up to %v", time.Duration(s.Duration), MaxDuration)
	case time.Duration(s.Tick) < MinTick || s.Tick > s.Duration:
		return bad("tick %v, want %v to the duration", time.Duration(s.Tick), MinTick)
	case time.Duration(s.Duration)/time.Duration(s.Tick) > 100_000_000:
		return bad("%v / %v is too many ticks", time.Duration(s.Duration), time.Duration(s.Tick))
	case s.Capacity < 1 || s.Capacity > 1<<40:
		return bad("capacity %d, want ≥ 1", s.Capacity)
	case !(s.RefillPerSecond > 0) || math.IsInf(s.RefillPerSecond, 0):
		return bad("refill_per_second %v, want > 0", s.RefillPerSecond)
	case s.windowed() && (s.Window < s.Tick || s.Window > s.Duration):
		return bad("window %v, want the tick to the duration", time.Duration(s.Window))
	case !s.windowed() && s.Window != 0:
		return bad("window %v for algorithm %q", time.Duration(s.Window), s.Algorithm)
	case s.Algorithm != "" && s.Algorithm != bucket.TokenBucket && !s.windowed():
		return bad("algorithm %q is not token_bucket, fixed_window, sliding_window or sliding_log", s.Algorithm)
	case len(s.Groups) == 0 || len(s.Groups) > MaxGroups:
		return bad("%d groups, want 1 to %d", len(s.Groups), MaxGroups)
	case len(s.Events) > MaxEvents:
		return bad("%d events, at most %d", len(s.Events), MaxEvents)
	case len(s.Shifts) > MaxEvents:
		return bad("%d shifts, at most %d", len(s.Shifts), MaxEvents)
	}
	for i, g := range s.Groups {
		finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) && v >= 0 }
		switch {
		case !finite(g.Fraction) || g.Fraction > 1 || g.Count < 0 || g.Count > MaxSubjects:
			return bad("group %d: fraction %v / count %d", i, g.Fraction, g.Count)
		case !finite(g.Rate) || g.Rate > 1e6 || !finite(g.Zipf) || g.Zipf > 10:
			return bad("group %d: rate %v, zipf %v", i, g.Rate, g.Zipf)
		case g.Retries < 0 || g.Retries > 100:
			return bad("group %d: retries %d, want 0 to 100", i, g.Retries)
		case g.First < 0 || g.First >= s.Subjects:
			return bad("group %d: first subject %d of %d", i, g.First, s.Subjects)
		}
		p := g.Profile
		for _, w := range p.Weights {
			if !finite(w) {
				return bad("group %d: weight %v", i, w)
			}
		}
		if len(p.Weights) > MaxScenarioRegions {
			return bad("group %d: %d weights", i, len(p.Weights))
		}
		switch p.Kind {
		case ProfileWeights, "":
		case ProfileDiurnal:
			if p.Period <= 0 || !finite(p.Amplitude) || p.Amplitude > 1 {
				return bad("group %d: diurnal needs period > 0 and amplitude in [0,1]", i)
			}
		case ProfileFlash:
			if !finite(p.Factor) || p.Factor > 1e6 || p.Region < 0 || p.For <= 0 {
				return bad("group %d: flash needs factor ≥ 0, region ≥ 0 and for > 0", i)
			}
		case ProfileHop:
			if p.Every <= 0 {
				return bad("group %d: hop needs every > 0", i)
			}
		case ProfileSteps:
			if len(p.Steps) == 0 || len(p.Steps) > MaxEvents {
				return bad("group %d: steps needs 1 to %d steps", i, MaxEvents)
			}
			for k, st := range p.Steps {
				if k > 0 && st.At <= p.Steps[k-1].At || st.At < 0 || len(st.Weights) > MaxScenarioRegions {
					return bad("group %d: step %d at %v with %d weights (steps in time order, at most %d weights)", i, k, time.Duration(st.At), len(st.Weights), MaxScenarioRegions)
				}
				for _, w := range st.Weights {
					if !finite(w) {
						return bad("group %d: step %d weight %v", i, k, w)
					}
				}
			}
		default:
			return bad("group %d: unknown profile %q", i, p.Kind)
		}
	}
	for i, e := range s.Events {
		switch e.Kind {
		case EventRegionDown, EventRegionUp:
			if e.Region < 0 || e.Region >= s.Regions {
				return bad("event %d: region %d of %d", i, e.Region, s.Regions)
			}
		case EventCoordinatorDown, EventCoordinatorUp:
		default:
			return bad("event %d: unknown kind %q", i, e.Kind)
		}
		if e.At < 0 || e.At > s.Duration {
			return bad("event %d at %v, outside the run", i, time.Duration(e.At))
		}
	}
	return nil
}

// ParseScenario reads a scenario from JSON, rejecting unknown fields.
func ParseScenario(data []byte) (*Scenario, error) {
	if len(data) > maxScenarioLen {
		return nil, fmt.Errorf("%w: %d bytes, at most %d", ErrScenario, len(data), maxScenarioLen)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var s Scenario
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrScenario, err)
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return &s, nil
}

// Builtin returns the names of the built-in scenarios, sorted.
func Builtin() []string {
	ents, _ := fs.ReadDir(builtinFS, "scenarios")
	var names []string
	for _, e := range ents {
		names = append(names, strings.TrimSuffix(e.Name(), ".json"))
	}
	sort.Strings(names)
	return names
}

// LoadScenario returns the built-in scenario called nameOrPath, or reads
// the scenario file at that path.
func LoadScenario(nameOrPath string) (*Scenario, error) {
	if data, err := builtinFS.ReadFile(path.Join("scenarios", nameOrPath+".json")); err == nil && !strings.ContainsAny(nameOrPath, "/\\.") {
		return ParseScenario(data)
	}
	f, err := os.Open(nameOrPath)
	if err != nil {
		return nil, fmt.Errorf("sim: scenario %q is neither built in (%s) nor a readable file: %w", nameOrPath, strings.Join(Builtin(), ", "), err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxScenarioLen+1))
	if err != nil {
		return nil, fmt.Errorf("sim: reading scenario %s: %w", nameOrPath, err)
	}
	s, err := ParseScenario(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", nameOrPath, err)
	}
	return s, nil
}

// windowed says the scenario's policy uses a window algorithm.
func (s *Scenario) windowed() bool {
	switch s.Algorithm {
	case bucket.FixedWindow, bucket.SlidingWindow, bucket.SlidingLog:
		return true
	}
	return false
}
