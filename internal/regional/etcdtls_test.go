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
)

// TestMainEtcdTLS: a node given -etcd-tls-* (the CA through QUOTA_ env)
// reaches an etcd that requires client certificates: it loads its
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
	_, hAddr, out, stop := runMain(t, []string{"-etcd", strings.Join(srv.Endpoints, ","), "-region", "eu-west", "-node-id", "n-tls",
		"-etcd-tls-cert", cert, "-etcd-tls-key", key, "-grpc-addr", "127.0.0.1:0", "-http-addr", "127.0.0.1:0"},
		[]string{"QUOTA_ETCD_TLS_CA=" + ca.File})
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

// TestMainEtcdTLSFlags: etcd TLS settings that cannot work stop Main with
// an error naming the problem.
func TestMainEtcdTLSFlags(t *testing.T) {
	ca := testca.New(t, "etcd-ca")
	base := []string{"-grpc-addr", "127.0.0.1:0", "-http-addr", "127.0.0.1:0"}
	tests := []struct {
		name string
		args []string
		env  []string
		err  string
	}{
		{"certificate without key", []string{"-etcd", "https://127.0.0.1:1", "-etcd-tls-cert", "c"}, nil, "-etcd-tls-cert and -etcd-tls-key"},
		{"TLS without etcd", []string{"-policies", "x", "-etcd-tls-ca", ca.File}, nil, "need -etcd"},
		{"plaintext endpoint", []string{"-etcd", "http://127.0.0.1:1"}, []string{"QUOTA_ETCD_TLS_CA=" + ca.File}, "https"},
		{"missing CA file", []string{"-etcd", "https://127.0.0.1:1", "-etcd-tls-ca", "/nonexistent/ca.pem"}, nil, "/nonexistent/ca.pem"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Main(context.Background(), append(tt.args, base...), tt.env, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Fatalf("err = %v, want one containing %q", err, tt.err)
			}
		})
	}
}
