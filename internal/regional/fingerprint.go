package regional

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"github.com/quotacoord/quota/internal/policy"
)

// fingerprintOf identifies what decides a subject's bucket on a node
// with policies s and configuration c: every policy's name and key
// version (which changes with its limits), the subject salt (as a hash:
// the fingerprint is stored in etcd), the Envoy plain keys and the IPv6
// grouping. Nodes of a deployment with different fingerprints count one
// tenant as different subjects, or under different limits; the leader
// leaves out a region whose nodes disagree with the rest
// (plan.View.Mismatched).
func fingerprintOf(s *policy.Set, c *Config) string {
	h := sha256.New()
	salt := sha256.Sum256([]byte(c.SubjectSalt))
	fmt.Fprintf(h, "salt %x\nplain %s\nipv6 %d\n", salt[:8], strings.Join(slices.Sorted(slices.Values(c.EnvoyPlainKeys)), ","), c.IPv6SubjectPrefix)
	if s != nil {
		for _, p := range s.Policies() {
			fmt.Fprintf(h, "policy %s %d\n", p.Name, p.KeyVersion())
		}
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// Fingerprint is the node's fingerprint (fingerprintOf) for its current
// policies; "" before the first.
func (n *Node) Fingerprint() string {
	if v, ok := n.fingerprint.Load().(string); ok {
		return v
	}
	return ""
}
