package rebalance

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotacoord/quota/internal/coordinator/coordtest"
	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/etcdtest"
	"github.com/quotacoord/quota/plan"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// records is a deployment's records written at random, as nodes,
// operators and leaders would, for comparing the leader's kept copy with
// a read.
type records struct {
	t    *testing.T
	cli  *clientv3.Client
	ly   etcdlayout.Layout
	rng  *rand.Rand
	pols []string
	// last is the revision of the last write.
	last  int64
	epoch uint64
}

var (
	testRegions = []string{"a", "b", "c", "d"}
	testNodes   = []string{"n1", "n2", "n3"}
)

// newRecords starts etcd with a policy document of policies policies and
// twenty random changes, and returns a Loop (not running) on it.
func newRecords(t *testing.T, policies int) (*records, *Loop) {
	t.Helper()
	srv := etcdtest.Start(t)
	r := &records{t: t, cli: srv.Client(t), rng: rand.New(rand.NewPCG(17, 1))}
	for i := range policies {
		r.pols = append(r.pols, fmt.Sprintf("p%02d", i))
	}
	r.doc(100)
	for range 20 {
		r.change()
	}
	l, err := New(Config{Client: r.cli, Name: "c1", Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	return r, l
}

// doc writes the policy document, every policy at rate.
func (r *records) doc(rate int) {
	r.t.Helper()
	var doc strings.Builder
	doc.WriteString("policies:\n")
	for _, p := range r.pols {
		fmt.Fprintf(&doc, "  - name: %s\n    capacity: %d\n    rate: %d/second\n", p, rate, rate)
	}
	if err := coordtest.PutPolicy(context.Background(), r.cli, r.ly, "many.yaml", []byte(doc.String())); err != nil {
		r.t.Fatal(err)
	}
	resp, err := r.cli.Get(context.Background(), r.ly.Settings())
	if err != nil {
		r.t.Fatal(err)
	}
	r.last = resp.Header.Revision
}

func (r *records) put(key string, v any) {
	r.t.Helper()
	b, ok := v.([]byte)
	if !ok {
		b, _ = json.Marshal(v)
	}
	resp, err := r.cli.Put(context.Background(), key, string(b))
	if err != nil {
		r.t.Fatal(err)
	}
	r.last = resp.Header.Revision
}

func (r *records) del(key string, opts ...clientv3.OpOption) {
	r.t.Helper()
	resp, err := r.cli.Delete(context.Background(), key, opts...)
	if err != nil {
		r.t.Fatal(err)
	}
	r.last = resp.Header.Revision
}

func (r *records) pick(xs []string) string { return xs[r.rng.IntN(len(xs))] }

// shardOf returns a shard, as shardOf gives them, holding some policy,
// and the policies in it (plus one no document defines).
func (r *records) shardOf(shardOf func(string) int) (int, []string) {
	shard := shardOf(r.pick(r.pols))
	var in []string
	for _, p := range r.pols {
		if shardOf(p) == shard {
			in = append(in, p)
		}
	}
	for i := 0; ; i++ {
		if p := fmt.Sprintf("x%d", i); shardOf(p) == shard {
			return shard, append(in, p)
		}
	}
}

// demandShard returns a demand record holding some policy, and the
// policies in it (shardOf): of the current layout, or one time in three
// of the legacy one, as a node not yet upgraded writes.
func (r *records) demandShard() (etcdlayout.DemandShardID, []string) {
	if r.rng.IntN(3) == 0 {
		s, pols := r.shardOf(etcdlayout.PolicyShard)
		return etcdlayout.DemandShardID{Shard: s, Of: etcdlayout.LegacyDemandShards}, pols
	}
	s, pols := r.shardOf(etcdlayout.PolicyDemandShard)
	return etcdlayout.DemandShardID{Shard: s, Of: etcdlayout.DemandShards}, pols
}

// change writes one random change.
func (r *records) change() {
	r.t.Helper()
	ly, region, node := r.ly, r.pick(testRegions), r.pick(testNodes)
	switch r.rng.IntN(14) {
	case 0, 1, 2:
		shard, pols := r.demandShard()
		ds := map[string]etcdlayout.PolicyDemand{}
		for _, p := range pols {
			if r.rng.IntN(3) == 0 {
				continue
			}
			d := etcdlayout.PolicyDemand{Offered: float64(r.rng.IntN(200)) + r.rng.Float64(), Admitted: float64(r.rng.IntN(100))}
			for s := range r.rng.IntN(4) {
				d.Pressured = append(d.Pressured, etcdlayout.SubjectDemand{Subject: fmt.Sprintf("s%d", s+r.rng.IntN(3)),
					Offered: r.rng.Float64() * 50, Admitted: r.rng.Float64() * 10, Denied: r.rng.IntN(2) == 0})
			}
			ds[p] = d
		}
		r.put(ly.DemandRecord(region, node, shard), etcdlayout.DemandReport{Region: region, Node: node, At: time.Unix(int64(r.rng.IntN(1000)), 0), IntervalSeconds: 1, Policies: ds})
	case 3:
		shard, _ := r.demandShard()
		r.del(ly.DemandRecord(region, node, shard))
	case 4, 5:
		shard, pols := r.shardOf(etcdlayout.PolicyShard)
		epochs := map[string]uint64{}
		for _, p := range pols {
			if r.rng.IntN(3) > 0 {
				epochs[p] = uint64(r.rng.IntN(6))
			}
		}
		r.put(ly.AckShard(region, node, shard), etcdlayout.Ack{Region: region, Node: node, Epochs: epochs})
	case 6:
		if r.rng.IntN(2) == 0 {
			r.del(ly.NodeAcks(region, node), clientv3.WithPrefix())
		} else {
			shard, _ := r.shardOf(etcdlayout.PolicyShard)
			r.del(ly.AckShard(region, node, shard))
		}
	case 7:
		if r.rng.IntN(3) == 0 {
			r.del(ly.Node(region, node))
		} else {
			r.put(ly.Node(region, node), etcdlayout.Registration{Region: region, Node: node, Fingerprint: r.pick([]string{"", "f1", "f1", "f2"})})
		}
	case 8:
		p := r.pick(r.pols)
		if r.rng.IntN(3) == 0 {
			r.del(ly.Control(p))
		} else {
			r.put(ly.Control(p), etcdlayout.Control{Frozen: r.rng.IntN(4) == 0, Weights: map[string]float64{region: 1 + r.rng.Float64()}})
		}
	case 9:
		p := r.pick(r.pols)
		r.epoch++
		def := map[string]float64{}
		left := 1.0
		for _, reg := range testRegions[:3] {
			s := left * r.rng.Float64()
			def[reg], left = s, left-s
		}
		r.put(ly.Alloc(p), etcdlayout.Allocation{Policy: p, Epoch: r.epoch, Phase: etcdlayout.PhaseStable, Default: def, Safe: maps.Clone(def), Overcommit: 0.05})
	case 10:
		if r.rng.IntN(2) == 0 {
			r.del(ly.Retired("d"))
		} else {
			r.put(ly.Retired(r.pick([]string{"c", "d"})), etcdlayout.RetiredRegion{Actor: "op"})
		}
	case 11:
		if r.rng.IntN(3) == 0 {
			r.del(ly.Behind(region))
		} else {
			r.put(ly.Behind(region), etcdlayout.Behind{"gone": {r.pick(r.pols): uint64(r.rng.IntN(4))}})
		}
	case 12:
		// Records a read leaves out: undecodable, a policy in the
		// wrong shard, the old one-record format.
		shard, _ := r.shardOf(etcdlayout.PolicyShard)
		switch r.rng.IntN(3) {
		case 0:
			r.put(ly.DemandShard(region, node, etcdlayout.PolicyDemandShard(r.pols[0])), []byte("{not json"))
		case 1:
			r.put(ly.AckShard(region, node, (shard+1)%etcdlayout.Shards), etcdlayout.Ack{Epochs: map[string]uint64{r.pols[0]: 9}})
		default:
			r.put(ly.DemandPrefix()+region+"/"+node, etcdlayout.DemandReport{Policies: map[string]etcdlayout.PolicyDemand{r.pols[0]: {Offered: 1}}})
		}
	case 13:
		if r.rng.IntN(4) == 0 {
			r.doc(50 + r.rng.IntN(100))
		}
	}
}

// readDemand is each live region's demand as summed from a read of the
// demand records, without the mirror: what a round must plan on. A node
// with records in both layouts counts each policy once, from its current
// records where they hold it, else from its legacy ones.
func (r *records) readDemand(view *plan.View) map[string]map[string]plan.PolicyDemand {
	r.t.Helper()
	resp, err := r.cli.Get(context.Background(), r.ly.DemandPrefix(), clientv3.WithPrefix())
	if err != nil {
		r.t.Fatal(err)
	}
	// region → node → layout (current, legacy) → policy
	reports := map[string]map[string]*[2]map[string]plan.PolicyDemand{}
	for _, kv := range resp.Kvs {
		region, node, id, d, err := r.ly.DecodeDemand(string(kv.Key), kv.Value)
		if err != nil {
			continue
		}
		if reports[region] == nil {
			reports[region] = map[string]*[2]map[string]plan.PolicyDemand{}
		}
		if reports[region][node] == nil {
			reports[region][node] = &[2]map[string]plan.PolicyDemand{{}, {}}
		}
		layer := 0
		if id.Of == etcdlayout.LegacyDemandShards {
			layer = 1
		}
		maps.Copy(reports[region][node][layer], d.Policies)
	}
	out := map[string]map[string]plan.PolicyDemand{}
	for region, ns := range reports {
		if _, live := view.Regions[region]; !live {
			continue
		}
		var per []map[string]plan.PolicyDemand
		for _, n := range slices.Sorted(maps.Keys(ns)) {
			node := maps.Clone(ns[n][1])
			maps.Copy(node, ns[n][0])
			per = append(per, node)
		}
		out[region] = plan.SumDemand(per, MaxOverridesLimit)
	}
	return out
}

// sameSnapshot fails t when the kept copy's snapshot differs from a
// read's in anything a round uses.
func sameSnapshot(t *testing.T, what string, kept, read *snapshot) {
	t.Helper()
	for _, c := range []struct {
		name       string
		kept, read any
	}{
		{"revision", kept.rev, read.rev},
		{"registrations and acknowledgements", kept.view.Regions, read.view.Regions},
		{"demand", kept.view.Demand, read.view.Demand},
		{"retired regions", kept.view.Retired, read.view.Retired},
		{"vanished nodes", kept.view.Behind, read.view.Behind},
		{"stored vanished nodes", kept.storedBehind, read.storedBehind},
		{"kept acknowledgements", kept.keptAcks, read.keptAcks},
		{"controls", kept.controls, read.controls},
		{"allocations", kept.allocs, read.allocs},
		{"allocation revisions", kept.allocRevs, read.allocRevs},
		{"policies", kept.planPolicies(), read.planPolicies()},
		{"policy documents", [2]int64{kept.docsRev, int64(kept.docs)}, [2]int64{read.docsRev, int64(read.docs)}},
	} {
		if !reflect.DeepEqual(c.kept, c.read) {
			t.Fatalf("%s: %s kept from the watch differ from a read:\nkept %v\nread %v", what, c.name, c.kept, c.read)
		}
	}
}

// newKept is newRecords with the lead's copy of the records read and
// kept from its watch (stopped when t ends), and a fresh dirty set.
func newKept(t *testing.T, policies int) (*records, *Loop, *kept, *dirtySet) {
	t.Helper()
	r, l := newRecords(t, policies)
	k, err := l.keep(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.stop)
	return r, l, k, newDirtySet()
}

// keptLikeRead brings the copy k up to date (current), which must take
// it from the watch without reading, and fails t when its snapshot
// differs from a read's (sameSnapshot). It returns both.
func keptLikeRead(t *testing.T, what string, l *Loop, k *kept, ds *dirtySet) (kept, read *snapshot) {
	t.Helper()
	ctx := context.Background()
	if read, err := l.current(ctx, k, ds, false); err != nil || read {
		t.Fatalf("%s: bringing the copy up to date read %v, %v; want it from the watch", what, read, err)
	}
	kept, err := k.m.snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if read, err = l.read(ctx); err != nil {
		t.Fatal(err)
	}
	sameSnapshot(t, what, kept, read)
	return kept, read
}

// sameLag has m, which observed the kept copy's earlier snapshots,
// observe kept, and fails t when its acknowledgement lag differs from the
// lag counted afresh from read. It returns that lag.
func sameLag(t *testing.T, what string, m *metrics, kept, read *snapshot) map[string]regionLag {
	t.Helper()
	fresh, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	m.observe(kept)
	fresh.observe(read)
	if !reflect.DeepEqual(m.lag, fresh.lag) {
		t.Fatalf("%s: acknowledgement lag kept %v, from a read %v", what, m.lag, fresh.lag)
	}
	return fresh.lag
}

// TestKeptRecordsPlanLikeARead: after each of a series of random changes
// to every kind of record, the leader's copy kept from its watch gives
// the same snapshot as a read of everything, the demand a read sums, and
// the same plans; and the copy was read once, at the start.
func TestKeptRecordsPlanLikeARead(t *testing.T) {
	r, l, k, ds := newKept(t, 12)
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	ld, err := plan.NewLeader(l.cfg.params(), now.Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	published := 0
	// The acknowledgement lag kept round to round from what changed
	// equals the lag of a read counted afresh.
	lagKept, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	lagging := 0
	for step := range 60 {
		for range 1 + r.rng.IntN(8) {
			r.change()
		}
		what := fmt.Sprintf("step %d", step)
		kept, read := keptLikeRead(t, what, l, k, ds)
		for _, lag := range sameLag(t, what, lagKept, kept, read) {
			lagging += int(lag.epochs)
		}
		if want := r.readDemand(read.view); !reflect.DeepEqual(read.view.Demand, want) {
			t.Fatalf("%s: demand %v, summed from a read %v", what, read.view.Demand, want)
		}
		now = now.Add(time.Second)
		a, b := ld.Clone(), ld.Clone()
		fromKept, _ := planRound(now, kept, kept.planPolicies(), a, true, nil)
		fromRead, _ := planRound(now, read, read.planPolicies(), b, true, nil)
		if !reflect.DeepEqual(fromKept, fromRead) || !reflect.DeepEqual(a.Behind(), b.Behind()) {
			t.Fatalf("%s: plans from the copy differ from plans from a read:\nkept %+v\nread %+v", what, fromKept, fromRead)
		}
		for _, d := range fromRead {
			if d.Publish != nil {
				published++
			}
		}
		planRound(now, read, read.planPolicies(), ld, true, nil)
	}
	if k.resyncs != 1 {
		t.Errorf("the copy was read %d times, want once (then kept from the watch)", k.resyncs)
	}
	if published == 0 {
		t.Error("no plan published anything: the comparison compared nothing")
	}
	if lagging == 0 {
		t.Error("no region lagged at any step: the lags compared were all 0")
	}
	t.Logf("%d epochs of lag over the steps", lagging)
}

// TestKeptRecordsRecoverFromCompaction: a copy whose watch starts after
// etcd compacted the revisions it needs reads everything again, makes the
// next round plan every policy, and is kept from its new watch after.
func TestKeptRecordsRecoverFromCompaction(t *testing.T) {
	r, l := newRecords(t, 8)
	ctx := context.Background()
	var err error
	k := &kept{back: make(chan struct{}, 1)}
	if k.m, err = l.readMirror(ctx); err != nil {
		t.Fatal(err)
	}
	for range 30 {
		r.change()
	}
	if _, err := r.cli.Compact(ctx, r.last); err != nil {
		t.Fatal(err)
	}
	l.watch(ctx, k) // from the copy's revision, compacted
	defer k.stop()
	ds := newDirtySet()
	ds.planned(false)
	if _, err := l.current(ctx, k, ds, false); err != nil {
		t.Fatal(err)
	}
	if k.resyncs != 1 || !ds.all {
		t.Fatalf("after the compaction the copy was read %d times and every policy marked %v; want once and true", k.resyncs, ds.all)
	}
	for step := range 10 {
		for range 3 {
			r.change()
		}
		keptLikeRead(t, fmt.Sprintf("step %d after the compaction", step), l, k, ds)
	}
}

// TestWatchQueueBounded: a watch queue past its bound of bytes drops what
// it holds and says so, and the lead's copy then reads everything again
// and plans every policy.
func TestWatchQueueBounded(t *testing.T) {
	r, l := newRecords(t, 4)
	ctx := context.Background()
	k, err := l.keep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer k.stop()
	ch := make(chan clientv3.WatchResponse)
	k.q = queueWatch(ch, nil, 25)
	value := func(rev int64) clientv3.WatchResponse {
		return clientv3.WatchResponse{Events: []*clientv3.Event{{Type: clientv3.EventTypePut,
			Kv: &mvccpb.KeyValue{Key: []byte(r.ly.Control("p00")), Value: []byte("{\"frozen\":true}"), ModRevision: rev}}}}
	}
	ch <- value(r.last + 1)
	if resps, _, over, _ := k.q.take(); len(resps) != 1 || over {
		t.Fatalf("one response of 15 bytes under a bound of 25: took %d, overflowed %v", len(resps), over)
	}
	for i := range 2 {
		ch <- value(r.last + 2 + int64(i))
	}
	<-k.q.ready
	ds := newDirtySet()
	ds.planned(false)
	if _, err := l.take(ctx, k, ds); err != nil {
		t.Fatal(err)
	}
	if k.resyncs != 2 || !ds.all {
		t.Fatalf("after 30 bytes queued under a bound of 25 the copy was read %d times and every policy marked %v; want twice and true", k.resyncs, ds.all)
	}
	close(ch)
	keptLikeRead(t, "after the overflow", l, k, ds)
}

// TestEventsBeforeTheReadStillTold: an event the copy already holds from
// a later read changes nothing in it, but still tells the lead a node's
// registration went (its region's growth must wait the skew margin).
func TestEventsBeforeTheReadStillTold(t *testing.T) {
	var ly etcdlayout.Layout
	m := newMirror(ly, hclog.NewNullLogger())
	m.load(10, nil)
	ds := newDirtySet()
	gone := &clientv3.Event{Type: clientv3.EventTypeDelete, Kv: &mvccpb.KeyValue{Key: []byte(ly.Node("b", "n1")), ModRevision: 7}}
	if c, region := m.apply(gone, nil, ds); c != changedRegistration || region != "b" {
		t.Fatalf("a registration deleted at 7, before the read at 10: told %v of region %q, want a registration of b", c, region)
	}
	report := &clientv3.Event{Type: clientv3.EventTypePut, Kv: &mvccpb.KeyValue{Key: []byte(ly.DemandShard("b", "n1", 3)), Value: []byte("{}"), ModRevision: 8}}
	if c, _ := m.apply(report, nil, ds); c != changedDemand || m.demand["b"] != nil || m.rev != 10 {
		t.Fatalf("a demand shard written at 8, before the read at 10: told %v, kept %v, copy at %d; want told, not kept, at 10", c, m.demand["b"], m.rev)
	}
}

// TestAckLagFollowsAcknowledgements: the acknowledgement lag kept from
// the copy's changes follows a node's acknowledgements, which change
// neither an allocation nor a registration, as a read counted afresh
// does.
func TestAckLagFollowsAcknowledgements(t *testing.T) {
	r, l := newRecords(t, 4)
	ly, p := r.ly, r.pols[0]
	for _, region := range testRegions[:3] {
		r.put(ly.Node(region, "n1"), etcdlayout.Registration{Region: region, Node: "n1"})
	}
	r.put(ly.Alloc(p), etcdlayout.Allocation{Policy: p, Epoch: 100, Phase: etcdlayout.PhaseStable,
		Default: map[string]float64{"a": 0.4, "b": 0.3, "c": 0.3}, Safe: map[string]float64{"a": 0, "b": 0, "c": 0}})
	k, err := l.keep(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer k.stop()
	ds := newDirtySet()
	kept, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	for epoch := uint64(95); epoch <= 100; epoch++ {
		r.put(ly.AckShard("a", "n1", etcdlayout.PolicyShard(p)), etcdlayout.Ack{Region: "a", Node: "n1", Epochs: map[string]uint64{p: epoch}})
		what := fmt.Sprintf("region a acknowledged epoch %d", epoch)
		fromKept, fromRead := keptLikeRead(t, what, l, k, ds)
		sameLag(t, what, kept, fromKept, fromRead)
		if got := kept.lagOf[p]["a"]; got != 100-epoch {
			t.Fatalf("%s: region a lags %d epochs of %s, want %d", what, got, p, 100-epoch)
		}
	}
}
