package plan

import "time"

// Phase is where an allocation stands in the two-step publish.
type Phase string

const (
	// PhaseShrink: every share is min(old, target); growth waits until
	// every region of the allocation acknowledged this epoch or lost its
	// lease a skew margin ago.
	PhaseShrink Phase = "shrink"
	// PhaseStable: the shares are the target.
	PhaseStable Phase = "stable"
)

// Protocol says how a change of shares is published.
type Protocol string

const (
	// TwoStep publishes min(old, new) first and the new shares only after
	// every region acknowledged the shrink.
	TwoStep Protocol = "two-step"
	// Naive publishes the new shares at once. Regions apply them at
	// different moments, so Σ shares may exceed 1 + ε for a while; it
	// exists for comparison.
	Naive Protocol = "naive"
)

// Shares is a default split plus per-subject overrides, as fractions of
// the policy's global budget.
type Shares struct {
	// Default maps region to its share for subjects without an override.
	Default map[string]float64 `json:"default"`
	// Overrides maps subject to region to share, for pressured subjects.
	Overrides map[string]map[string]float64 `json:"overrides,omitempty"`
}

// Allocation is one policy's shares at one epoch. Regions enforce Default
// for every subject without an entry in Overrides.
type Allocation struct {
	Policy string `json:"policy"`
	// Epoch increases by one with every publish.
	Epoch uint64 `json:"epoch"`
	Phase Phase  `json:"phase"`
	// Default maps region to its share for subjects without an override.
	Default map[string]float64 `json:"default"`
	// Overrides maps subject to region to share, for pressured subjects.
	Overrides map[string]map[string]float64 `json:"overrides,omitempty"`
	// Target is the allocation the shrink phase leads to (PhaseShrink only).
	Target *Shares `json:"target,omitempty"`
	// Safe maps region to its safe (minimum) share, which the region falls
	// back to when it loses its lease. A shrink epoch holds min(old, new)
	// of each region's safe share, and TargetSafe the new one, which the
	// growth publishes.
	Safe       map[string]float64 `json:"safe"`
	TargetSafe map[string]float64 `json:"target_safe,omitempty"`
	// Held maps region to the largest safe share it may still fall back
	// to: the largest of the epochs it has not acknowledged (a region cut
	// off keeps the safe share it last read, whatever an operator set
	// since). The plan reserves at least that much for the region.
	Held map[string]float64 `json:"held,omitempty"`
	// Overcommit is the policy's ε at publish time.
	Overcommit  float64   `json:"overcommit"`
	PublishedAt time.Time `json:"published_at"`
	// Reason says why the shares moved, for operators.
	Reason string `json:"reason,omitempty"`
	// Demand is the planner's smoothed demand per region the shares were
	// planned from, and SubjectDemand each ranked pressured subject's (as
	// fractions of the policy's rate): a new leader starts its smoothing
	// from them (Leader.Track) rather than from one report per region.
	// Records written before they existed lack them; a leader then takes
	// its first observation from the reports.
	Demand        map[string]float64            `json:"demand,omitempty"`
	SubjectDemand map[string]map[string]float64 `json:"subject_demand,omitempty"`
}

// Control is an operator's steering of one policy.
type Control struct {
	Frozen   bool               `json:"frozen,omitempty"`
	Pins     map[string]float64 `json:"pins,omitempty"`
	Weights  map[string]float64 `json:"weights,omitempty"`
	Minimums map[string]float64 `json:"minimums,omitempty"`
}

// PolicyDemand is the demand of one policy in one region over a report
// interval. Rates are cost units per second; denied cost counts as
// offered.
type PolicyDemand struct {
	Offered  float64 `json:"offered"`
	Admitted float64 `json:"admitted"`
	// Pressured are the top subjects under pressure (denied, or below half
	// their local capacity), most pressured first; at most a bounded number.
	Pressured []SubjectDemand `json:"pressured,omitempty"`
}

// SubjectDemand is the demand of one pressured subject.
type SubjectDemand struct {
	Subject  string  `json:"subject"`
	Offered  float64 `json:"offered"`
	Admitted float64 `json:"admitted"`
	Denied   bool    `json:"denied,omitempty"`
}
