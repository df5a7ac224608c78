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

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

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
