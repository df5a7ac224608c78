package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/quotacoord/quota/internal/etcdauth"
	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/logbuf"
	"github.com/quotacoord/quota/internal/regional"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
	"github.com/quotacoord/quota/rebalance"
)

// TestEmbeddedEtcdAuth: a coordinator asked for -embedded-etcd-auth eu
// turns authentication on in its embedded etcd and writes the eu nodes'
// password file; a regional node of eu with that user and file joins, a
// round publishes the policy's allocation and the node acknowledges it.
// A node with a wrong password, with none, or of a region without a
// user cannot start, with an error saying etcd refused the credentials;
// anonymous clients can no longer write. A restart of the coordinator
// (authentication already on) acts as root from the stored password.
func TestEmbeddedEtcdAuth(t *testing.T) {
	dataDir := t.TempDir()
	tokens := filepath.Join(t.TempDir(), "tokens")
	const writeTok = "write-token-0123456789abcdef"
	if err := os.WriteFile(tokens, []byte("write:"+writeTok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs logbuf.Buffer
	cfg := Config{DataDir: dataDir, EmbeddedEtcdAddr: freeAddr(t), EmbeddedAuthRegions: []string{"eu"}, TokenFile: tokens,
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		Rebalance: rebalance.Config{Interval: 200 * time.Millisecond, SessionTTL: time.Second},
		Logger:    hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Info})}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	start := func() (*Coordinator, func()) {
		cctx, stop := context.WithCancel(ctx)
		c, err := Start(cctx, cfg)
		if err != nil {
			stop()
			t.Fatalf("Start: %v\n%s", err, logs.String())
		}
		return c, func() {
			stop()
			if err := c.Wait(); err != nil {
				t.Errorf("coordinator: %v", err)
			}
		}
	}
	c, stop := start()
	defer func() { stop() }()
	endpoint := "http://" + cfg.EmbeddedEtcdAddr
	regionFile := cfg.RegionPasswordFile("eu")
	if fi, err := os.Stat(regionFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("region password file: %v, %v; want mode 0600", fi, err)
	}

	// Anonymous clients are refused.
	anon, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer anon.Close()
	if _, err := anon.Put(ctx, etcdlayout.Layout{}.Alloc("p"), "{}"); err == nil {
		t.Fatal("an anonymous client wrote an allocation: authentication is off")
	}

	conn, err := grpc.NewClient(c.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	octx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+writeTok)
	if _, err := quotav1.NewOperatorClient(conn).ApplyPolicy(octx, &quotav1.ApplyPolicyRequest{Filename: "p.yaml",
		Document: []byte("policies:\n  - {name: authed, capacity: 100, rate: 100/second, failure_mode: closed}\n")}); err != nil {
		t.Fatalf("ApplyPolicy: %v", err)
	}

	node := func(region string, auth etcdauth.Credentials) (func() error, <-chan error) {
		nctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			done <- regional.Run(nctx, regional.DaemonConfig{Region: region, NodeID: "n1", EtcdEndpoints: []string{endpoint}, EtcdAuth: auth,
				GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", ReportInterval: 200 * time.Millisecond})
		}()
		return func() error { stop(); return <-done }, done
	}
	wrongFile := filepath.Join(t.TempDir(), "wrong")
	if err := os.WriteFile(wrongFile, []byte("not-the-password\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []struct {
		name, region string
		auth         etcdauth.Credentials
	}{
		{"wrong password", "eu", etcdauth.Credentials{Username: etcdauth.RegionUser("eu"), PasswordFile: wrongFile}},
		{"no credentials", "eu", etcdauth.Credentials{}},
		{"region without a user", "us", etcdauth.Credentials{Username: etcdauth.RegionUser("us"), PasswordFile: regionFile}},
	} {
		_, done := node(bad.region, bad.auth)
		select {
		case err := <-done:
			if !errors.Is(err, etcdauth.ErrRefused) || !strings.Contains(err.Error(), "etcd refused the credentials") {
				t.Errorf("%s: Run = %v, want an error saying etcd refused the credentials", bad.name, err)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: the node started", bad.name)
		}
	}

	stopNode, done := node("eu", etcdauth.Credentials{Username: etcdauth.RegionUser("eu"), PasswordFile: regionFile})
	coordPW, err := os.ReadFile(filepath.Join(dataDir, EmbeddedAuthDir, "coordinator.password"))
	if err != nil {
		t.Fatal(err)
	}
	admin, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		Username: CoordinatorEtcdUser, Password: strings.TrimSpace(string(coordPW))})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	acked := func() bool {
		r, err := admin.Get(ctx, etcdlayout.Layout{}.AckShard("eu", "n1", etcdlayout.PolicyShard("authed")))
		if err != nil {
			t.Fatal(err)
		}
		var a etcdlayout.Ack
		return len(r.Kvs) == 1 && json.Unmarshal(r.Kvs[0].Value, &a) == nil && a.Epochs["authed"] > 0
	}
	for deadline := time.Now().Add(30 * time.Second); !acked(); time.Sleep(50 * time.Millisecond) {
		select {
		case err := <-done:
			t.Fatalf("node with the region's credentials stopped: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no acknowledgement of the policy's allocation by eu/n1 in 30s\n%s", logs.String())
		}
	}
	if err := stopNode(); err != nil {
		t.Fatalf("node: %v", err)
	}

	// A restart finds authentication on and signs in as root.
	stop()
	c, stop = start()
	if !strings.Contains(logs.String(), "etcd credentials of a region's nodes") {
		t.Fatalf("the region's credentials are not logged:\n%s", logs.String())
	}
	_ = c
}
