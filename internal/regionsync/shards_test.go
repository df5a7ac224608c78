package regionsync

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/etcdtest"
)

// TestShardWriterWritesWhatChanged: a node rewrites only the shards whose
// value changed, deletes the shards that emptied, and writes every shard
// again under a new lease (the old lease took its keys with it).
func TestShardWriterWritesWhatChanged(t *testing.T) {
	srv := etcdtest.Start(t)
	c := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	grant := func() clientv3.LeaseID {
		g, err := c.Grant(ctx, 30)
		if err != nil {
			t.Fatal(err)
		}
		return g.ID
	}
	key := func(s int) string { return lay.AckShard("eu", "n", s) }
	var w ShardWriter[etcdlayout.Ack]
	a := etcdlayout.Ack{Region: "eu", Node: "n", Epochs: map[string]uint64{}}
	for i := range 300 {
		a.Epochs[policyName(i)] = 1
	}
	shards := etcdlayout.SplitAck(a)
	lease := grant()
	write := func(want Written) {
		t.Helper()
		got, err := w.Write(ctx, c, Owner{Lease: lease}, key, shards, ackChanged)
		if err != nil {
			t.Fatal(err)
		}
		got.Bytes = 0
		if got != want {
			t.Fatalf("wrote %+v, want %+v", got, want)
		}
	}
	// 300 policies fill more shards than one transaction may carry.
	write(Written{Puts: len(shards), Txns: (len(shards) + etcdlayout.MaxTxnOps - 1) / etcdlayout.MaxTxnOps})
	write(Written{})

	// One policy's epoch moves: one shard is written.
	a.Epochs[policyName(7)] = 2
	shards = etcdlayout.SplitAck(a)
	write(Written{Puts: 1, Txns: 1})
	var got etcdlayout.Ack
	if found, l := getAck(t, c, "eu", "n", &got); !found || l != int64(lease) || got.Epochs[policyName(7)] != 2 || len(got.Epochs) != 300 {
		t.Fatalf("stored acknowledgement: %d epochs, %s at %d, lease %x", len(got.Epochs), policyName(7), got.Epochs[policyName(7)], l)
	}

	// A shard that empties is deleted.
	gone := etcdlayout.PolicyShard(policyName(7))
	for p := range a.Epochs {
		if etcdlayout.PolicyShard(p) == gone {
			delete(a.Epochs, p)
		}
	}
	shards = etcdlayout.SplitAck(a)
	write(Written{Deletes: 1, Txns: 1})
	if r, err := c.Get(ctx, key(gone)); err != nil || len(r.Kvs) != 0 {
		t.Fatalf("emptied shard still stored: %v %v", r, err)
	}

	// A new lease: every shard again.
	lease = grant()
	write(Written{Puts: len(shards), Txns: (len(shards) + etcdlayout.MaxTxnOps - 1) / etcdlayout.MaxTxnOps})
}

// TestKeptShardsOutliveTheLease: acknowledgement shards written with a
// registration are put without the lease, only while the registration is
// held under it, and stay after the lease ends, for a leader that did not
// see the node go.
func TestKeptShardsOutliveTheLease(t *testing.T) {
	srv := etcdtest.Start(t)
	c := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	g, err := c.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	reg := lay.Node("eu", "n")
	owner := Owner{Lease: g.ID, Registration: reg}
	key := func(s int) string { return lay.AckShard("eu", "n", s) }
	shards := etcdlayout.SplitAck(etcdlayout.Ack{Region: "eu", Node: "n", Epochs: map[string]uint64{"p": 3}})
	var w ShardWriter[etcdlayout.Ack]
	if _, err := w.Write(ctx, c, owner, key, shards, ackChanged); !errors.Is(err, ErrNotRegistered) {
		t.Fatalf("write before the registration: %v, want ErrNotRegistered", err)
	}
	if _, err := c.Put(ctx, reg, "{}", clientv3.WithLease(g.ID)); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(ctx, c, owner, key, shards, ackChanged); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Revoke(ctx, g.ID); err != nil {
		t.Fatal(err)
	}
	var a etcdlayout.Ack
	if found, l := getAck(t, c, "eu", "n", &a); !found || l != 0 || a.Epochs["p"] != 3 {
		t.Fatalf("after the lease ended: found %v, lease %x, epochs %v; want epoch 3 kept without a lease", found, l, a.Epochs)
	}
	shards = etcdlayout.SplitAck(etcdlayout.Ack{Region: "eu", Node: "n", Epochs: map[string]uint64{"p": 4}})
	if _, err := w.Write(ctx, c, owner, key, shards, ackChanged); !errors.Is(err, ErrNotRegistered) {
		t.Fatalf("write after the lease ended: %v, want ErrNotRegistered", err)
	}
	if found, _ := getAck(t, c, "eu", "n", &a); !found || a.Epochs["p"] != 3 {
		t.Fatalf("a refused write changed the kept acknowledgement: %v", a.Epochs)
	}
}

