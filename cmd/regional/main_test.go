package main

import (
	"bytes"
	"context"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/quotacoord/quota/internal/daemon"
	"github.com/quotacoord/quota/internal/logbuf"
	"github.com/quotacoord/quota/internal/regional"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestUsage runs the node as main does: -h prints the usage and exits 0,
// a bad flag or QUOTA_* variable exits 2 with a message naming it.
func TestUsage(t *testing.T) {
	var out bytes.Buffer
	if code := daemon.Exec(t.Context(), "regional", run, []string{"-h"}, nil, &out); code != daemon.ExitOK ||
		!strings.Contains(out.String(), "Usage of regional") || !strings.Contains(out.String(), "-log-level") {
		t.Fatalf("-h: exit %d, output:\n%s", code, out.String())
	}
	for _, c := range []struct {
		args, env []string
		names     string
	}{
		{[]string{"-no-such-flag"}, nil, "-no-such-flag"},
		{[]string{"-store-timeout", "soon"}, nil, "-store-timeout"},
		{[]string{"-policies", "x", "-log-level", "loud"}, nil, "-log-level"},
		{[]string{"-policies", "x"}, []string{"QUOTA_BREAKER_THRESHOLD=many"}, "QUOTA_BREAKER_THRESHOLD"},
	} {
		out.Reset()
		code := daemon.Exec(t.Context(), "regional", run, c.args, c.env, &out)
		if code != daemon.ExitUsage || !strings.Contains(out.String(), "regional: ") || !strings.Contains(out.String(), c.names) {
			t.Errorf("%v %v: exit %d, output:\n%s", c.args, c.env, code, out.String())
		}
	}
}

// TestServeAndStop starts a standalone node as main does, with its
// listening addresses from QUOTA_* variables, reads the listening lines
// and logs on the one stream, and stops it by cancelling (SIGTERM): exit 0.
func TestServeAndStop(t *testing.T) {
	var out logbuf.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- daemon.Exec(ctx, "regional", run, []string{"-policies", "../../examples/policies", "-region", "eu-west"},
			[]string{"QUOTA_GRPC_ADDR=127.0.0.1:0", "QUOTA_HTTP_ADDR=127.0.0.1:0", "QUOTA_JSON_LOGS=true"}, &out)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), "http listening on 127.0.0.1:") {
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("never listened:\n%s", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	select {
	case code := <-done:
		if code != daemon.ExitOK {
			t.Fatalf("exit %d:\n%s", code, out.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("node did not stop after cancel")
	}
	if logs := out.String(); !strings.Contains(logs, `"@message":"policies loaded"`) || !strings.Contains(logs, `"@message":"stopped"`) {
		t.Fatalf("JSON logs missing from the stream:\n%s", logs)
	}
}

// TestParse: the defaults are safe (HTTP on loopback, no reflection,
// traces over TLS); flags and QUOTA_* variables reach the DaemonConfig (a
// flag wins over its variable), lists are split, and the logger and the
// listening lines go to stderr.
func TestParse(t *testing.T) {
	var out bytes.Buffer
	d, err := parse(nil, nil, &out)
	if err != nil || d.HTTPAddr != "127.0.0.1:8080" || d.GRPCAddr != ":8081" || d.GRPCReflection || d.OTLPInsecure {
		t.Fatalf("defaults: %+v, %v", d, err)
	}
	d, err = parse([]string{"-http-addr", ":8080", "-grpc-reflection", "-otlp-endpoint", "otel:4317", "-otlp-insecure"}, nil, &out)
	if err != nil || d.HTTPAddr != ":8080" || !d.GRPCReflection || !d.OTLPInsecure || d.OTLPEndpoint != "otel:4317" {
		t.Fatalf("opened: %+v, %v", d, err)
	}
	c, err := parse([]string{"-etcd", "http://a:2379, http://b:2379", "-node-id", "eu-1.pod_7", "-redis-merge", "8",
		"-envoy-plain-keys", "tenant,path", "-unknown-policy", "deny", "-store-timeout", "20ms"},
		[]string{"QUOTA_REGION=eu-west", "QUOTA_NODE_ID=from-env", "QUOTA_RLS_HEADERS=draft", "QUOTA_REPORT_INTERVAL=2s"}, &out)
	if err != nil {
		t.Fatal(err)
	}
	if c.Region != "eu-west" || c.NodeID != "eu-1.pod_7" || c.RedisMerge != 8 || c.UnknownPolicy != regional.UnknownDeny ||
		c.Headers != regional.HeadersDraft || c.StoreTimeout != 20*time.Millisecond || c.ReportInterval != 2*time.Second ||
		!slices.Equal(c.EtcdEndpoints, []string{"http://a:2379", "http://b:2379"}) || !slices.Equal(c.EnvoyPlainKeys, []string{"tenant", "path"}) {
		t.Fatalf("parsed %+v", c)
	}
	if c.Announce != &out || c.Logger == nil {
		t.Fatalf("logger %v and announce %v, want both on stderr", c.Logger, c.Announce)
	}
	if c, err := parse(nil, []string{"QUOTA_NODE_ID=from-env"}, &out); err != nil || c.NodeID != "from-env" {
		t.Fatalf("QUOTA_NODE_ID: %q, %v", c.NodeID, err)
	}
	// Redis credentials: the user and the password file from flags or
	// variables, the password itself only from QUOTA_REDIS_PASSWORD.
	c, err = parse([]string{"-redis", "10.0.0.1:6379", "-redis-username", "limiter"},
		[]string{"QUOTA_REDIS_PASSWORD=s3cret", "QUOTA_REDIS_PASSWORD_FILE=/run/secrets/redis"}, &out)
	if err != nil || c.RedisUsername != "limiter" || c.RedisPassword != "s3cret" || c.RedisPasswordFile != "/run/secrets/redis" {
		t.Fatalf("redis credentials: %q %q %q, %v", c.RedisUsername, c.RedisPassword, c.RedisPasswordFile, err)
	}
	if _, err := parse([]string{"-redis-password", "s3cret"}, nil, io.Discard); err == nil {
		t.Fatal("-redis-password accepted: a password on the command line")
	}
}
