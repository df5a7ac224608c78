package rebalance

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/quotacoord/quota/internal/coordinator/coordtest"
	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/etcdtest"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestRoundPlansOnlyWhatChanged: once every policy has settled, the full
// rounds after one policy's demand changed in one region plan that policy
// alone; a node that registers makes the next full round plan every
// policy; and what was published keeps the invariant.
func TestRoundPlansOnlyWhatChanged(t *testing.T) {
	const policies = 20
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	var ly etcdlayout.Layout
	ctx := context.Background()
	var doc strings.Builder
	doc.WriteString("policies:\n")
	for i := range policies {
		fmt.Fprintf(&doc, "  - name: p%02d\n    capacity: 100\n    rate: 100/second\n", i)
	}
	if err := coordtest.PutPolicy(ctx, cli, ly, "many.yaml", []byte(doc.String())); err != nil {
		t.Fatal(err)
	}
	regions := map[string]*coordtest.Region{}
	report := func(hot string) {
		t.Helper()
		for name, r := range regions {
			ds := map[string]etcdlayout.PolicyDemand{}
			for i := range policies {
				p := fmt.Sprintf("p%02d", i)
				offered := 10.0
				if p == hot && name == "a" {
					offered = 40
				}
				ds[p] = etcdlayout.PolicyDemand{Offered: offered, Admitted: offered}
			}
			if err := r.Report(ctx, time.Second, ds); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, name := range []string{"a", "b"} {
		r := coordtest.NewRegion(cli, ly, name)
		if err := r.Register(ctx, time.Second); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.Kill)
		autoAck(t, r)
		regions[name] = r
	}
	report("")

	rounds := make(chan []string, 1024)
	l, _ := startLoop(t, Config{Client: cli, Name: "c1", Interval: 100 * time.Millisecond, SkewMargin: 100 * time.Millisecond, FullEvery: 1000},
		func(l *Loop) {
			l.afterPlan = func(kind roundKind, planned []string) {
				if kind == roundChanged {
					select {
					case rounds <- planned:
					default:
					}
				}
			}
		})
	waitLeader(t, l)
	// next returns the policies planned by the next full round on what
	// changed that planned any (or none, when quiet).
	next := func(what string, quiet bool) []string {
		t.Helper()
		deadline := time.After(15 * time.Second)
		for {
			select {
			case p := <-rounds:
				if quiet == (len(p) == 0) {
					return p
				}
			case <-deadline:
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	next("every policy to settle", true)

	report("p07")
	if got := next("a round after p07's demand changed", false); !slices.Equal(got, []string{"p07"}) {
		t.Fatalf("after p07's demand changed in one region the round planned %d policies %v, want [p07]", len(got), got)
	}
	// Until quiet again, p07 alone: its smoothed demand settles and its
	// growth follows its shrink.
	for quiet := false; !quiet; {
		select {
		case got := <-rounds:
			if quiet = len(got) == 0; !quiet && !slices.Equal(got, []string{"p07"}) {
				t.Fatalf("while p07 settles a round planned %v, want [p07]", got)
			}
		case <-time.After(15 * time.Second):
			t.Fatal("timed out waiting for p07 to settle")
		}
	}

	n2 := coordtest.NewNode(cli, ly, "a", "n2")
	if err := n2.Register(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n2.Kill)
	autoAck(t, n2)
	if got := next("a round after a node registered", false); len(got) != policies {
		t.Fatalf("after a node registered the round planned %d policies %v, want all %d", len(got), got, policies)
	}
	checkInvariant(t, &env{srv: srv, cli: cli, layout: ly})
}

// TestDemandChangedLeavesJitterOut: a demand shard rewritten because one
// policy's demand moved marks that policy, not a neighbour of its shard
// whose rate moved within etcdlayout.DemandTolerance; a shard deleted
// marks its policies.
func TestDemandChangedLeavesJitterOut(t *testing.T) {
	var ly etcdlayout.Layout
	moving := "p0"
	steady := ""
	for i := 1; steady == ""; i++ {
		if p := fmt.Sprintf("p%d", i); etcdlayout.PolicyDemandShard(p) == etcdlayout.PolicyDemandShard(moving) {
			steady = p
		}
	}
	shard := etcdlayout.PolicyDemandShard(moving)
	kv := func(rev int64, moved, jittered float64) *mvccpb.KeyValue {
		v, _ := json.Marshal(etcdlayout.DemandReport{Region: "a", Node: "n", Policies: map[string]etcdlayout.PolicyDemand{
			moving: {Offered: moved, Admitted: moved}, steady: {Offered: jittered, Admitted: jittered}}})
		return &mvccpb.KeyValue{Key: []byte(ly.DemandShard("a", "n", shard)), Value: v, ModRevision: rev}
	}
	ds := newDirtySet()
	m := newMirror(ly, hclog.NewNullLogger())
	m.apply(&clientv3.Event{Type: clientv3.EventTypePut, Kv: kv(1, 100, 100)}, nil, ds)
	ds.all = false
	m.apply(&clientv3.Event{Type: clientv3.EventTypePut, Kv: kv(2, 150, 103)}, nil, ds)
	if !ds.policies[moving] || ds.policies[steady] || len(ds.policies) != 1 {
		t.Fatalf("after %s moved by half and %s by 3%%, marked %v, want only %s", moving, steady, ds.policies, moving)
	}
	m.apply(&clientv3.Event{Type: clientv3.EventTypeDelete, Kv: &mvccpb.KeyValue{Key: kv(3, 0, 0).Key, ModRevision: 3}}, nil, ds)
	if !ds.policies[steady] {
		t.Fatalf("a deleted shard left %s unmarked: %v", steady, ds.policies)
	}
}

// TestAcknowledgementsCoalesce: nineteen acknowledgements that arrive
// while a round runs are read by one round, not one round each.
func TestAcknowledgementsCoalesce(t *testing.T) {
	e := newEnv(t, "a", "b")
	ctx := context.Background()
	var hold atomic.Bool
	held := make(chan struct{})
	release := make(chan struct{})
	var acks atomic.Int32
	l, _ := startLoop(t, Config{Client: e.cli, Name: "c1"}, func(l *Loop) {
		l.afterRead = func() {
			if hold.CompareAndSwap(true, false) {
				close(held)
				<-release
			}
		}
		l.afterPlan = func(kind roundKind, _ []string) {
			if kind == roundAcks {
				acks.Add(1)
			}
		}
	})
	waitLeader(t, l)
	roundStable(t, e, l)
	time.Sleep(200 * time.Millisecond) // the first allocation's acknowledgements
	acks.Store(0)
	hold.Store(true)
	if err := e.regions["a"].Ack(ctx, "exports", 100); err != nil {
		t.Fatal(err)
	}
	<-held // a round runs and waits
	for i := range 19 {
		if err := e.regions["a"].Ack(ctx, "exports", uint64(101+i)); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(300 * time.Millisecond) // delivered to the loop's watch
	close(release)
	time.Sleep(time.Second)
	if n := acks.Load(); n < 2 || n > 4 {
		t.Fatalf("20 acknowledgements, 19 of them written while a round ran: %d acknowledgement rounds, want 2 to 4", n)
	}
}
