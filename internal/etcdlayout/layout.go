package etcdlayout

import (
	"fmt"
	"strings"
	"time"
)

// DefaultPrefix is the prefix every key lives under unless configured.
const DefaultPrefix = "/quota/v1/"

// Layout builds keys under Prefix. The zero value uses DefaultPrefix.
type Layout struct {
	Prefix string
}

func (l Layout) p() string {
	if l.Prefix == "" {
		return DefaultPrefix
	}
	if !strings.HasSuffix(l.Prefix, "/") {
		return l.Prefix + "/"
	}
	return l.Prefix
}

// PoliciesPrefix holds the policy documents.
func (l Layout) PoliciesPrefix() string { return l.p() + "policies/" }

// PolicyDoc is the key of one policy document.
func (l Layout) PolicyDoc(doc string) string { return l.PoliciesPrefix() + doc }

// RegionsPrefix holds the leased region registrations.
func (l Layout) RegionsPrefix() string { return l.p() + "regions/" }

// Region is the key of one region's registration.
func (l Layout) Region(region string) string { return l.RegionsPrefix() + region }

// DemandPrefix holds the leased demand reports.
func (l Layout) DemandPrefix() string { return l.p() + "demand/" }

// Demand is the key of one region's demand report.
func (l Layout) Demand(region string) string { return l.DemandPrefix() + region }

// AllocPrefix holds the published allocations.
func (l Layout) AllocPrefix() string { return l.p() + "alloc/" }

// Alloc is the key of one policy's allocation.
func (l Layout) Alloc(policy string) string { return l.AllocPrefix() + policy }

// AcksPrefix holds the leased acknowledgements.
func (l Layout) AcksPrefix() string { return l.p() + "acks/" }

// Ack is the key of one region's acknowledgement.
func (l Layout) Ack(region string) string { return l.AcksPrefix() + region }

// ControlPrefix holds the operator's per-policy controls.
func (l Layout) ControlPrefix() string { return l.p() + "control/" }

// Control is the key of one policy's operator controls.
func (l Layout) Control(policy string) string { return l.ControlPrefix() + policy }

// Settings is the key of the coordinator's published settings.
func (l Layout) Settings() string { return l.p() + "settings" }

// Election is the coordinator election prefix.
func (l Layout) Election() string { return l.p() + "election" }

// AuditPrefix holds the audit log.
func (l Layout) AuditPrefix() string { return l.p() + "audit/" }

// Audit is the key of one audit entry; keys sort by time.
func (l Layout) Audit(at time.Time, seq uint64) string {
	return fmt.Sprintf("%s%020d-%06d", l.AuditPrefix(), at.UnixNano(), seq)
}

// Name returns the last path element of key below prefix, or "" when key
// is not below prefix.
func Name(prefix, key string) string {
	if !strings.HasPrefix(key, prefix) {
		return ""
	}
	return key[len(prefix):]
}
