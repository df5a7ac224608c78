package deploycheck

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"

	matcherv3 "github.com/cncf/xds/go/xds/type/matcher/v3"
	rlqv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	// The typed configs an RLQS filter's matchers name, so that protojson
	// can resolve them.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/matching/common_inputs/network/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/policy"
)

// quotaFilterName is the rate_limit_quota filter (the Rate Limit Quota
// Service client).
const quotaFilterName = "envoy.filters.http.rate_limit_quota"

// quotaFilter checks a rate_limit_quota filter (docs/rlqs.md): its config
// decodes and passes Envoy's own validation; its RLQS server is a defined
// cluster on the regional node's gRPC port; its domain is served by a
// policy file; and every bucket its matchers build denies all before the
// first assignment and after one expired (anything else admits outside
// any lease, so the bound would not hold), reports in whole seconds, and
// has an id that matches a leasable (token bucket) or unlimited rule.
func (c *checker) quotaFilter(file string, f map[string]any, clusters map[string]map[string]any) {
	var cfg rlqv3.RateLimitQuotaFilterConfig
	if err := decodeTyped(f["typed_config"], &cfg); err != nil {
		c.add(file, "rate_limit_quota filter: %v", err)
		return
	}
	if err := cfg.ValidateAll(); err != nil {
		c.add(file, "rate_limit_quota filter: %v", err)
		return
	}
	cl := cfg.GetRlqsServer().GetEnvoyGrpc().GetClusterName()
	if cl == "" {
		c.add(file, "rate_limit_quota filter: rlqs_server is not an envoy_grpc cluster")
	} else {
		c.rlsCluster(file, cl, clusters[cl])
	}
	set := c.domainSet(cfg.GetDomain())
	if set == nil {
		c.add(file, "rate_limit_quota domain %q is served by no policy file in deploy/", cfg.GetDomain())
	}
	var actions []*matcherv3.Matcher_OnMatch
	walkOnMatch(cfg.GetBucketMatchers(), func(m *matcherv3.Matcher_OnMatch) { actions = append(actions, m) })
	n := 0
	for _, m := range actions {
		a := m.GetAction()
		if a == nil {
			continue
		}
		var bs rlqv3.RateLimitQuotaBucketSettings
		if err := a.GetTypedConfig().UnmarshalTo(&bs); err != nil {
			c.add(file, "rate_limit_quota bucket %q: %v", a.GetName(), err)
			continue
		}
		n++
		c.quotaBucket(file, a.GetName(), &bs, set, cfg.GetDomain())
	}
	if n == 0 {
		c.add(file, "rate_limit_quota filter: its bucket_matchers build no bucket")
	}
}

func (c *checker) quotaBucket(file, name string, bs *rlqv3.RateLimitQuotaBucketSettings, set *policy.Set, domain string) {
	if err := bs.ValidateAll(); err != nil {
		c.add(file, "rate_limit_quota bucket %q: %v", name, err)
		return
	}
	deny := func(s *typev3.RateLimitStrategy) bool {
		return s.GetBlanketRule() == typev3.RateLimitStrategy_DENY_ALL && s.GetStrategy() != nil
	}
	if !deny(bs.GetNoAssignmentBehavior().GetFallbackRateLimit()) {
		c.add(file, "rate_limit_quota bucket %q: no_assignment_behavior is not DENY_ALL: a new bucket's requests are admitted outside any lease (docs/rlqs.md)", name)
	}
	if !deny(bs.GetExpiredAssignmentBehavior().GetFallbackRateLimit()) {
		c.add(file, "rate_limit_quota bucket %q: expired_assignment_behavior is not a DENY_ALL fallback: requests after an assignment expired are admitted outside any lease (docs/rlqs.md)", name)
	}
	if d := bs.GetReportingInterval().AsDuration(); d < time.Second || d%time.Second != 0 {
		c.add(file, "rate_limit_quota bucket %q: reporting_interval %v is not whole seconds (the filter reports time_elapsed in whole seconds)", name, d)
	}
	if set == nil {
		return
	}
	ids := bs.GetBucketIdBuilder().GetBucketIdBuilder()
	keys := make([]string, 0, len(ids))
	for k := range ids {
		keys = append(keys, k)
	}
	slices.Sort(keys) // the node's order without -rlqs-key-order
	entries := make([]policy.Entry, 0, len(keys))
	for _, k := range keys {
		v := ids[k].GetStringValue()
		if ids[k].GetCustomValue() != nil {
			v = "example"
		}
		entries = append(entries, policy.Entry{Key: k, Value: v})
	}
	got, err := set.MatchDescriptors(domain, [][]policy.Entry{entries})
	switch {
	case err != nil:
		c.add(file, "rate_limit_quota bucket %q: bucket id %v: %v", name, entries, err)
	case len(got) != 1 || (got[0].Policy == nil && !got[0].Unlimited):
		c.add(file, "rate_limit_quota bucket %q: bucket id %v matches no rule of domain %q (the node answers ALLOW_ALL)", name, entries, domain)
	case got[0].Unlimited:
	case got[0].Policy.Limits.Algorithm != bucket.TokenBucket || bucket.MaxLeaseFor(got[0].Policy.Limits) <= 0:
		c.add(file, "rate_limit_quota bucket %q: bucket id %v matches rule %q, which cannot be leased (not a token bucket: give it a burst); the bucket gets no assignment", name, entries, got[0].Policy.Name)
	}
}

// decodeTyped decodes a YAML typed_config (with its "@type") into m.
func decodeTyped(tc any, m proto.Message) error {
	if tc == nil {
		return fmt.Errorf("no typed_config")
	}
	raw, err := json.Marshal(tc)
	if err != nil {
		return fmt.Errorf("typed_config: %w", err)
	}
	var a anypb.Any
	if err := protojson.Unmarshal(raw, &a); err != nil {
		return fmt.Errorf("typed_config: %w", err)
	}
	if err := a.UnmarshalTo(m); err != nil {
		return fmt.Errorf("typed_config: %w", err)
	}
	return nil
}

// walkOnMatch calls f for every OnMatch of m and its nested matchers.
func walkOnMatch(m *matcherv3.Matcher, f func(*matcherv3.Matcher_OnMatch)) {
	if m == nil {
		return
	}
	visit := func(om *matcherv3.Matcher_OnMatch) {
		if om == nil {
			return
		}
		f(om)
		walkOnMatch(om.GetMatcher(), f)
	}
	for _, fm := range m.GetMatcherList().GetMatchers() {
		visit(fm.GetOnMatch())
	}
	if t := m.GetMatcherTree(); t != nil {
		for _, om := range t.GetExactMatchMap().GetMap() {
			visit(om)
		}
		for _, om := range t.GetPrefixMatchMap().GetMap() {
			visit(om)
		}
	}
	visit(m.GetOnNoMatch())
}
