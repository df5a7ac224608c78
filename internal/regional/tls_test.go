package regional

import (
	"context"
	"crypto/tls"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/quotacoord/quota/internal/redistest"
	"github.com/quotacoord/quota/internal/testca"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

// clientTLS trusts ca and presents certFile/keyFile when given.
func clientTLS(t testing.TB, ca *testca.CA, certFile, keyFile string) *tls.Config {
	t.Helper()
	tc := &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}
	if certFile != "" {
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			t.Fatal(err)
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	return tc
}

// TestGRPCTLSReload: the node's gRPC listener with mutual TLS admits only
// clients with a certificate from -tls-client-ca, and serves a certificate
// replaced on disk to new connections without a restart.
func TestGRPCTLSReload(t *testing.T) {
	dir := t.TempDir()
	ca, other := testca.New(t, "test-ca"), testca.New(t, "test-ca")
	scert, skey, first := ca.IssueFiles(t, dir, "server")
	ccert, ckey, _ := ca.IssueFiles(t, dir, "client")
	ocert, okey, _ := other.IssueFiles(t, t.TempDir(), "client")
	g, _, _, stop := runNode(t, DaemonConfig{Policies: "../../examples/policies",
		TLSCert: scert, TLSKey: skey, TLSClientCA: ca.WriteFile(t, dir)})
	defer func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
	}()
	check := func(tc *tls.Config) error {
		conn, err := grpc.NewClient(g, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = quotav1.NewAdmissionClient(conn).Check(ctx, &quotav1.CheckRequest{Subject: "acme", Policies: []string{"exports"}})
		return err
	}
	for _, c := range []struct {
		name string
		tc   *tls.Config
		ok   bool
	}{
		{"client certificate from the CA", clientTLS(t, ca, ccert, ckey), true},
		{"no client certificate", clientTLS(t, ca, "", ""), false},
		{"client certificate from another CA", clientTLS(t, ca, ocert, okey), false},
	} {
		if err := check(c.tc); (err == nil) != c.ok {
			t.Errorf("%s: %v, want success=%v", c.name, err, c.ok)
		}
	}
	served := func() int64 {
		t.Helper()
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", g, clientTLS(t, ca, ccert, ckey))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].SerialNumber.Int64()
	}
	if s := served(); s != first {
		t.Fatalf("served serial %d, want %d", s, first)
	}
	_, _, second := ca.IssueFiles(t, dir, "server")
	deadline := time.Now().Add(10 * time.Second)
	for served() != second {
		if time.Now().After(deadline) {
			t.Fatal("the replaced certificate was not served within 10s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := check(clientTLS(t, ca, ccert, ckey)); err != nil {
		t.Errorf("check after the reload: %v", err)
	}
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	return port
}

// TestRedisTLS: the node reaches a real redis-server over mutual TLS with
// -redis-tls-ca, -redis-tls-cert and -redis-tls-key; a client without a
// certificate or trusting another CA cannot, and the policy's failure
// mode decides.
func TestRedisTLS(t *testing.T) {
	dir := t.TempDir()
	ca, other := testca.New(t, "test-ca"), testca.New(t, "test-ca")
	scert, skey, _ := ca.IssueFiles(t, dir, "redis")
	ccert, ckey, _ := ca.IssueFiles(t, dir, "client")
	caFile := ca.WriteFile(t, dir)
	otherCA := other.WriteFile(t, t.TempDir())
	port := freePort(t)
	srv := redistest.Start(t, "--tls-port", port, "--tls-cert-file", scert, "--tls-key-file", skey,
		"--tls-ca-cert-file", caFile, "--tls-auth-clients", "yes")
	tlsAddr := "127.0.0.1:" + port
	pol := writePolicies(t, map[string]string{"p.yaml": "policies:\n  - {name: tls-closed, capacity: 5, rate: 5/hour, failure_mode: closed}\n"})
	subject := redistest.Unique(t)
	mutual := RedisTLS{CAFile: caFile, CertFile: ccert, KeyFile: ckey}
	for _, tt := range []struct {
		name     string
		redis    string
		tls      RedisTLS
		degraded string
	}{
		{"mutual TLS", tlsAddr, mutual, ""},
		{"URL form", "rediss://" + tlsAddr, mutual, ""},
		{"no client certificate", tlsAddr, RedisTLS{CAFile: caFile}, "closed"},
		{"another CA", tlsAddr, RedisTLS{CAFile: otherCA, CertFile: ccert, KeyFile: ckey}, "closed"},
		{"wrong server name", tlsAddr, RedisTLS{CAFile: caFile, CertFile: ccert, KeyFile: ckey, ServerName: "redis.example"}, "closed"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			adm, out, _ := nodeAdmission(t, DaemonConfig{Redis: tt.redis, RedisTLS: tt.tls, Policies: pol, StoreTimeout: 2 * time.Second})
			r, err := adm.Check(ctxT(t), &quotav1.CheckRequest{Subject: subject, Policies: []string{"tls-closed"}})
			if err != nil {
				t.Fatal(err)
			}
			if r.Degraded != tt.degraded || r.Allowed != (tt.degraded == "") {
				t.Errorf("check: allowed=%v degraded=%q, want degraded %q\n%s", r.Allowed, r.Degraded, tt.degraded, out.String())
			}
		})
	}
	// The buckets of the TLS checks are in the server (read over its
	// plaintext port).
	n, err := srv.Client(t).DBSize(ctxT(t)).Result()
	if err != nil || n == 0 {
		t.Errorf("redis holds %d keys (%v) after checks over TLS", n, err)
	}
}

func TestRedisHost(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1:6379":                          "127.0.0.1",
		"redis.internal:6380":                     "redis.internal",
		"rediss://user:p@ss@cache.svc:6380/0":     "cache.svc",
		"rediss://cache.svc:6380?dial_timeout=1s": "cache.svc",
		"10.0.0.1:7000,10.0.0.2:7000":             "10.0.0.1",
		"[::1]:6379":                              "::1",
	} {
		if got := redisHost(in); got != want {
			t.Errorf("redisHost(%q) = %q, want %q", in, got, want)
		}
	}
	if strings.Contains(redisHost("rediss://user:secret@h:1"), "secret") {
		t.Error("redisHost keeps the password")
	}
}
