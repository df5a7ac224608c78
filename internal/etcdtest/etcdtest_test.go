package etcdtest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/quotacoord/quota/internal/testca"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

func TestStartPutGetRestart(t *testing.T) {
	s := Start(t)
	c := s.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	r, err := c.Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "v" {
		t.Fatalf("after restart got %v", r.Kvs)
	}
}

// TestStartTLS: a TLS member serves its https endpoint to a client with a
// certificate from its CA, refuses clients without one or with one from
// another CA, keeps TLS across Restart, and logs to its file.
func TestStartTLS(t *testing.T) {
	ca, other := testca.New(t, "etcd-ca"), testca.New(t, "other-ca")
	s := StartTLS(t, ca)
	if !strings.HasPrefix(s.Endpoints[0], "https://127.0.0.1:") {
		t.Fatalf("endpoints %v, want https on loopback", s.Endpoints)
	}
	c := s.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	pair := other.IssuePair(t, "intruder")
	pool := ca.Pool()
	for name, tc := range map[string]*tls.Config{
		"no client certificate":           {RootCAs: pool, MinVersion: tls.VersionTLS12},
		"certificate from another CA":     {RootCAs: pool, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12},
		"server not trusted (another CA)": {RootCAs: x509.NewCertPool(), MinVersion: tls.VersionTLS12},
	} {
		cli, err := clientv3.New(clientv3.Config{Endpoints: s.Endpoints, TLS: tc, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		rctx, rcancel := context.WithTimeout(context.Background(), time.Second)
		_, err = cli.Get(rctx, "k")
		rcancel()
		_ = cli.Close()
		if err == nil {
			t.Errorf("%s: read accepted", name)
		}
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if r, err := c.Get(ctx, "k"); err != nil || len(r.Kvs) != 1 {
		t.Fatalf("after restart: %v %v", r, err)
	}
	s.Stop()
	b, err := os.ReadFile(s.LogFile())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"level":"error"`) {
		t.Errorf("log file holds no error line of the stops:\n%s", b)
	}
}
