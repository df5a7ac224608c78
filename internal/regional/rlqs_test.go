package regional

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/clock"
	"github.com/quotacoord/quota/internal/policy"
	"github.com/quotacoord/quota/internal/rlqs"
)

// TestRLQSOnTheGRPCPort runs a node with -rlqs and an Envoy rule with a
// burst: an Envoy-faithful client subscribes by its first report, gets a
// token bucket at the node's share, and the metrics count the stream.
func TestRLQSOnTheGRPCPort(t *testing.T) {
	dir := t.TempDir()
	rules := "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 20, burst: 40}\n"
	if err := os.WriteFile(filepath.Join(dir, "edge.yaml"), []byte(rules), 0o600); err != nil {
		t.Fatal(err)
	}
	g, h, _, stop := runNode(t, DaemonConfig{Policies: dir, EnvoyPlainKeys: []string{"tenant"},
		RLQS: RLQSConfig{Enabled: true, Interval: 200 * time.Millisecond, TTL: 2 * time.Second, Margin: time.Second}})
	defer func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
	}()
	conn, err := grpc.NewClient(g, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := rlqs.NewClient(rlqs.ClientConfig{Domain: "edge", NoAssignment: rlqs.DenyAll, ReportNew: true})
	if err := c.Connect(context.Background(), conn); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	id := map[string]string{"tenant": "acme"}
	c.Allow(id)
	deadline := time.Now().Add(10 * time.Second)
	for !c.Allow(id) {
		if time.Now().After(deadline) {
			t.Fatalf("no token bucket assigned: %+v", c.Stats())
		}
		time.Sleep(20 * time.Millisecond)
	}
	resp, err := http.Get("http://" + h + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	body := string(b)
	for _, m := range []string{"quota_rlqs_streams 1", "quota_rlqs_buckets 1"} {
		if !strings.Contains(body, m) {
			t.Errorf("metrics lack %q", m)
		}
	}
}

// TestLeaseRequestIsTheChecksBucket: a lease built by leaseRequest sees
// what the node's Envoy checks spent: one bucket, one key version.
func TestLeaseRequestIsTheChecksBucket(t *testing.T) {
	clk := clock.NewManual(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	store := memoryStore(t, clk)
	n, err := New(Config{Region: "r", Store: store, Local: memoryStore(t, clk), EnvoyPlainKeys: []string{"tenant"}, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	set, err := policy.Parse("edge.yaml", []byte("domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 20, burst: 40}\n"))
	if err != nil {
		t.Fatal(err)
	}
	n.SetPolicies(set)
	r := &rls{n: n}
	for range 10 {
		resp, err := r.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{desc("tenant", "acme")}})
		if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("check: %v, %v", resp, err)
		}
	}
	m, err := set.Match("edge", [][]policy.Entry{{{Key: "tenant", Value: "acme"}}}, n.envoySubj)
	if err != nil {
		t.Fatal(err)
	}
	req, err := n.leaseRequest(m[0].Policy, m[0].BucketSubject, clk.Now())
	if err != nil {
		t.Fatal(err)
	}
	l, err := store.LeaseAt(clk.Now(), bucket.LeaseRequest{Request: req, Holder: "h", Rate: 1, Burst: 5, For: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if !l.Granted || l.Tokens != 40-10-5 {
		t.Fatalf("lease after 10 checks of 40: %+v, want 25 tokens left", l)
	}
}
