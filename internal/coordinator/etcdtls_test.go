package coordinator

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/quotacoord/quota/internal/etcdauth"
	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/etcdtest"
	"github.com/quotacoord/quota/internal/regionsync"
	"github.com/quotacoord/quota/internal/testca"
	"github.com/quotacoord/quota/internal/tlsconfig"
	"github.com/quotacoord/quota/rebalance"
)

// startCoordinator starts cfg (test defaults filled in) and stops it at
// cleanup; the returned function stops it earlier and returns Wait's error.
func startCoordinator(t *testing.T, cfg Config) (*Coordinator, func() error) {
	t.Helper()
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	cfg.GRPCAddr, cfg.HTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	cfg.Rebalance = rebalance.Config{Interval: time.Hour, SessionTTL: time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	c, err := Start(ctx, cfg)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		return c.Wait()
	}
	t.Cleanup(func() { _ = stop() })
	return c, stop
}

// waitLeader waits until c leads and /healthz, which reads etcd, says so.
func waitLeader(t *testing.T, c *Coordinator) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !c.Loop.IsLeader() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	resp, err := http.Get("http://" + c.HTTPAddr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "ok leader") {
		t.Fatalf("/healthz: %s", body)
	}
}

// TestEmbeddedEtcdMutualTLS: the embedded etcd serves https and requires
// client certificates from the client CA; the coordinator (trusting the
// embedded certificate itself) and a region node with certificates from
// that CA both use it, while clients without a certificate, with one from
// another CA, or in plaintext are refused. etcd's own log goes to
// DATA_DIR/etcd.log.
func TestEmbeddedEtcdMutualTLS(t *testing.T) {
	ca, other := testca.New(t, "quota-ca"), testca.New(t, "other-ca")
	dir := t.TempDir()
	srvCert, srvKey, _ := ca.IssueFiles(t, dir, "etcd")
	coCert, coKey, _ := ca.IssueFiles(t, dir, "coordinator")
	nodeCert, nodeKey, _ := ca.IssueFiles(t, dir, "node")
	otherCert, otherKey, _ := other.IssueFiles(t, dir, "intruder")
	data := t.TempDir()
	c, stop := startCoordinator(t, Config{DataDir: data, EmbeddedEtcdAddr: freeAddr(t),
		EmbeddedTLSCert: srvCert, EmbeddedTLSKey: srvKey, EmbeddedClientCA: ca.File,
		EtcdTLS: tlsconfig.Etcd{CertFile: coCert, KeyFile: coKey}})
	if !strings.HasPrefix(c.EtcdEndpoints[0], "https://127.0.0.1:") {
		t.Fatalf("endpoints %v, want https", c.EtcdEndpoints)
	}
	waitLeader(t, c)

	// A region node registers through the same etcd.
	nodeCli, err := regionsync.DialTLS(c.EtcdEndpoints, tlsconfig.Etcd{CAFile: ca.File, CertFile: nodeCert, KeyFile: nodeKey})
	if err != nil {
		t.Fatal(err)
	}
	defer nodeCli.Close()
	s, err := regionsync.New(regionsync.Config{Region: "eu", Node: "n1", Client: nodeCli, LeaseTTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	sctx, scancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(sctx) }()
	var lay etcdlayout.Layout
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		r, err := nodeCli.Get(ctx, lay.Node("eu", "n1"))
		cancel()
		if err == nil && len(r.Kvs) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node never registered: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	scancel()
	if err := <-done; err != nil {
		t.Errorf("region sync: %v", err)
	}

	hostPort := strings.TrimPrefix(c.EtcdEndpoints[0], "https://")
	for _, tt := range []struct {
		name      string
		endpoints []string
		tls       tlsconfig.Etcd
	}{
		{"no client certificate", c.EtcdEndpoints, tlsconfig.Etcd{CAFile: ca.File}},
		{"client certificate from another CA", c.EtcdEndpoints, tlsconfig.Etcd{CAFile: ca.File, CertFile: otherCert, KeyFile: otherKey}},
		{"plaintext", []string{"http://" + hostPort}, tlsconfig.Etcd{}},
	} {
		cli, err := regionsync.DialTLS(tt.endpoints, tt.tls)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err = cli.Get(ctx, lay.Node("eu", "n1"))
		cancel()
		_ = cli.Close()
		if err == nil {
			t.Errorf("%s: read accepted", tt.name)
		}
	}

	if err := stop(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(data, "etcd.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"level":"error"`) {
		t.Errorf("etcd.log holds none of the errors etcd logs when it stops:\n%s", b)
	}
}

// TestExternalEtcdTLS: with endpoints and EtcdTLS the coordinator reaches
// an etcd that requires client certificates.
func TestExternalEtcdTLS(t *testing.T) {
	ca := testca.New(t, "etcd-ca")
	srv := etcdtest.StartTLS(t, ca)
	cert, key, _ := ca.IssueFiles(t, t.TempDir(), "coordinator")
	c, _ := startCoordinator(t, Config{EtcdEndpoints: srv.Endpoints, TokenFile: filepath.Join(t.TempDir(), "tokens"),
		EtcdTLS: tlsconfig.Etcd{CAFile: ca.File, CertFile: cert, KeyFile: key}})
	waitLeader(t, c)
}

// TestEtcdClientSettings: the endpoints and TLS of the coordinator's etcd
// client, and the flag combinations that cannot work.
func TestEtcdClientSettings(t *testing.T) {
	ext := []string{"https://etcd:2379"}
	tests := []struct {
		name     string
		cfg      Config
		endpoint string
		caFile   string
		err      string
	}{
		{"embedded, plaintext", Config{}, "http://127.0.0.1:2379", "", ""},
		{"embedded TLS trusts its own certificate", Config{EmbeddedTLSCert: "s.crt", EmbeddedTLSKey: "s.key"}, "https://127.0.0.1:2379", "s.crt", ""},
		{"embedded TLS, CA given", Config{EmbeddedTLSCert: "s.crt", EmbeddedTLSKey: "s.key", EtcdTLS: tlsconfig.Etcd{CAFile: "ca.pem"}}, "https://127.0.0.1:2379", "ca.pem", ""},
		{"embedded mTLS with a client certificate", Config{EmbeddedTLSCert: "s.crt", EmbeddedTLSKey: "s.key", EmbeddedClientCA: "ca.pem",
			EtcdTLS: tlsconfig.Etcd{CertFile: "c.crt", KeyFile: "c.key"}}, "https://127.0.0.1:2379", "s.crt", ""},
		{"external with TLS", Config{EtcdEndpoints: ext, EtcdTLS: tlsconfig.Etcd{CAFile: "ca.pem"}}, ext[0], "ca.pem", ""},
		{"embedded mTLS without a client certificate", Config{EmbeddedTLSCert: "s.crt", EmbeddedTLSKey: "s.key", EmbeddedClientCA: "ca.pem"}, "", "", "-etcd-tls-cert"},
		{"embedded key without certificate", Config{EmbeddedTLSKey: "s.key"}, "", "", "-embedded-etcd-tls-cert"},
		{"client CA without certificate", Config{EmbeddedClientCA: "ca.pem"}, "", "", "-embedded-etcd-tls-key"},
		{"client TLS to a plaintext embedded etcd", Config{EtcdTLS: tlsconfig.Etcd{CAFile: "ca.pem"}}, "", "", "serves plain http"},
		{"embedded TLS with external endpoints", Config{EtcdEndpoints: ext, EmbeddedTLSCert: "s.crt", EmbeddedTLSKey: "s.key"}, "", "", "no embedded etcd"},
		{"embedded auth", Config{EmbeddedAuthRegions: []string{"eu"}}, "http://127.0.0.1:2379", "", ""},
		{"embedded auth with external endpoints", Config{EtcdEndpoints: ext, EmbeddedAuthRegions: []string{"eu"}}, "", "", "-embedded-etcd-auth is for the embedded etcd"},
		{"embedded auth with an etcd user", Config{EmbeddedAuthRegions: []string{"eu"}, EtcdAuth: etcdauth.Credentials{Username: "u"}}, "", "", "-etcd-username"},
		{"embedded auth, bad region", Config{EmbeddedAuthRegions: []string{"eu/x"}}, "", "", "region \"eu/x\""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			eps, tc, err := etcdClientSettings(tt.cfg)
			if tt.err != "" {
				if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("%v, want ErrConfig containing %q", err, tt.err)
				}
				return
			}
			if err != nil || eps[0] != tt.endpoint || tc.CAFile != tt.caFile {
				t.Fatalf("got %v %+v %v, want %s with CA %q", eps, tc, err, tt.endpoint, tt.caFile)
			}
		})
	}
	// Start refuses such a configuration before it starts anything.
	_, err := Start(context.Background(), Config{EmbeddedClientCA: "ca.pem", DataDir: t.TempDir(),
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Logger: hclog.NewNullLogger()})
	if !errors.Is(err, ErrConfig) {
		t.Fatalf("Start: %v, want ErrConfig", err)
	}
}