func policyName(i int) string { return fmt.Sprintf("policy-%d", i) }

func TestDemandChanged(t *testing.T) {
	rep := func(offered float64, subjects ...etcdlayout.SubjectDemand) etcdlayout.DemandReport {
		return etcdlayout.DemandReport{Policies: map[string]etcdlayout.PolicyDemand{"p": {Offered: offered, Admitted: offered, Pressured: subjects}}}
	}
	sd := func(s string, offered float64, denied bool) etcdlayout.SubjectDemand {
		return etcdlayout.SubjectDemand{Subject: s, Offered: offered, Admitted: offered, Denied: denied}
	}
	base := rep(100, sd("a", 10, false))
	for _, c := range []struct {
		name    string
		next    etcdlayout.DemandReport
		changed bool
	}{
		{"same", rep(100, sd("a", 10, false)), false},
		{"rate within the tolerance", rep(104, sd("a", 10.4, false)), false},
		{"rate past the tolerance", rep(110, sd("a", 10, false)), true},
		{"subject rate past the tolerance", rep(100, sd("a", 11, false)), true},
		{"subject now denied", rep(100, sd("a", 10, true)), true},
		{"another subject", rep(100, sd("b", 10, false)), true},
		{"a subject more", rep(100, sd("a", 10, false), sd("b", 1, false)), true},
		{"policy gone", etcdlayout.DemandReport{Policies: map[string]etcdlayout.PolicyDemand{}}, true},
		{"another policy", etcdlayout.DemandReport{Policies: map[string]etcdlayout.PolicyDemand{"q": base.Policies["p"]}}, true},
		{"nearly idle", rep(0.001), true},
	} {
		if got := demandChanged(base, c.next); got != c.changed {
			t.Errorf("%s: changed %v, want %v", c.name, got, c.changed)
		}
	}
}

// TestOnePolicyMovingRewritesLittle: at a node holding 10,000 policies
// with 4 pressured subjects each, one policy's demand moving past the
// tolerance rewrites one small record, a few KiB, not a shard of tens of
// policies; every record and transaction stays within etcd's limits; and
// what etcd holds afterwards is the node's whole report.
func TestOnePolicyMovingRewritesLittle(t *testing.T) {
	srv := etcdtest.Start(t)
	c := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	g, err := c.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	const policies = 10000
	rep := etcdlayout.DemandReport{Region: "eu", Node: "n", At: time.Unix(1000, 0).UTC(), IntervalSeconds: 1,
		Policies: make(map[string]etcdlayout.PolicyDemand, policies)}
	for i := range policies {
		d := etcdlayout.PolicyDemand{Offered: 10000 + float64(i), Admitted: 9000}
		for s := range 4 {
			d.Pressured = append(d.Pressured, etcdlayout.SubjectDemand{Subject: fmt.Sprintf("tenant-%d-%d", i, s), Offered: 1200, Admitted: 1000, Denied: true})
		}
		rep.Policies[policyName(i)] = d
	}
	key := func(s int) string { return lay.DemandShard("eu", "n", s) }
	var w ShardWriter[etcdlayout.DemandReport]
	first, err := w.Write(ctx, c, Owner{Lease: g.ID}, key, etcdlayout.SplitDemand(rep), demandChanged)
	if err != nil {
		t.Fatal(err)
	}
	if first.Bytes/first.Txns > etcdlayout.MaxTxnBytes || first.Puts/first.Txns > etcdlayout.MaxTxnOps {
		t.Fatalf("first write %+v: a transaction over the limits", first)
	}

	moved := rep.Policies[policyName(4321)]
	moved.Offered *= 1.5
	rep.Policies[policyName(4321)] = moved
	rep.At = rep.At.Add(time.Second)
	got, err := w.Write(ctx, c, Owner{Lease: g.ID}, key, etcdlayout.SplitDemand(rep), demandChanged)
	if err != nil {
		t.Fatal(err)
	}
	const few = 4 << 10
	if got.Puts != 1 || got.Deletes != 0 || got.Bytes > few {
		t.Fatalf("one policy of %d moved: wrote %+v (%d B in %d records, first write %d B in %d); want one record of at most %d B",
			policies, got, got.Bytes, got.Puts, first.Bytes, first.Puts, few)
	}
	var stored etcdlayout.DemandReport
	if found, _ := getDemand(t, c, "eu", "n", &stored); !found || !reflect.DeepEqual(stored.Policies, rep.Policies) {
		t.Fatalf("etcd holds %d policies, the report %d, or they differ", len(stored.Policies), len(rep.Policies))
	}
}
