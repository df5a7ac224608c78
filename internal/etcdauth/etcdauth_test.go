package etcdauth_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/quotacoord/quota/internal/etcdauth"
	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/etcdtest"
)

func login(t *testing.T, srv *etcdtest.Server, user, password string) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: srv.Endpoints, DialTimeout: 5 * time.Second,
		Username: user, Password: password, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("login %s: %v", user, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestNodeRoleOnRealEtcd: on an embedded etcd with authentication on, a
// node's credential writes its own registration, demand report and
// acknowledgement, creates the subject salt, and reads allocations,
// policies and settings, but
// cannot write another node's or region's keys, an allocation, a policy,
// a control or the audit log, nor read other nodes' reports; the
// coordinator's credential writes everything under the prefix, and
// nothing outside it. A region's shared credential (RegionRole) does for
// any node of its region what a node's does for itself, and nothing for
// another region.
func TestNodeRoleOnRealEtcd(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	l := etcdlayout.Layout{}
	admin := srv.Client(t)
	if err := etcdauth.Ensure(ctx, admin, etcdauth.CoordinatorRole(l), "quota-coordinator", "coord-pw"); err != nil {
		t.Fatal(err)
	}
	role, err := etcdauth.NodeRole(l, "eu", "n1")
	if err != nil {
		t.Fatal(err)
	}
	if err := etcdauth.Ensure(ctx, admin, role, etcdauth.NodeUser("eu", "n1"), "node-pw"); err != nil {
		t.Fatal(err)
	}
	eu, err := etcdauth.RegionRole(l, "eu")
	if err != nil {
		t.Fatal(err)
	}
	if err := etcdauth.Ensure(ctx, admin, eu, etcdauth.RegionUser("eu"), "region-pw"); err != nil {
		t.Fatal(err)
	}
	if err := etcdauth.EnableAuth(ctx, admin, "root-pw"); err != nil {
		t.Fatal(err)
	}
	// Running it all again (as root now) changes nothing.
	root := login(t, srv, etcdauth.RootUser, "root-pw")
	if err := etcdauth.Ensure(ctx, root, role, etcdauth.NodeUser("eu", "n1"), "node-pw"); err != nil {
		t.Fatalf("Ensure again: %v", err)
	}
	coord := login(t, srv, "quota-coordinator", "coord-pw")
	node := login(t, srv, etcdauth.NodeUser("eu", "n1"), "node-pw")
	region := login(t, srv, etcdauth.RegionUser("eu"), "region-pw")
	if _, err := coord.Put(ctx, l.Alloc("exports"), `{"epoch":1}`); err != nil {
		t.Fatalf("coordinator publishes an allocation: %v", err)
	}
	if _, err := coord.Put(ctx, l.Settings(), `{}`); err != nil {
		t.Fatalf("coordinator publishes settings: %v", err)
	}
	lease, err := node.Grant(ctx, 10)
	if err != nil {
		t.Fatalf("node grants a lease: %v", err)
	}
	for _, tc := range []struct {
		name  string
		c     *clientv3.Client
		op    clientv3.Op
		allow bool
	}{
		{"node registers itself", node, clientv3.OpPut(l.Node("eu", "n1"), "{}", clientv3.WithLease(lease.ID)), true},
		{"node reports its demand", node, clientv3.OpPut(l.DemandShard("eu", "n1", 7), "{}", clientv3.WithLease(lease.ID)), true},
		{"node acknowledges", node, clientv3.OpPut(l.AckShard("eu", "n1", 7), "{}", clientv3.WithLease(lease.ID)), true},
		{"node reads allocations", node, clientv3.OpGet(l.AllocPrefix(), clientv3.WithPrefix()), true},
		{"node reads policies", node, clientv3.OpGet(l.PoliciesPrefix(), clientv3.WithPrefix()), true},
		{"node reads settings", node, clientv3.OpGet(l.Settings()), true},
		{"node registers another region", node, clientv3.OpPut(l.Node("us", "n1"), "{}"), false},
		{"node registers another node", node, clientv3.OpPut(l.Node("eu", "n2"), "{}"), false},
		{"node registers a longer key", node, clientv3.OpPut(l.Node("eu", "n1")+"x", "{}"), false},
		{"node reports another node's demand", node, clientv3.OpPut(l.DemandShard("eu", "n2", 7), "{}"), false},
		{"node acknowledges for another node", node, clientv3.OpPut(l.AckShard("us", "n1", 7), "{}"), false},
		{"node writes an allocation", node, clientv3.OpPut(l.Alloc("exports"), `{"epoch":99}`), false},
		{"node deletes an allocation", node, clientv3.OpDelete(l.Alloc("exports")), false},
		{"node writes a policy", node, clientv3.OpPut(l.PolicyDoc("p.yaml"), "policies: []"), false},
		{"node writes a control", node, clientv3.OpPut(l.Control("exports"), "{}"), false},
		{"node writes settings", node, clientv3.OpPut(l.Settings(), "{}"), false},
		{"node writes the audit log", node, clientv3.OpPut(l.Audit(time.Now(), 1), "{}"), false},
		{"node takes the election", node, clientv3.OpPut(l.Election()+"/x", "me"), false},
		{"node reads all demand reports", node, clientv3.OpGet(l.DemandPrefix(), clientv3.WithPrefix()), false},
		{"node reads its region's demand reports", node, clientv3.OpGet(l.DemandPrefix()+"eu/", clientv3.WithPrefix()), true},
		{"node reads another region's demand reports", node, clientv3.OpGet(l.DemandPrefix()+"us/", clientv3.WithPrefix()), false},
		{"node reads its region's registrations", node, clientv3.OpGet(l.RegionNodes("eu"), clientv3.WithPrefix()), true},
		{"node reads another region's registrations", node, clientv3.OpGet(l.RegionNodes("us"), clientv3.WithPrefix()), false},
		{"node deletes another node's registration", node, clientv3.OpDelete(l.Node("eu", "n2")), false},
		{"node deletes another node's demand", node, clientv3.OpDelete(l.NodeDemands("eu", "n2"), clientv3.WithPrefix()), false},
		{"node reads the audit log", node, clientv3.OpGet(l.AuditPrefix(), clientv3.WithPrefix()), false},
		{"node creates the subject salt", node, clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(l.SubjectSalt()), "=", 0)},
			[]clientv3.Op{clientv3.OpPut(l.SubjectSalt(), "salt")}, []clientv3.Op{clientv3.OpGet(l.SubjectSalt())}), true},
		{"region registers any of its nodes", region, clientv3.OpPut(l.Node("eu", "n7"), "{}"), true},
		{"region reports a node's demand", region, clientv3.OpPut(l.DemandShard("eu", "n7", 7), "{}"), true},
		{"region acknowledges for a node", region, clientv3.OpPut(l.AckShard("eu", "n7", 7), "{}"), true},
		{"region reads allocations", region, clientv3.OpGet(l.AllocPrefix(), clientv3.WithPrefix()), true},
		{"region reads the subject salt", region, clientv3.OpGet(l.SubjectSalt()), true},
		{"region registers another region", region, clientv3.OpPut(l.Node("us", "n1"), "{}"), false},
		{"region registers a region named like it", region, clientv3.OpPut(l.RegionsPrefix()+"eux/n1", "{}"), false},
		{"region reports another region's demand", region, clientv3.OpPut(l.DemandShard("us", "n1", 7), "{}"), false},
		{"region acknowledges for another region", region, clientv3.OpPut(l.AckShard("us", "n1", 7), "{}"), false},
		{"region writes an allocation", region, clientv3.OpPut(l.Alloc("exports"), `{"epoch":99}`), false},
		{"region writes a policy", region, clientv3.OpPut(l.PolicyDoc("p.yaml"), "policies: []"), false},
		{"region writes a control", region, clientv3.OpPut(l.Control("exports"), "{}"), false},
		{"region writes settings", region, clientv3.OpPut(l.Settings(), "{}"), false},
		{"region writes the audit log", region, clientv3.OpPut(l.Audit(time.Now(), 1), "{}"), false},
		{"region takes the election", region, clientv3.OpPut(l.Election()+"/x", "me"), false},
		{"region reads all demand reports", region, clientv3.OpGet(l.DemandPrefix(), clientv3.WithPrefix()), false},
		{"coordinator writes a control", coord, clientv3.OpPut(l.Control("exports"), "{}"), true},
		{"coordinator reads the registrations", coord, clientv3.OpGet(l.RegionsPrefix(), clientv3.WithPrefix()), true},
		{"coordinator writes outside its prefix", coord, clientv3.OpPut("/other/app", "x"), false},
	} {
		_, err := tc.c.Do(ctx, tc.op)
		denied := errors.Is(err, rpctypes.ErrPermissionDenied)
		switch {
		case tc.allow && err != nil:
			t.Errorf("%s: %v, want allowed", tc.name, err)
		case !tc.allow && !denied:
			t.Errorf("%s: %v, want permission denied", tc.name, err)
		}
	}
	if a, err := coord.Get(ctx, l.Alloc("exports")); err != nil || len(a.Kvs) != 1 || string(a.Kvs[0].Value) != `{"epoch":1}` {
		t.Errorf("allocation after the node's attempts: %v, %v", a, err)
	}
	if _, err := node.Revoke(ctx, lease.ID); err != nil {
		t.Errorf("node revokes its own lease: %v", err)
	}
	if _, err := etcdauth.NodeRole(l, "eu/x", "n1"); !errors.Is(err, etcdauth.ErrInvalid) {
		t.Errorf("region with a slash: %v, want ErrInvalid", err)
	}
	if _, err := etcdauth.RegionRole(l, "eu/x"); !errors.Is(err, etcdauth.ErrInvalid) {
		t.Errorf("RegionRole, region with a slash: %v, want ErrInvalid", err)
	}
	anon := login(t, srv, "", "")
	if _, err := anon.Put(ctx, l.Alloc("exports"), "{}"); err == nil {
		t.Error("an unauthenticated client wrote an allocation")
	}
}
