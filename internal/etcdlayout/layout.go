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

// Root is the prefix every key of the layout lives under, ending in "/".
func (l Layout) Root() string { return l.p() }

// PoliciesPrefix holds the policy documents.
func (l Layout) PoliciesPrefix() string { return l.p() + "policies/" }

// PolicyDoc is the key of one policy document.
func (l Layout) PolicyDoc(doc string) string { return l.PoliciesPrefix() + doc }

// RegionsPrefix holds the leased node registrations.
func (l Layout) RegionsPrefix() string { return l.p() + "regions/" }

// RegionNodes is the prefix of every node registration of one region.
func (l Layout) RegionNodes(region string) string { return l.RegionsPrefix() + region + "/" }

// Node is the key of one node's registration, regions/{region}/{node}.
func (l Layout) Node(region, node string) string { return l.RegionNodes(region) + node }

// DemandPrefix holds the leased demand reports.
func (l Layout) DemandPrefix() string { return l.p() + "demand/" }

// AllocPrefix holds the published allocations.
func (l Layout) AllocPrefix() string { return l.p() + "alloc/" }

// Alloc is the key of one policy's allocation.
func (l Layout) Alloc(policy string) string { return l.AllocPrefix() + policy }

// AcksPrefix holds the acknowledgements, which outlive their node's
// lease until a leader keeps the node among the vanished ones.
func (l Layout) AcksPrefix() string { return l.p() + "acks/" }

// ControlPrefix holds the operator's per-policy controls.
func (l Layout) ControlPrefix() string { return l.p() + "control/" }

// Control is the key of one policy's operator controls.
func (l Layout) Control(policy string) string { return l.ControlPrefix() + policy }

// RetiredPrefix holds the regions an operator retired (RetiredRegion).
func (l Layout) RetiredPrefix() string { return l.p() + "retired/" }

// Retired is the key of one retired region.
func (l Layout) Retired(region string) string { return l.RetiredPrefix() + region }

// BehindPrefix holds, per region, the nodes the leader saw lose their
// registration before acknowledging, until they register again
// (plan.Behind): a new leader reads them back.
func (l Layout) BehindPrefix() string { return l.p() + "behind/" }

// Behind is the key of one region's vanished nodes.
func (l Layout) Behind(region string) string { return l.BehindPrefix() + region }

// Settings is the key of the coordinator's published settings.
func (l Layout) Settings() string { return l.p() + "settings" }

// SubjectSalt holds the deployment's subject salt, the HMAC key of every
// hashed subject (bucket.HashSubject): created once by the first node
// that starts without -subject-salt, then read by every node of every
// region, so that one identity names one bucket everywhere. Nodes must
// be able to read it and create it; nobody should overwrite it.
func (l Layout) SubjectSalt() string { return l.p() + "subject-salt" }

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

// MaxNameLen bounds the names etcd keys carry.
const MaxNameLen = 64

// ValidName says s is a valid name for the keys: a region, a node id, a
// policy or a policy document, [A-Za-z0-9_.-]{1,64}. It is the one
// definition of that syntax; everything that names a region, node or
// policy checks with it.
func ValidName(s string) bool {
	if len(s) == 0 || len(s) > MaxNameLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !ValidNameByte(s[i]) {
			return false
		}
	}
	return true
}

// ValidNameByte says c may appear in a name (ValidName).
func ValidNameByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.'
}

// NodeOf splits a registration key below prefix (RegionsPrefix),
// {prefix}{region}/{node}, into region and node. ok is
// false for any other key, or one with an invalid region or node.
func NodeOf(prefix, key string) (region, node string, ok bool) {
	rest := Name(prefix, key)
	region, node, split := strings.Cut(rest, "/")
	if !split || !ValidName(region) || !ValidName(node) {
		return "", "", false
	}
	return region, node, true
}
