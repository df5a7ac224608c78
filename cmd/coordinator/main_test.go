package main

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/quotacoord/quota/internal/daemon"
	"github.com/quotacoord/quota/rebalance"
)

func TestParse(t *testing.T) {
	cfg, err := parse(nil, nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	// Safe defaults: both listeners on loopback, no reflection.
	if cfg.GRPCAddr != "127.0.0.1:8091" || cfg.HTTPAddr != "127.0.0.1:8090" || cfg.GRPCReflection || cfg.EmbeddedEtcdAddrOrDefault() != "127.0.0.1:2379" || len(cfg.EtcdEndpoints) != 0 {
		t.Fatalf("defaults: %+v", cfg)
	}
	if cfg.Rebalance.Interval != 5*time.Second || cfg.Rebalance.Protocol != rebalance.ProtocolTwoStep {
		t.Fatalf("rebalance defaults: %+v", cfg.Rebalance)
	}
	cfg, err = parse([]string{"-etcd", "http://a:2379, http://b:2379", "-protocol", "naive", "-rebalance-interval", "1s",
		"-http-addr", ":8090", "-grpc-reflection"}, nil, io.Discard)
	if err != nil || len(cfg.EtcdEndpoints) != 2 || cfg.Rebalance.Protocol != rebalance.ProtocolNaive || cfg.HTTPAddr != ":8090" || !cfg.GRPCReflection {
		t.Fatalf("flags: %+v %v", cfg, err)
	}
	if cfg.EmbeddedAuth || len(cfg.EmbeddedAuthRegions) != 0 {
		t.Fatalf("embedded etcd authentication on with -etcd: %v %v", cfg.EmbeddedAuth, cfg.EmbeddedAuthRegions)
	}
	// The embedded etcd requires authentication unless told not to.
	if cfg, err = parse(nil, nil, io.Discard); err != nil || !cfg.EmbeddedAuth {
		t.Fatalf("embedded etcd without authentication by default: %v %v", cfg.EmbeddedAuth, err)
	}
	if cfg, err = parse([]string{"-embedded-etcd-no-auth"}, nil, io.Discard); err != nil || cfg.EmbeddedAuth {
		t.Fatalf("-embedded-etcd-no-auth: %v %v", cfg.EmbeddedAuth, err)
	}
	if _, err = parse([]string{"-embedded-etcd-no-auth", "-embedded-etcd-auth", "eu"}, nil, io.Discard); err == nil {
		t.Fatal("-embedded-etcd-no-auth with region users accepted")
	}
	// etcd credentials: the password only from QUOTA_ETCD_PASSWORD or a file.
	cfg, err = parse([]string{"-embedded-etcd-auth", "eu, us", "-etcd-username", "coord", "-etcd-password-file", "/run/pw"},
		[]string{"QUOTA_ETCD_PASSWORD=s3cret"}, io.Discard)
	if err != nil || len(cfg.EmbeddedAuthRegions) != 2 || cfg.EmbeddedAuthRegions[1] != "us" ||
		cfg.EtcdAuth.Username != "coord" || cfg.EtcdAuth.PasswordFile != "/run/pw" || cfg.EtcdAuth.Password != "s3cret" {
		t.Fatalf("etcd auth flags: %+v %+v %v", cfg.EmbeddedAuthRegions, cfg.EtcdAuth, err)
	}
	for _, bad := range [][]string{{"-log-level", "loud"}, {"extra"}, {"-max-step", "x"}, {"-etcd-password", "s3cret"}} {
		if _, err := parse(bad, nil, io.Discard); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

func TestRunRejectsBadProtocol(t *testing.T) {
	err := run(t.Context(), []string{"-etcd", "http://127.0.0.1:1", "-protocol", "yolo", "-data-dir", t.TempDir(),
		"-operator-token-file", t.TempDir() + "/tok", "-grpc-addr", "127.0.0.1:0", "-http-addr", "127.0.0.1:0"}, nil, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "protocol") {
		t.Fatalf("err %v, want a protocol error", err)
	}
}

// TestEnvironment: QUOTA_* variables set defaults, flags win.
func TestEnvironment(t *testing.T) {
	env := []string{"QUOTA_GRPC_ADDR=127.0.0.1:9191", "QUOTA_ETCD=http://a:2379,http://b:2379", "QUOTA_REBALANCE_INTERVAL=2s"}
	cfg, err := parse([]string{"-rebalance-interval", "3s"}, env, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.GRPCAddr != "127.0.0.1:9191" || len(cfg.EtcdEndpoints) != 2 || cfg.Rebalance.Interval != 3*time.Second {
		t.Fatalf("grpc %q etcd %q interval %v", cfg.GRPCAddr, cfg.EtcdEndpoints, cfg.Rebalance.Interval)
	}
	if _, err := parse(nil, []string{"QUOTA_MAX_STEP=lots"}, io.Discard); err == nil || !strings.Contains(err.Error(), "QUOTA_MAX_STEP") {
		t.Fatalf("bad variable: %v", err)
	}
}

// TestUsage runs the command as main does: -h prints the usage and exits
// 0, a bad flag exits 2 with a message naming it.
func TestUsage(t *testing.T) {
	var out bytes.Buffer
	if code := daemon.Exec(t.Context(), "coordinator", run, []string{"-h"}, nil, &out); code != 0 ||
		!strings.Contains(out.String(), "Usage of coordinator") || !strings.Contains(out.String(), "-log-level") {
		t.Fatalf("-h: exit %d, output:\n%s", code, out.String())
	}
	for _, bad := range [][]string{{"-no-such-flag"}, {"-rebalance-interval", "often"}, {"-log-level", "loud"}} {
		out.Reset()
		code := daemon.Exec(t.Context(), "coordinator", run, bad, nil, &out)
		if code != daemon.ExitUsage || !strings.Contains(out.String(), "coordinator: ") || !strings.Contains(out.String(), bad[0]) {
			t.Errorf("%v: exit %d, output:\n%s", bad, code, out.String())
		}
	}
}
