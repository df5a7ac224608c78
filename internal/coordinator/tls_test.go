package coordinator

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/quotacoord/quota/internal/etcdtest"
	"github.com/quotacoord/quota/internal/testca"
	"github.com/quotacoord/quota/rebalance"
)

// TestOperatorTransport: bearer tokens never travel in plaintext off
// loopback unless the operator says so.
func TestOperatorTransport(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"loopback IPv4 without TLS", Config{GRPCAddr: "127.0.0.1:8091"}, true},
		{"loopback IPv6 without TLS", Config{GRPCAddr: "[::1]:8091"}, true},
		{"localhost without TLS", Config{GRPCAddr: "localhost:8091"}, true},
		{"every interface without TLS", Config{GRPCAddr: ":8091"}, false},
		{"unspecified IPv4 without TLS", Config{GRPCAddr: "0.0.0.0:8091"}, false},
		{"a host name without TLS", Config{GRPCAddr: "coordinator.internal:8091"}, false},
		{"a public IP without TLS", Config{GRPCAddr: "192.0.2.10:8091"}, false},
		{"not an address", Config{GRPCAddr: "8091"}, false},
		{"every interface with TLS", Config{GRPCAddr: ":8091", TLSCert: "c", TLSKey: "k"}, true},
		{"every interface, plaintext allowed", Config{GRPCAddr: ":8091", InsecureOperatorPlaintext: true}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkOperatorTransport(tt.cfg)
			if (err == nil) != tt.ok {
				t.Fatalf("checkOperatorTransport: %v, want ok=%v", err, tt.ok)
			}
			if err != nil && (!errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "-insecure-operator-plaintext")) {
				t.Errorf("error %v should wrap ErrConfig and name the way out", err)
			}
		})
	}
	// Start refuses before it starts anything (no etcd is needed to see it).
	_, err := Start(context.Background(), Config{GRPCAddr: "0.0.0.0:0", HTTPAddr: "127.0.0.1:0", DataDir: t.TempDir(),
		Logger: hclog.NewNullLogger()})
	if !errors.Is(err, ErrConfig) {
		t.Fatalf("Start with plaintext tokens on every interface: %v, want ErrConfig", err)
	}
}

// TestOperatorCertificateReload: a certificate replaced on disk is served
// by the operator listener to the next connection without a restart.
func TestOperatorCertificateReload(t *testing.T) {
	ca := testca.New(t, "ops-ca")
	pool := ca.Pool()
	dir := t.TempDir()
	cf, kf, first := ca.IssueFiles(t, dir, "coordinator")
	srv := etcdtest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	c, err := Start(ctx, Config{EtcdEndpoints: srv.Endpoints, GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		TokenFile: filepath.Join(dir, "tokens"), TLSCert: cf, TLSKey: kf, Logger: hclog.NewNullLogger(),
		Rebalance: rebalance.Config{Interval: time.Hour, SessionTTL: time.Second}})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	defer func() {
		cancel()
		if err := c.Wait(); err != nil {
			t.Error(err)
		}
	}()
	served := func() int64 {
		t.Helper()
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", c.GRPCAddr,
			&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if p := conn.ConnectionState().NegotiatedProtocol; p != "h2" {
			t.Errorf("negotiated protocol %q, want h2 (gRPC)", p)
		}
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.Int64()
	}
	if s := served(); s != first {
		t.Fatalf("served serial %d, want %d", s, first)
	}
	_, _, second := ca.IssueFiles(t, dir, "coordinator")
	deadline := time.Now().Add(10 * time.Second)
	for served() != second {
		if time.Now().After(deadline) {
			t.Fatal("the replaced certificate was not served within 10s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
