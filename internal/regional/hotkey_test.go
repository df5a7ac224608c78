package regional

import (
	"strings"
	"testing"
	"time"

	"github.com/quotacoord/quota/internal/redistest"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

// TestShardedPolicyExactOverRedis: a policy with shards: 4 in the policy
// file reaches the store through the node: 500 concurrent checks of one
// subject over gRPC against real Redis admit exactly its capacity, and the
// subject's budget lies in four sub-buckets in four Redis groups.
func TestShardedPolicyExactOverRedis(t *testing.T) {
	files := map[string]string{
		"own.yaml": "policies:\n  - name: api-global\n    subject: global\n    capacity: 100\n    rate: 100/hour\n    shards: 4\n    failure_mode: closed\n",
	}
	c := redistest.Client(t)
	h := startNode(t, Config{Store: redisStore(t, c), StoreTimeout: 10 * time.Second}, files)
	ctx := ctxT(t)
	subject := redistest.Unique(t)
	got := concurrently(t, func() (bool, error) {
		r, err := h.adm.Check(ctx, &quotav1.CheckRequest{Subject: subject, Policies: []string{"api-global"}, Cost: 1})
		if err != nil {
			return false, err
		}
		if r.Degraded != "" {
			t.Errorf("degraded decision %q", r.Degraded)
		}
		return r.Allowed, nil
	})
	if got != 100 {
		t.Fatalf("admitted %d of 500, want exactly 100", got)
	}
	keys, err := c.Keys(ctx, "rl:v*:{g.*}:api-global").Result()
	if err != nil {
		t.Fatal(err)
	}
	groups := 0
	for _, k := range keys {
		fields, err := c.HKeys(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fields {
			if strings.HasPrefix(f, subject+".") {
				groups++
			} else if f == subject {
				t.Errorf("a whole bucket of %s in %s", subject, k)
			}
		}
	}
	if groups != 4 {
		t.Fatalf("the subject's sub-buckets lie in %d groups, want 4", groups)
	}
}