// TestEtcdLogBounded: the embedded etcd's log rotates into one
// predecessor once a write would pass its bound, so it never takes more
// than twice the bound.
func TestEtcdLogBounded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "etcd.log")
	w, err := openEtcdLog(path, 100)
	if err != nil {
		t.Fatal(err)
	}
	line := []byte(strings.Repeat("x", 39) + "\n") // 40 bytes
	steps := []struct{ cur, prev int64 }{{40, 0}, {80, 0}, {40, 80}, {80, 80}, {40, 80}}
	for i, st := range steps {
		if _, err := w.Write(line); err != nil {
			t.Fatal(err)
		}
		size := func(p string) int64 {
			fi, err := os.Stat(p)
			if err != nil {
				return 0
			}
			return fi.Size()
		}
		if cur, prev := size(path), size(path+".1"); cur != st.cur || prev != st.prev {
			t.Errorf("write %d: sizes %d and %d, want %d and %d", i+1, cur, prev, st.cur, st.prev)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(line); !errors.Is(err, os.ErrClosed) {
		t.Errorf("write after Close: %v", err)
	}
	// Reopening appends and counts what is there.
	w, err = openEtcdLog(path, 100)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.Write(line); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(path); fi.Size() != 80 {
		t.Errorf("after reopening: %d bytes, want 80", fi.Size())
	}
}
