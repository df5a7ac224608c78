package regional

import (
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/redistest"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

// TestNoRawDescriptorValuesInRedis drives API keys and addresses through
// the Envoy API (window buckets keep a key per subject) and the own API
// (token buckets are hash fields) against a private Redis, then reads
// every key and every hash field: no raw value is there, while a value
// under a key listed in EnvoyPlainKeys stays readable.
func TestNoRawDescriptorValuesInRedis(t *testing.T) {
	srv := redistest.Start(t)
	rc, err := redisClient(srv.Addr, 100*time.Millisecond, bucket.DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rc.Close() })
	h := startNode(t, Config{Store: redisStore(t, rc), StoreTimeout: time.Second, SubjectSalt: "pepper",
		EnvoyPlainKeys: []string{"tenant"}}, map[string]string{
		"envoy.yaml": `domain: edge
descriptors:
  - key: api_key
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 5}
`,
		"own.yaml": `policies:
  - {name: per-key, subject: api_key, capacity: 5, rate: 5/second, failure_mode: closed}
`,
	})
	ctx := ctxT(t)
	secrets := []string{"AKIAIOSFODNN7EXAMPLE", "sk_live_4eC39HqLyjWDarjtT1zdp7dc", "203.0.113.77", "pepper"}
	for _, d := range []*rlcommon.RateLimitDescriptor{
		desc("api_key", secrets[0]), desc("api_key", secrets[1]), desc("remote_address", secrets[2]), desc("tenant", "acme-corp"),
	} {
		r, err := h.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{d}})
		if err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("%v: %v, %v", d, r, err)
		}
	}
	for _, s := range secrets[:2] {
		if r, err := h.adm.Check(ctx, &quotav1.CheckRequest{Subject: s, Policies: []string{"per-key"}}); err != nil || !r.Allowed {
			t.Fatalf("own API: %v, %v", r, err)
		}
	}
	client := srv.Client(t)
	keys, err := client.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	for _, k := range keys {
		text.WriteString(k + "\n")
		if typ, _ := client.Type(ctx, k).Result(); typ == "hash" {
			fields, err := client.HKeys(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			text.WriteString(strings.Join(fields, "\n") + "\n")
		}
	}
	dump := strings.ToLower(text.String())
	if !strings.Contains(dump, "acme-corp") {
		t.Fatalf("the plain tenant is not readable in Redis: the scan proves nothing\n%s", dump)
	}
	for _, s := range secrets {
		if strings.Contains(dump, strings.ToLower(s)) {
			t.Errorf("%q appears in Redis keys or fields:\n%s", s, dump)
		}
	}
}
