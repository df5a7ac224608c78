package coordinator

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/quotacoord/quota/rebalance"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestEmbeddedEtcdHealthAndMetrics starts a coordinator the way
// `go run ./cmd/coordinator` does on a fresh machine: embedded etcd, token
// file created, health and metrics served.
func TestEmbeddedEtcdHealthAndMetrics(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	c, err := Start(ctx, Config{
		DataDir: dir, EmbeddedEtcdAddr: freeAddr(t), GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		Logger: hclog.NewNullLogger(), Rebalance: rebalance.Config{Interval: time.Hour, SessionTTL: time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel()
		if err := c.Wait(); err != nil {
			t.Error(err)
		}
	}()
	if _, err := os.Stat(filepath.Join(dir, "operator-tokens")); err != nil {
		t.Fatalf("token file not created: %v", err)
	}
	conn, err := grpc.NewClient(c.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hr, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || hr.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", hr, err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for !c.Loop.IsLeader() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	for path, want := range map[string]string{"/healthz": "ok leader", "/metrics": "quota_coordinator_leader 1"} {
		resp, err := http.Get("http://" + c.HTTPAddr + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(body), want) {
			t.Errorf("%s lacks %q:\n%.500s", path, want, body)
		}
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
