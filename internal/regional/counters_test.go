package regional

import (
	"fmt"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotacoord/quota/internal/policy"
)

// labelledCount is the value of decisions_total for one label set.
func labelledCount(t *testing.T, g prometheus.Gatherer, pol, result string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "quota_regional_decisions_total" {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			want := map[string]string{"policy": pol, "region": "test", "result": result}
			for _, lp := range m.GetLabel() {
				if want[lp.GetName()] != lp.GetValue() {
					continue metric
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// TestDecisionCounters: the decision counters cached per policy count
// each result under its own labels, and a reloaded policy set (new
// policies under the same names) keeps counting on the same series.
func TestDecisionCounters(t *testing.T) {
	const envoy = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 2}\n"
	h := startNode(t, Config{}, map[string]string{"e.yaml": envoy})
	ask := func() rlsv3.RateLimitResponse_Code { return askKV(t, h) }
	name := h.node.Policies().Policies()[0].Name
	steps := []struct {
		name            string
		reload          bool
		want            rlsv3.RateLimitResponse_Code
		allowed, denied float64
	}{
		{"first", false, rlsv3.RateLimitResponse_OK, 1, 0},
		{"second", false, rlsv3.RateLimitResponse_OK, 2, 0},
		{"third denied", false, rlsv3.RateLimitResponse_OVER_LIMIT, 2, 1},
		{"after a reload", true, rlsv3.RateLimitResponse_OVER_LIMIT, 2, 2},
	}
	for _, st := range steps {
		if st.reload {
			s, err := policy.Load(h.dir)
			if err != nil {
				t.Fatal(err)
			}
			h.node.SetPolicies(s)
		}
		if got := ask(); got != st.want {
			t.Fatalf("%s: code %v, want %v", st.name, got, st.want)
		}
		if a, d := labelledCount(t, h.reg, name, resultAllowed), labelledCount(t, h.reg, name, resultDenied); a != st.allowed || d != st.denied {
			t.Fatalf("%s: allowed %v, denied %v; want %v, %v", st.name, a, d, st.allowed, st.denied)
		}
	}
}

// TestPolicyStateFollowsReload: the state a node caches per policy (key
// version, live subjects, counters) follows a reload: a policy whose
// limits change is charged to buckets of its new key version and counted
// on the same series, and a reload drops the cached states, so that
// those of policies no longer loaded (and their live subjects) are not
// kept.
func TestPolicyStateFollowsReload(t *testing.T) {
	const rule = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: %d}\n"
	h := startNode(t, Config{}, map[string]string{"e.yaml": fmt.Sprintf(rule, 1)})
	ask := func() rlsv3.RateLimitResponse_Code { return askKV(t, h) }
	if got := ask(); got != rlsv3.RateLimitResponse_OK {
		t.Fatalf("first check: %v, want OK", got)
	}
	if got := ask(); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("second check: %v, want OVER_LIMIT", got)
	}
	old := h.node.Policies().Policies()[0]
	if _, ok := h.node.states.Load(old); !ok {
		t.Fatal("no state cached for the checked policy")
	}
	if err := writeFile(h.dir, "e.yaml", fmt.Sprintf(rule, 2)); err != nil {
		t.Fatal(err)
	}
	s, err := policy.Load(h.dir)
	if err != nil {
		t.Fatal(err)
	}
	h.node.SetPolicies(s)
	if _, ok := h.node.states.Load(old); ok {
		t.Fatal("the replaced policy's state is still cached after the reload")
	}
	ask()
	p := h.node.Policies().Policies()[0]
	keys := h.store.seen()
	if v := keys[len(keys)-1].Version(); v != p.KeyVersion() || v == old.KeyVersion() {
		t.Fatalf("charged to key version %d, want the new policy's %d (old %d)", v, p.KeyVersion(), old.KeyVersion())
	}
	st, ok := h.node.states.Load(p)
	if !ok {
		t.Fatal("no state cached for the reloaded policy")
	}
	if v := st.(*policyState).version; v != p.KeyVersion() || v == old.KeyVersion() {
		t.Fatalf("cached key version %d, want the new policy's %d (old %d)", v, p.KeyVersion(), old.KeyVersion())
	}
	if a, d := labelledCount(t, h.reg, p.Name, resultAllowed), labelledCount(t, h.reg, p.Name, resultDenied); a+d != 3 || a < 1 || d < 1 {
		t.Fatalf("allowed %v, denied %v; want 3 checks counted, 1 allowed and 1 denied before the reload", a, d)
	}
}

// askKV checks descriptor k=v of domain d on h's Envoy API and returns the
// overall code.
func askKV(t *testing.T, h *harness) rlsv3.RateLimitResponse_Code {
	t.Helper()
	resp, err := h.rls.ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{Domain: "d",
		Descriptors: []*rlcommon.RateLimitDescriptor{desc("k", "v")}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetOverallCode()
}
