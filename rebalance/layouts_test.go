package rebalance

import (
	"context"
	"fmt"
	"maps"
	"reflect"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/regionsync"
	"github.com/quotacoord/quota/plan"
)

// putDemandRecords writes a node's demand in records of one layout (of
// records, by shard), as a node of that layout does, and returns them.
func (r *records) putDemandRecords(region, node string, of int, ds map[string]plan.PolicyDemand) map[etcdlayout.DemandShardID]bool {
	r.t.Helper()
	written := map[etcdlayout.DemandShardID]bool{}
	byID := map[etcdlayout.DemandShardID]map[string]plan.PolicyDemand{}
	for p, d := range ds {
		id := etcdlayout.DemandShardID{Shard: etcdlayout.PolicyDemandShard(p), Of: of}
		if of == etcdlayout.LegacyDemandShards {
			id.Shard = etcdlayout.PolicyShard(p)
		}
		if byID[id] == nil {
			byID[id] = map[string]plan.PolicyDemand{}
		}
		byID[id][p] = d
	}
	for id, pols := range byID {
		r.put(r.ly.DemandRecord(region, node, id), etcdlayout.DemandReport{Region: region, Node: node, At: time.Unix(100, 0), IntervalSeconds: 1, Policies: pols})
		written[id] = true
	}
	return written
}

// TestDemandLayoutsCountedOnce: during a rolling upgrade a region's
// demand sums nodes writing the legacy 256-record layout, nodes writing
// the current one, and a node with records in both (its old process's
// not yet ended with their lease): that node counts each policy once,
// from its current records where they hold it. The copy kept from the
// watch and a read agree, and equal plan.SumDemand over the nodes'
// demand built here; once the legacy records go, the current ones alone
// count.
func TestDemandLayoutsCountedOnce(t *testing.T) {
	r, l, k, ds := newKept(t, 40)
	for _, n := range []string{"old", "both", "new"} {
		r.put(r.ly.Node("e", n), etcdlayout.Registration{Region: "e", Node: n})
	}
	demand := func(offered float64) plan.PolicyDemand {
		return plan.PolicyDemand{Offered: offered, Admitted: offered / 2,
			Pressured: []plan.SubjectDemand{{Subject: "acme", Offered: offered / 4, Admitted: offered / 8, Denied: true}}}
	}
	before, after, old, upgraded := map[string]plan.PolicyDemand{}, map[string]plan.PolicyDemand{}, map[string]plan.PolicyDemand{}, map[string]plan.PolicyDemand{}
	for i, p := range r.pols {
		before[p] = demand(float64(1000 + i))
		old[p] = demand(float64(10 + i))
		if i%2 == 0 {
			after[p] = demand(float64(5000 + i))
		}
		upgraded[p] = demand(float64(300 + i))
	}
	r.putDemandRecords("e", "old", etcdlayout.LegacyDemandShards, old)
	legacy := r.putDemandRecords("e", "both", etcdlayout.LegacyDemandShards, before)
	r.putDemandRecords("e", "both", etcdlayout.DemandShards, after)
	r.putDemandRecords("e", "new", etcdlayout.DemandShards, upgraded)

	check := func(what string, both map[string]plan.PolicyDemand) {
		t.Helper()
		kept, read := keptLikeRead(t, what, l, k, ds)
		want := plan.SumDemand([]map[string]plan.PolicyDemand{both, upgraded, old}, MaxOverridesLimit)
		if !reflect.DeepEqual(kept.view.Demand["e"], want) || !reflect.DeepEqual(read.view.Demand["e"], want) {
			t.Fatalf("%s: region e's demand\nkept %v\nread %v\nwant %v", what, kept.view.Demand["e"], read.view.Demand["e"], want)
		}
	}
	mixed := maps.Clone(before)
	maps.Copy(mixed, after)
	check("a node with records in both layouts", mixed)

	// The node's old process ends: its legacy records go with its lease.
	for id := range legacy {
		r.del(r.ly.DemandRecord("e", "both", id))
	}
	check("after the legacy records went", after)
}

// TestKeptDemandOfTenThousandPolicies: a node holding 10,000 policies
// writes its demand, then one policy's demand moves: the node rewrites
// one record of a few KiB, the copy kept from the watch applies it
// without reading, and the region's demand equals plan.SumDemand over a
// fresh read.
func TestKeptDemandOfTenThousandPolicies(t *testing.T) {
	r, l, k, ds := newKept(t, 4)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r.put(r.ly.Node("e", "big"), etcdlayout.Registration{Region: "e", Node: "big"})
	g, err := r.cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	rep := etcdlayout.DemandReport{Region: "e", Node: "big", At: time.Unix(100, 0), IntervalSeconds: 1, Policies: map[string]plan.PolicyDemand{}}
	for i := range 10000 {
		d := plan.PolicyDemand{Offered: float64(10000 + i), Admitted: 9000}
		for s := range 4 {
			d.Pressured = append(d.Pressured, plan.SubjectDemand{Subject: fmt.Sprintf("tenant-%d-%d", i, s), Offered: 1200, Admitted: 1000, Denied: true})
		}
		rep.Policies[fmt.Sprintf("policy-%d", i)] = d
	}
	var w regionsync.ShardWriter[etcdlayout.DemandReport]
	key := func(s int) string { return r.ly.DemandShard("e", "big", s) }
	changed := func(a, b etcdlayout.DemandReport) bool { return !reflect.DeepEqual(a, b) }
	write := func() regionsync.Written {
		t.Helper()
		out, err := w.Write(ctx, r.cli, regionsync.Owner{Lease: g.ID}, key, etcdlayout.SplitDemand(rep), changed)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := r.cli.Get(ctx, r.ly.Settings(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		r.last = resp.Header.Revision
		return out
	}
	check := func(what string) {
		t.Helper()
		kept, read := keptLikeRead(t, what, l, k, ds)
		want := r.readDemand(read.view)
		if len(kept.view.Demand["e"]) != 10000 || !reflect.DeepEqual(kept.view.Demand, want) {
			t.Fatalf("%s: kept demand of %d policies in region e differs from plan.SumDemand over a read", what, len(kept.view.Demand["e"]))
		}
	}
	write()
	check("10,000 policies written")
	ds.planned(false) // a round planned every policy
	moved := rep.Policies["policy-4321"]
	moved.Offered *= 1.5
	rep.Policies["policy-4321"] = moved
	if got := write(); got.Puts != 1 || got.Bytes > 4<<10 {
		t.Fatalf("one policy of 10,000 moved: wrote %+v, want one record of at most 4 KiB", got)
	}
	check("one policy moved")
	if ds.all || !ds.policies["policy-4321"] {
		t.Fatalf("after one policy moved: every policy marked %v, policy-4321 marked %v", ds.all, ds.policies["policy-4321"])
	}
}
