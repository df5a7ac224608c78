package regionsync

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.uber.org/zap"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/quotacoord/quota/internal/etcdauth"
	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/etcdtest"
	"github.com/quotacoord/quota/internal/logbuf"
)

func TestDefaultNodeID(t *testing.T) {
	a, b := DefaultNodeID(), DefaultNodeID()
	if !etcdlayout.ValidName(a) || !etcdlayout.ValidName(b) {
		t.Fatalf("invalid default node ids %q, %q", a, b)
	}
	if a == b {
		t.Fatalf("two default node ids are equal: %q", a)
	}
}

// TestTwoNodesOfOneRegion: two nodes of region eu register, acknowledge
// and report under their own keys; when one stops gracefully, its keys go
// and the other's registration stays, so the region stays live.
func TestTwoNodesOfOneRegion(t *testing.T) {
	srv := etcdtest.Start(t)
	c := srv.Client(t)
	putJSON(t, c, lay.Alloc("p"), alloc("p", 1, map[string]float64{"eu": 0.5}, map[string]float64{"eu": 0.1}, nil))
	s1, _ := start(t, srv, Config{Node: "n1", LeaseTTL: 3 * time.Second})
	s2, stop2 := start(t, srv, Config{Node: "n2", LeaseTTL: 3 * time.Second})
	if s1.Node() != "n1" || s2.Node() != "n2" {
		t.Fatalf("nodes %q, %q", s1.Node(), s2.Node())
	}
	for _, n := range []string{"n1", "n2"} {
		waitFor(t, 5*time.Second, "node "+n+" to register and acknowledge epoch 1", func() bool {
			var reg etcdlayout.Registration
			var a etcdlayout.Ack
			okReg, _ := getJSON(t, c, lay.Node("eu", n), &reg)
			okAck, _ := getAck(t, c, "eu", n, &a)
			return okReg && reg.Node == n && reg.Region == "eu" && okAck && a.Node == n && a.Epochs["p"] == 1
		})
	}
	stop2()
	waitFor(t, 5*time.Second, "n2's keys to go", func() bool {
		found, _ := getJSON(t, c, lay.Node("eu", "n2"), &etcdlayout.Registration{})
		return !found
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.Get(ctx, lay.RegionNodes("eu"), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Key) != lay.Node("eu", "n1") {
		t.Fatalf("after n2 stopped, registrations of eu: %v", resp.Kvs)
	}
	if !s1.Ready() || s1.Share("p", "x") != 0.5 {
		t.Fatalf("n1 lost its share when n2 stopped: ready %v share %v", s1.Ready(), s1.Share("p", "x"))
	}
}

// TestNodesCountsRegionRegistrations: Nodes counts the registrations of
// the node's own region, itself included even before its registration is
// read; a registration of another region does not count, and a node that
// stops leaves the count.
func TestNodesCountsRegionRegistrations(t *testing.T) {
	srv := etcdtest.Start(t)
	c := srv.Client(t)
	putJSON(t, c, lay.Node("us", "u1"), etcdlayout.Registration{Region: "us", Node: "u1"})
	s1, _ := start(t, srv, Config{Node: "n1", LeaseTTL: 3 * time.Second})
	if n := s1.Nodes(); n != 1 {
		t.Fatalf("Nodes before any read = %d, want 1 (itself)", n)
	}
	waitFor(t, 5*time.Second, "n1 to count itself alone", func() bool { return s1.Ready() && s1.Nodes() == 1 })
	s2, stop2 := start(t, srv, Config{Node: "n2", LeaseTTL: 3 * time.Second})
	waitFor(t, 5*time.Second, "both nodes to count 2", func() bool { return s1.Nodes() == 2 && s2.Nodes() == 2 })
	putJSON(t, c, lay.Node("eu", "n3"), etcdlayout.Registration{Region: "eu", Node: "n3"})
	waitFor(t, 5*time.Second, "both nodes to count 3", func() bool { return s1.Nodes() == 3 && s2.Nodes() == 3 })
	stop2()
	waitFor(t, 5*time.Second, "n1 to count 2 once n2 stopped", func() bool { return s1.Nodes() == 2 })
}

// TestDemandPart: a node's part of its region's demand for a subject is
// what its own last report offered over what all the region's nodes'
// reports offered (another region's reports do not count); a subject its
// own report does not name has no part (the caller splits evenly), and a
// node whose reports go leaves the sum.
func TestDemandPart(t *testing.T) {
	srv := etcdtest.Start(t)
	c := srv.Client(t)
	report := func(region, node string, offered map[string]float64) {
		var ps []etcdlayout.SubjectDemand
		for s, o := range offered {
			ps = append(ps, etcdlayout.SubjectDemand{Subject: s, Offered: o, Denied: true})
		}
		putJSON(t, c, lay.DemandShard(region, node, etcdlayout.PolicyDemandShard("p")), etcdlayout.DemandReport{
			Region: region, Node: node, At: time.Now(), IntervalSeconds: 1,
			Policies: map[string]etcdlayout.PolicyDemand{"p": {Offered: 1, Pressured: ps}}})
	}
	report("eu", "n2", map[string]float64{"acme": 10, "zeta": 5})
	report("us", "u1", map[string]float64{"acme": 1000})
	s1, _ := start(t, srv, Config{Node: "n1", LeaseTTL: 3 * time.Second})
	report("eu", "n1", map[string]float64{"acme": 30})
	waitFor(t, 5*time.Second, "n1's part of acme", func() bool {
		part, ok := s1.DemandPart("p", "acme")
		return ok && part == 0.75
	})
	if part, ok := s1.DemandPart("p", "zeta"); ok {
		t.Errorf("n1's part of zeta, which n1 does not report: %v, want none", part)
	}
	if part, ok := s1.DemandPart("q", "acme"); ok {
		t.Errorf("n1's part of acme under policy q, which nobody reports: %v, want none", part)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.Delete(ctx, lay.NodeDemands("eu", "n2"), clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "n1's part of acme alone", func() bool {
		part, ok := s1.DemandPart("p", "acme")
		return ok && part == 1
	})
}

// TestDemandPartCountsANodeOnce: in a rolling upgrade a node's demand is
// read from records of the legacy 256-record layout as well, and a node
// with records in both layouts (its old process's not yet ended with
// their lease) counts once, by its current record.
func TestDemandPartCountsANodeOnce(t *testing.T) {
	srv := etcdtest.Start(t)
	c := srv.Client(t)
	report := func(node string, id etcdlayout.DemandShardID, acme float64) {
		putJSON(t, c, lay.DemandRecord("eu", node, id), etcdlayout.DemandReport{
			Region: "eu", Node: node, At: time.Now(), IntervalSeconds: 1,
			Policies: map[string]etcdlayout.PolicyDemand{"p": {Offered: acme, Pressured: []etcdlayout.SubjectDemand{{Subject: "acme", Offered: acme}}}}})
	}
	current := etcdlayout.DemandShardID{Shard: etcdlayout.PolicyDemandShard("p"), Of: etcdlayout.DemandShards}
	legacy := etcdlayout.DemandShardID{Shard: etcdlayout.PolicyShard("p"), Of: etcdlayout.LegacyDemandShards}
	report("n2", legacy, 90)
	report("n2", current, 10)
	s1, _ := start(t, srv, Config{Node: "n1", LeaseTTL: 3 * time.Second})
	report("n1", current, 30)
	waitFor(t, 5*time.Second, "n1's part of acme with n2 in both layouts counted once", func() bool {
		part, ok := s1.DemandPart("p", "acme")
		return ok && part == 0.75
	})
	report("n3", legacy, 60)
	waitFor(t, 5*time.Second, "n1's part of acme with n3 not yet upgraded", func() bool {
		part, ok := s1.DemandPart("p", "acme")
		return ok && part == 0.3
	})
}

// TestDemandPartWithNodeCredential: a node whose etcd credential is its
// own (etcdauth.NodeRole) reads its region's demand reports and gets its
// part, with no log line about reading them.
func TestDemandPartWithNodeCredential(t *testing.T) {
	role, err := etcdauth.NodeRole(lay, "eu", "n1")
	if err != nil {
		t.Fatal(err)
	}
	s, logs := demandPartUnder(t, role)
	waitFor(t, 10*time.Second, "n1's part of acme from both reports", func() bool {
		part, ok := s.DemandPart("p", "acme")
		return ok && part == 0.75
	})
	if strings.Contains(logs.String(), "cannot read") || strings.Contains(logs.String(), "permission denied") {
		t.Errorf("the node credential could not read what a node follows:\n%s", logs.String())
	}
}

// TestDemandPartWithoutReadAccess: a credential that may not read the
// other nodes' demand reports (an operator's narrower role) says so once,
// and DemandPart has no answer (the caller splits evenly) even for a
// subject its own report names.
func TestDemandPartWithoutReadAccess(t *testing.T) {
	role, err := etcdauth.NodeRole(lay, "eu", "n1")
	if err != nil {
		t.Fatal(err)
	}
	role.Name = "narrow"
	role.Permissions = slices.DeleteFunc(role.Permissions, func(p etcdauth.Permission) bool {
		return p.Key == lay.DemandPrefix()+"eu/"
	})
	s, logs := demandPartUnder(t, role)
	waitFor(t, 10*time.Second, "the note that the demand reports cannot be read", func() bool {
		return strings.Contains(logs.String(), "cannot read its region's demand reports")
	})
	if part, ok := s.DemandPart("p", "acme"); ok {
		t.Errorf("DemandPart without read access: %v, want none", part)
	}
	if n := strings.Count(logs.String(), "demand/eu/"); n > 0 {
		t.Errorf("%d log lines retry reading the demand reports", n)
	}
}

// demandPartUnder runs node eu/n1 on an etcd with authentication, signed
// in as a user of role, with demand reports from n1 (acme at 30/s) and n2
// (acme at 10/s) stored.
func demandPartUnder(t *testing.T, role etcdauth.Role) (*Syncer, *logbuf.Buffer) {
	t.Helper()
	srv := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin := srv.Client(t)
	if err := etcdauth.Ensure(ctx, admin, role, "n1-user", "node-pw"); err != nil {
		t.Fatal(err)
	}
	for node, rate := range map[string]float64{"n1": 30, "n2": 10} {
		putJSON(t, admin, lay.DemandShard("eu", node, etcdlayout.PolicyDemandShard("p")), etcdlayout.DemandReport{
			Region: "eu", Node: node, At: time.Now(), IntervalSeconds: 1,
			Policies: map[string]etcdlayout.PolicyDemand{"p": {Offered: rate, Pressured: []etcdlayout.SubjectDemand{{Subject: "acme", Offered: rate}}}}})
	}
	if err := etcdauth.EnableAuth(ctx, admin, "root-pw"); err != nil {
		t.Fatal(err)
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: srv.Endpoints, DialTimeout: 5 * time.Second,
		Username: "n1-user", Password: "node-pw", Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	logs := &logbuf.Buffer{}
	s, err := New(Config{Client: c, Region: "eu", Node: "n1", LeaseTTL: 3 * time.Second,
		Logger: hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Info})})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })
	return s, logs
}
