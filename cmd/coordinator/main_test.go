package main

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/quotacoord/quota/rebalance"
)

func TestParse(t *testing.T) {
	cfg, err := parse(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.GRPCAddr != "127.0.0.1:8091" || cfg.HTTPAddr != ":8090" || cfg.EmbeddedEtcdAddrOrDefault() != "127.0.0.1:2379" || len(cfg.EtcdEndpoints) != 0 {
		t.Fatalf("defaults: %+v", cfg)
	}
	if cfg.Rebalance.Interval != 5*time.Second || cfg.Rebalance.Protocol != rebalance.ProtocolTwoStep {
		t.Fatalf("rebalance defaults: %+v", cfg.Rebalance)
	}
	cfg, err = parse([]string{"-etcd", "http://a:2379, http://b:2379", "-protocol", "naive", "-rebalance-interval", "1s"}, io.Discard)
	if err != nil || len(cfg.EtcdEndpoints) != 2 || cfg.Rebalance.Protocol != rebalance.ProtocolNaive {
		t.Fatalf("flags: %+v %v", cfg, err)
	}
	for _, bad := range [][]string{{"-log-level", "loud"}, {"extra"}, {"-max-step", "x"}} {
		if _, err := parse(bad, io.Discard); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

func TestRunRejectsBadProtocol(t *testing.T) {
	err := run(t.Context(), []string{"-etcd", "http://127.0.0.1:1", "-protocol", "yolo", "-data-dir", t.TempDir(),
		"-operator-token-file", t.TempDir() + "/tok", "-grpc-addr", "127.0.0.1:0", "-http-addr", "127.0.0.1:0"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "protocol") {
		t.Fatalf("err %v, want a protocol error", err)
	}
}
