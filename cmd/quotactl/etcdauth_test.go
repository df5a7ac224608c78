package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/quotacoord/quota/internal/etcdauth"
	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/etcdtest"
)

// TestEtcdAuthCommands: quotactl etcd-auth creates the coordinator's and a
// node's users, turns authentication on, and goes on as root, creating a
// region's shared user; the node's credential then cannot write an
// allocation or another region's registration, nor the region's another
// region's. A missing password file is a clear error.
func TestEtcdAuthCommands(t *testing.T) {
	srv := etcdtest.Start(t)
	dir := t.TempDir()
	secret := func(name, v string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(v+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	rootPw, coordPw, nodePw := secret("root", "root-pw"), secret("coord", "coord-pw"), secret("node", "node-pw")
	ep := srv.Endpoints[0]
	quotactl := func(args ...string) (string, error) {
		var out, errb bytes.Buffer
		err := run(context.Background(), append([]string{"etcd-auth", "--etcd", ep}, args...), &out, &errb)
		return out.String() + errb.String(), err
	}
	for _, args := range [][]string{
		{"coordinator", "quota-coordinator", "--password-file", coordPw},
		{"enable", "--password-file", rootPw},
		{"node", "eu", "n1", "--password-file", nodePw, "--etcd-user", "root", "--etcd-password-file", rootPw},
		{"region", "us", "--password-file", nodePw, "--etcd-user", "root", "--etcd-password-file", rootPw},
	} {
		if out, err := quotactl(args...); err != nil || !strings.Contains(out, "ok") {
			t.Fatalf("quotactl etcd-auth %v: %q, %v", args, out, err)
		}
	}
	if _, err := quotactl("node", "us", "n1", "--password-file", nodePw); err == nil {
		t.Error("creating a node without root credentials after auth was enabled succeeded")
	}
	if out, err := quotactl("node", "eu", "n2"); err == nil || !strings.Contains(err.Error(), "--password-file is required") {
		t.Errorf("node without --password-file: %q, %v", out, err)
	}
	node, err := clientv3.New(clientv3.Config{Endpoints: srv.Endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		Username: etcdauth.NodeUser("eu", "n1"), Password: "node-pw"})
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	ctx := context.Background()
	l := etcdlayout.Layout{}
	if _, err := node.Put(ctx, l.Node("eu", "n1"), "{}"); err != nil {
		t.Errorf("node registers itself: %v", err)
	}
	for _, key := range []string{l.Alloc("exports"), l.Node("us", "n1")} {
		if _, err := node.Put(ctx, key, "{}"); !errors.Is(err, rpctypes.ErrPermissionDenied) {
			t.Errorf("node writes %s: %v, want permission denied", key, err)
		}
	}
	region, err := clientv3.New(clientv3.Config{Endpoints: srv.Endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		Username: etcdauth.RegionUser("us"), Password: "node-pw"})
	if err != nil {
		t.Fatal(err)
	}
	defer region.Close()
	if _, err := region.Put(ctx, l.Node("us", "n9"), "{}"); err != nil {
		t.Errorf("region us registers a node: %v", err)
	}
	if _, err := region.Put(ctx, l.Node("eu", "n9"), "{}"); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Errorf("region us registers an eu node: %v, want permission denied", err)
	}
}
