package regional

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/quotacoord/quota/internal/logbuf"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

var listenRE = regexp.MustCompile(`(grpc|http) listening on (\S+)`)

// runNode starts Run with c, on loopback listeners unless c names its
// own, logging JSON lines and the listening lines to out, and returns the
// gRPC and HTTP addresses and a stop function that cancels it and returns
// its error.
func runNode(t *testing.T, c DaemonConfig) (grpcAddr, httpAddr string, out *logbuf.Buffer, stop func() error) {
	t.Helper()
	out = &logbuf.Buffer{}
	if c.GRPCAddr == "" {
		c.GRPCAddr = "127.0.0.1:0"
	}
	if c.HTTPAddr == "" {
		c.HTTPAddr = "127.0.0.1:0"
	}
	if c.Logger == nil {
		c.Logger = hclog.New(&hclog.LoggerOptions{Name: "regional", Output: out, JSONFormat: true})
	}
	c.Announce = out
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- Run(ctx, c) }()
	stop = func() error {
		cancel()
		select {
		case err := <-errc:
			return err
		case <-time.After(20 * time.Second):
			t.Fatal("Run did not return after cancel")
			return nil
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for grpcAddr == "" || httpAddr == "" {
		select {
		case err := <-errc:
			t.Fatalf("Run returned early: %v\n%s", err, out.String())
		default:
		}
		if time.Now().After(deadline) {
			stop()
			t.Fatalf("Run never listened:\n%s", out.String())
		}
		for _, m := range listenRE.FindAllStringSubmatch(out.String(), -1) {
			if m[1] == "grpc" {
				grpcAddr = m[2]
			} else {
				httpAddr = m[2]
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	return grpcAddr, httpAddr, out, stop
}

// nodeAdmission runs a node with c (runNode) and returns an Admission
// client of it, the node's log and a function that stops it earlier than
// the end of the test and returns Run's error.
func nodeAdmission(t *testing.T, c DaemonConfig) (quotav1.AdmissionClient, *logbuf.Buffer, func() error) {
	t.Helper()
	g, _, out, stopNode := runNode(t, c)
	var once sync.Once
	var stopErr error
	stop := func() error {
		once.Do(func() { stopErr = stopNode() })
		return stopErr
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
	})
	conn, err := grpc.NewClient(g, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return quotav1.NewAdmissionClient(conn), out, stop
}

// TestMustShow6RunWithoutRedis: the node runs from the example policy
// files with no Redis (the in-process store) and answers checks on both
// APIs, health and HTTP endpoints; cancelling shuts it down cleanly.
func TestMustShow6RunWithoutRedis(t *testing.T) {
	g, hAddr, out, stop := runNode(t, DaemonConfig{Policies: "../../examples/policies", Region: "eu-west", DecisionLogEvery: 1})
	conn, err := grpc.NewClient(g, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := ctxT(t)
	r, err := quotav1.NewAdmissionClient(conn).Check(ctx, &quotav1.CheckRequest{Subject: "acme", Policies: []string{"exports"}})
	if err != nil || !r.Allowed || r.DecidedBy != "exports" || r.Limit != 50 || r.Remaining != 49 {
		t.Fatalf("check: %v, %v", r, err)
	}
	er, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge",
		Descriptors: []*rlcommon.RateLimitDescriptor{desc("tenant", "acme")}})
	if err != nil || er.OverallCode != rlsv3.RateLimitResponse_OK || er.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 600 {
		t.Fatalf("envoy check: %v, %v", er, err)
	}
	hc, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || hc.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v, %v", hc, err)
	}
	for path, want := range map[string]string{"/healthz": "ok", "/readyz": "ready",
		"/metrics": `quota_regional_decisions_total{policy="exports",region="eu-west",result="allowed"} 1`} {
		resp, err := http.Get("http://" + hAddr + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), want) {
			t.Fatalf("%s: %d %q, want %q", path, resp.StatusCode, body, want)
		}
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	logs := out.String()
	if !strings.Contains(logs, `"subject_hash"`) || strings.Contains(logs, "acme") {
		t.Fatalf("decision logs must carry a subject hash only:\n%s", logs)
	}
}

// TestRunRefuses: a DaemonConfig that passes validation (process_test.go)
// but names files or settings Run cannot use stops Run with an error
// naming the flag or field at fault.
func TestRunRefuses(t *testing.T) {
	served := func(c DaemonConfig) DaemonConfig {
		c.GRPCAddr, c.HTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
		return c
	}
	const pols = "../../examples/policies"
	tests := []struct {
		name string
		c    DaemonConfig
		err  string
	}{
		{"missing file", served(DaemonConfig{Policies: "/nonexistent/p.yaml"}), "load policies"},
		{"redis tls missing CA", DaemonConfig{Policies: pols, Redis: "127.0.0.1:1", RedisTLS: RedisTLS{CAFile: "/nonexistent/ca.pem"}}, "Redis TLS"},
		{"grpc tls missing files", served(DaemonConfig{Policies: pols, TLSCert: "/nonexistent/c", TLSKey: "/nonexistent/k"}), "gRPC TLS"},
		{"bad envoy plain key", DaemonConfig{Policies: pols, EnvoyPlainKeys: []string{strings.Repeat("k", 2000)}}, "EnvoyPlainKeys"},
		{"bad unknown-policy", DaemonConfig{Policies: pols, UnknownPolicy: "maybe"}, "UnknownPolicy"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Run(context.Background(), tt.c)
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Fatalf("err = %v, want one containing %q", err, tt.err)
			}
		})
	}
}
