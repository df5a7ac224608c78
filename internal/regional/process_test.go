package regional

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/quotacoord/quota/internal/daemon"
	"github.com/quotacoord/quota/internal/etcdauth"
	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/tlsconfig"
)

func TestDaemonConfigDefaults(t *testing.T) {
	c, err := DaemonConfig{Policies: "p.yaml"}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if c.Region != "local" || c.GRPCAddr != ":8081" || c.HTTPAddr != "127.0.0.1:8080" || c.GRPCReflection || c.OTLPInsecure || c.LocalMaxBuckets != 100000 ||
		c.StoreTimeout != 5*time.Millisecond || c.ReportInterval != 5*time.Second || c.ReloadSettle != 200*time.Millisecond ||
		c.ShutdownTimeout != daemon.DefaultShutdownTimeout || c.Logger == nil || !etcdlayout.ValidName(c.NodeID) {
		t.Fatalf("defaults: %+v", c)
	}
	if c, err := (DaemonConfig{EtcdEndpoints: []string{"127.0.0.1:1"}, NodeID: "eu-1.pod_7"}).withDefaults(); err != nil || c.NodeID != "eu-1.pod_7" {
		t.Fatalf("node id %q, %v", c.NodeID, err)
	}
	etcd := []string{"http://127.0.0.1:2379"}
	for _, tt := range []struct {
		name string
		c    DaemonConfig
		err  string
	}{
		{"nothing to serve", DaemonConfig{}, "-policies FILE (standalone) or -etcd"},
		{"tls half", DaemonConfig{Policies: "p", TLSKey: "k"}, "-tls-cert and -tls-key"},
		{"client CA without a certificate", DaemonConfig{Policies: "p", TLSClientCA: "ca"}, "-tls-client-ca needs"},
		{"redis tls half", DaemonConfig{Policies: "p", Redis: "r:1", RedisTLS: RedisTLS{KeyFile: "k"}}, "-redis-tls-cert and -redis-tls-key"},
		{"redis tls without redis", DaemonConfig{Policies: "p", RedisTLS: RedisTLS{ServerName: "r"}}, "need -redis"},
		{"redis merge", DaemonConfig{Policies: "p", RedisMerge: 257}, "want 0 to 256"},
		{"plaintext OTLP without OTLP", DaemonConfig{Policies: "p", OTLPInsecure: true}, "-otlp-insecure needs -otlp-endpoint"},
		{"negative drain", DaemonConfig{Policies: "p", Drain: -time.Second}, "-drain -1s is negative"},
		{"password twice", DaemonConfig{Policies: "p", Redis: "r:1", RedisPassword: "x", RedisPasswordFile: "f"}, "both give the Redis password"},
		{"credentials without redis", DaemonConfig{Policies: "p", RedisUsername: "u"}, "need -redis"},
		{"password without redis", DaemonConfig{Policies: "p", RedisPasswordFile: "f"}, "need -redis"},
		{"sentinel master without sentinels", DaemonConfig{Policies: "p", RedisSentinelMaster: "m"}, "needs -redis-sentinel"},
		{"sentinel credentials without master", DaemonConfig{Policies: "p", Redis: "r:1", RedisSentinelUsername: "u"}, "need -redis-sentinel"},
		{"sentinel password twice", DaemonConfig{Policies: "p", Redis: "r:1", RedisSentinelMaster: "m", RedisSentinelPassword: "x", RedisSentinelPasswordFile: "f"}, "both give the Sentinel password"},
		{"etcd tls half", DaemonConfig{EtcdEndpoints: etcd, EtcdTLS: tlsconfig.Etcd{CertFile: "c"}}, "-etcd-tls-cert and -etcd-tls-key"},
		{"etcd tls without etcd", DaemonConfig{Policies: "p", EtcdTLS: tlsconfig.Etcd{CAFile: "ca"}}, "need -etcd"},
		{"etcd user without etcd", DaemonConfig{Policies: "p", EtcdAuth: etcdauth.Credentials{Username: "u"}}, "need -etcd"},
		{"node id", DaemonConfig{EtcdEndpoints: etcd, NodeID: "a b"}, "-node-id"},
		{"node id with a slash", DaemonConfig{EtcdEndpoints: etcd, NodeID: "a/b"}, "-node-id"},
		{"node id too long", DaemonConfig{EtcdEndpoints: etcd, NodeID: strings.Repeat("n", etcdlayout.MaxNameLen+1)}, "-node-id"},
		{"local buckets", DaemonConfig{Policies: "p", LocalMaxBuckets: -1}, "-local-max-buckets"},
		{"negative store timeout", DaemonConfig{Policies: "p", StoreTimeout: -time.Millisecond}, "-store-timeout -1ms is negative"},
		{"negative shutdown timeout", DaemonConfig{Policies: "p", ShutdownTimeout: -time.Second}, "-shutdown-timeout"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.c.withDefaults()
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tt.err) {
				t.Fatalf("err %v, want ErrConfig containing %q", err, tt.err)
			}
		})
	}
}
