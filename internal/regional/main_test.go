package regional

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/quotacoord/quota/internal/logbuf"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

var listenRE = regexp.MustCompile(`(grpc|http) listening on (\S+)`)

// runMain starts Main and returns the gRPC and HTTP addresses and a stop
// function that cancels it and returns its error.
func runMain(t *testing.T, args []string, env []string) (grpcAddr, httpAddr string, out *logbuf.Buffer, stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out = &logbuf.Buffer{}
	errc := make(chan error, 1)
	go func() { errc <- Main(ctx, args, env, out) }()
	stop = func() error {
		cancel()
		select {
		case err := <-errc:
			return err
		case <-time.After(20 * time.Second):
			t.Fatal("Main did not return after cancel")
			return nil
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for grpcAddr == "" || httpAddr == "" {
		select {
		case err := <-errc:
			t.Fatalf("Main returned early: %v\n%s", err, out.String())
		default:
		}
		if time.Now().After(deadline) {
			stop()
			t.Fatalf("Main never listened:\n%s", out.String())
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

// TestMustShow6RunWithoutRedis: the node runs from the example policy
// files with no Redis (the in-process store) and answers checks on both
// APIs, health and HTTP endpoints; cancelling shuts it down cleanly.
func TestMustShow6RunWithoutRedis(t *testing.T) {
	g, hAddr, out, stop := runMain(t, []string{"-policies", "../../examples/policies", "-grpc-addr", "127.0.0.1:0",
		"-http-addr", "127.0.0.1:0", "-region", "eu-west", "-json-logs"}, []string{"QUOTA_DECISION_LOG_EVERY=1"})
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

func TestMainFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  []string
		err  string
	}{
		{"nothing to serve", nil, nil, "-policies"},
		{"unknown flag", []string{"-nope"}, nil, "flag provided but not defined"},
		{"tls half", []string{"-policies", "x", "-tls-cert", "c"}, nil, "-tls-cert and -tls-key"},
		{"bad env", []string{"-policies", "x"}, []string{"QUOTA_STORE_TIMEOUT=soon"}, "QUOTA_STORE_TIMEOUT"},
		{"missing file", []string{"-policies", "/nonexistent/p.yaml", "-grpc-addr", "127.0.0.1:0", "-http-addr", "127.0.0.1:0"}, nil, "load policies"},
		{"redis tls half", []string{"-policies", "x", "-redis", "127.0.0.1:1", "-redis-tls-cert", "c"}, nil, "-redis-tls-cert and -redis-tls-key"},
		{"redis tls without redis", []string{"-policies", "x", "-redis-tls-ca", "ca.pem"}, nil, "need -redis"},
		{"redis tls missing CA", []string{"-policies", "../../examples/policies", "-redis", "127.0.0.1:1", "-redis-tls-ca", "/nonexistent/ca.pem"}, nil, "Redis TLS"},
		{"grpc tls missing files", []string{"-policies", "../../examples/policies", "-grpc-addr", "127.0.0.1:0", "-http-addr", "127.0.0.1:0",
			"-tls-cert", "/nonexistent/c", "-tls-key", "/nonexistent/k"}, nil, "gRPC TLS"},
		{"bad envoy plain key", []string{"-policies", "../../examples/policies", "-envoy-plain-keys", strings.Repeat("k", 2000)}, nil, "EnvoyPlainKeys"},
		{"negative redis merge", []string{"-policies", "x", "-redis-merge", "-1"}, nil, "-redis-merge -1"},
		{"redis merge too large", []string{"-policies", "x", "-redis-merge", "100000"}, nil, "want 0 to 256"},
		{"bad unknown-policy", []string{"-policies", "../../examples/policies", "-unknown-policy", "maybe"}, nil, "UnknownPolicy"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Main(context.Background(), tt.args, tt.env, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Fatalf("err = %v, want one containing %q", err, tt.err)
			}
		})
	}
}
