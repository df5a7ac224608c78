package regional

import (
	"context"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/etcdtest"
	"github.com/quotacoord/quota/internal/testca"
	"github.com/quotacoord/quota/internal/tlsconfig"
)

// TestMainEtcdTLS: a node given etcd TLS (-etcd-tls-*) reaches an etcd that requires client certificates: it loads its
// policies, becomes ready and registers under its node id.
func TestMainEtcdTLS(t *testing.T) {
	ca := testca.New(t, "etcd-ca")
	srv := etcdtest.StartTLS(t, ca)
	cli := srv.Client(t)
	ctx := ctxT(t)
	doc, err := os.ReadFile("../../examples/policies/policies.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var l etcdlayout.Layout
	if _, err := cli.Put(ctx, l.PolicyDoc("own"), string(doc)); err != nil {
		t.Fatal(err)
	}
	cert, key, _ := ca.IssueFiles(t, t.TempDir(), "eu-node")
	_, hAddr, out, stop := runNode(t, DaemonConfig{EtcdEndpoints: srv.Endpoints, Region: "eu-west", NodeID: "n-tls",
		EtcdTLS: tlsconfig.Etcd{CAFile: ca.File, CertFile: cert, KeyFile: key}})
	stopped := false
	defer func() {
		if !stopped {
			_ = stop()
		}
	}()
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := http.Get("http://" + hAddr + "/readyz")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("never ready:\n%s", out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	r, err := cli.Get(ctx, l.Node("eu-west", "n-tls"))
	if err != nil || len(r.Kvs) != 1 {
		t.Fatalf("node registration: %v %v", r, err)
	}
	stopped = true
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// TestMainEtcdTLSFlags: etcd TLS settings that cannot work stop Run with
// an error naming the problem.
func TestMainEtcdTLSFlags(t *testing.T) {
	ca := testca.New(t, "etcd-ca")
	tests := []struct {
		name string
		c    DaemonConfig
		err  string
	}{
		{"certificate without key", DaemonConfig{EtcdEndpoints: []string{"https://127.0.0.1:1"}, EtcdTLS: tlsconfig.Etcd{CertFile: "c"}}, "-etcd-tls-cert and -etcd-tls-key"},
		{"TLS without etcd", DaemonConfig{Policies: "x", EtcdTLS: tlsconfig.Etcd{CAFile: ca.File}}, "need -etcd"},
		{"plaintext endpoint", DaemonConfig{EtcdEndpoints: []string{"http://127.0.0.1:1"}, EtcdTLS: tlsconfig.Etcd{CAFile: ca.File}}, "https"},
		{"missing CA file", DaemonConfig{EtcdEndpoints: []string{"https://127.0.0.1:1"}, EtcdTLS: tlsconfig.Etcd{CAFile: "/nonexistent/ca.pem"}}, "/nonexistent/ca.pem"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.c.GRPCAddr, tt.c.HTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
			err := Run(context.Background(), tt.c)
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Fatalf("err = %v, want one containing %q", err, tt.err)
			}
		})
	}
}
