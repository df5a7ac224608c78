package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/quotacoord/quota/internal/etcdlayout"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// TestRunEmbeddedEtcdRequiresAuth is an attack on a default coordinator:
// a client without a password, which reaches the embedded etcd's port,
// can neither rewrite allocations nor read policies (the region users'
// rights are tested in internal/coordinator).
func TestRunEmbeddedEtcdRequiresAuth(t *testing.T) {
	data, httpAddr, etcdAddr := t.TempDir(), freeAddr(t), freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		errc <- run(ctx, []string{"-data-dir", data, "-embedded-etcd-addr", etcdAddr, "-grpc-addr", "127.0.0.1:0",
			"-http-addr", httpAddr, "-election-ttl", "1s", "-log-level", "error"}, nil, io.Discard)
	}()
	defer func() {
		cancel()
		if err := <-errc; err != nil {
			t.Error(err)
		}
	}()
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := http.Get("http://" + httpAddr + "/healthz")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.Contains(string(body), "ok leader") {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("never led: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	dial := func(user, password string) *clientv3.Client {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://" + etcdAddr}, DialTimeout: 5 * time.Second,
			Username: user, Password: password, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cli.Close() })
		return cli
	}
	octx, ocancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer ocancel()
	anon := dial("", "")
	if _, err := anon.Put(octx, etcdlayout.Layout{}.Alloc("exports"), `{"epoch":99,"default":{"eu":1}}`); err == nil {
		t.Fatal("anonymous client rewrote an allocation")
	}
	if _, err := anon.Get(octx, etcdlayout.Layout{}.PoliciesPrefix(), clientv3.WithPrefix()); err == nil {
		t.Fatal("anonymous client read the deployment's keys")
	}
}
