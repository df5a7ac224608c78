package etcdlayout

import (
	"time"

	"github.com/quotacoord/quota/plan"
)

// Registration says a node of a region is alive. It lives under the
// node's lease. A region is live while any of its nodes is registered.
type Registration struct {
	Region string `json:"region"`
	// Node is the node's id within the region.
	Node string `json:"node,omitempty"`
	// Addr is the region's admission gRPC address, for operators.
	Addr string `json:"addr,omitempty"`
	// LeaseTTLSeconds is the TTL of the lease everything of the node
	// lives under.
	LeaseTTLSeconds int64     `json:"lease_ttl_s"`
	StartedAt       time.Time `json:"started_at"`
	// Fingerprint identifies the node's policies and subject naming
	// (plan.Node.Fingerprint); rewritten when they change.
	Fingerprint string `json:"fingerprint,omitempty"`
}

// DemandReport is one node's demand over one report interval, for every
// policy it saw. It lives under the node's lease; a region's demand is the
// sum over its nodes.
type DemandReport struct {
	Region string `json:"region"`
	// Node is the reporting node's id.
	Node string `json:"node,omitempty"`
	// At is the end of the interval on the region's clock.
	At time.Time `json:"at"`
	// IntervalSeconds is the length of the interval.
	IntervalSeconds float64 `json:"interval_s"`
	// Policies maps policy name to its demand.
	Policies map[string]PolicyDemand `json:"policies"`
}

// The records the planner reads and writes are defined in package plan,
// the one place that gives them meaning; the layout stores them as JSON.
type (
	PolicyDemand  = plan.PolicyDemand
	SubjectDemand = plan.SubjectDemand
	Phase         = plan.Phase
	Allocation    = plan.Allocation
	Shares        = plan.Shares
	Control       = plan.Control
	Behind        = plan.Behind
)

// The phases of an allocation (plan.PhaseShrink, plan.PhaseStable).
const (
	PhaseShrink = plan.PhaseShrink
	PhaseStable = plan.PhaseStable
)

// Ack says which epoch of each policy a node has applied. It lives under
// the node's lease. A region has acknowledged an epoch when every live
// node of it has.
type Ack struct {
	Region string `json:"region"`
	// Node is the acknowledging node's id.
	Node   string            `json:"node,omitempty"`
	Epochs map[string]uint64 `json:"epochs"`
	At     time.Time         `json:"at"`
}

// Settings are published by the coordinator for the regions.
type Settings struct {
	ReportIntervalSeconds float64 `json:"report_interval_s"`
	LeaseTTLSeconds       int64   `json:"lease_ttl_s"`
	// AckDeadlineSeconds is how long a node may go without its watch of
	// the allocations making progress before it falls back to its safe
	// shares by itself, and so how long after the leader first saw a
	// shrink epoch it waits for a node's acknowledgement (plus the skew
	// margin) before counting that node at its safe share. 0: no deadline.
	AckDeadlineSeconds float64 `json:"ack_deadline_s,omitempty"`
}

// RetiredRegion says an operator retired a region: no allocation holds it
// while it has no registered node.
type RetiredRegion struct {
	At    time.Time `json:"at"`
	Actor string    `json:"actor"`
}

// AuditEntry records one operator action.
type AuditEntry struct {
	At     time.Time `json:"at"`
	Actor  string    `json:"actor"`
	Action string    `json:"action"`
	Policy string    `json:"policy,omitempty"`
	Detail string    `json:"detail,omitempty"`
}
