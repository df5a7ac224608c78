package etcdlayout

import "time"

// Registration says a node of a region is alive. It lives under the
// node's lease. A region is live while any of its nodes is registered.
type Registration struct {
	Region string `json:"region"`
	// Node is the node's id within the region ("" for a pre-node key).
	Node string `json:"node,omitempty"`
	// Addr is the region's admission gRPC address, for operators.
	Addr string `json:"addr,omitempty"`
	// LeaseTTLSeconds is the TTL of the lease everything of the node
	// lives under.
	LeaseTTLSeconds int64     `json:"lease_ttl_s"`
	StartedAt       time.Time `json:"started_at"`
}

// DemandReport is one node's demand over one report interval, for every
// policy it saw. It lives under the node's lease; a region's demand is the
// sum over its nodes.
type DemandReport struct {
	Region string `json:"region"`
	// Node is the reporting node's id ("" for a pre-node key).
	Node string `json:"node,omitempty"`
	// At is the end of the interval on the region's clock.
	At time.Time `json:"at"`
	// IntervalSeconds is the length of the interval.
	IntervalSeconds float64 `json:"interval_s"`
	// Policies maps policy name to its demand.
	Policies map[string]PolicyDemand `json:"policies"`
}

// PolicyDemand is the demand of one policy in one region and interval.
// Rates are cost units per second; denied cost counts as offered.
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

// Phase is where an allocation stands in the two-step publish protocol.
type Phase string

const (
	// PhaseShrink: every share is min(old, target); the coordinator waits
	// for every live region to acknowledge this epoch before growing.
	PhaseShrink Phase = "shrink"
	// PhaseStable: the shares are the target.
	PhaseStable Phase = "stable"
)

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
	// back to when it loses its lease.
	Safe map[string]float64 `json:"safe"`
	// Overcommit is the policy's ε at publish time.
	Overcommit  float64   `json:"overcommit"`
	PublishedAt time.Time `json:"published_at"`
	// Reason says why the shares moved, for operators.
	Reason string `json:"reason,omitempty"`
}

// Shares is a default split plus subject overrides.
type Shares struct {
	Default   map[string]float64            `json:"default"`
	Overrides map[string]map[string]float64 `json:"overrides,omitempty"`
}

// Ack says which epoch of each policy a node has applied. It lives under
// the node's lease. A region has acknowledged an epoch when every live
// node of it has.
type Ack struct {
	Region string `json:"region"`
	// Node is the acknowledging node's id ("" for a pre-node key).
	Node   string            `json:"node,omitempty"`
	Epochs map[string]uint64 `json:"epochs"`
	At     time.Time         `json:"at"`
}

// Control holds the operator's steering of one policy.
type Control struct {
	Frozen   bool               `json:"frozen,omitempty"`
	Pins     map[string]float64 `json:"pins,omitempty"`
	Weights  map[string]float64 `json:"weights,omitempty"`
	Minimums map[string]float64 `json:"minimums,omitempty"`
}

// Settings are published by the coordinator for the regions.
type Settings struct {
	ReportIntervalSeconds float64 `json:"report_interval_s"`
	LeaseTTLSeconds       int64   `json:"lease_ttl_s"`
}

// AuditEntry records one operator action.
type AuditEntry struct {
	At     time.Time `json:"at"`
	Actor  string    `json:"actor"`
	Action string    `json:"action"`
	Policy string    `json:"policy,omitempty"`
	Detail string    `json:"detail,omitempty"`
}
