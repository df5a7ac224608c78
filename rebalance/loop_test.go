package rebalance

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/quotacoord/quota/internal/clock"
	"github.com/quotacoord/quota/internal/coordinator/coordtest"
	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/etcdtest"
	"github.com/quotacoord/quota/internal/invariant"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

const exportsDoc = `policies:
  - name: exports
    capacity: 50
    rate: 600/minute
    min_share:
      default: 0.05
`

type env struct {
	srv     *etcdtest.Server
	cli     *clientv3.Client
	layout  etcdlayout.Layout
	regions map[string]*coordtest.Region
}

func newEnv(t *testing.T, names ...string) *env {
	t.Helper()
	srv := etcdtest.Start(t)
	e := &env{srv: srv, cli: srv.Client(t), regions: map[string]*coordtest.Region{}}
	ctx := context.Background()
	if err := coordtest.PutPolicy(ctx, e.cli, e.layout, "exports.yaml", []byte(exportsDoc)); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		r := coordtest.NewRegion(e.cli, e.layout, n)
		if err := r.Register(ctx, time.Second); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.Kill)
		e.regions[n] = r
	}
	// Even demand before any leader starts, so its first round sees every
	// report.
	even := map[string]float64{}
	for _, n := range names {
		even[n] = 5
	}
	e.demand(t, even)
	return e
}

// startLoop runs a Loop until the test ends; setup runs before Run.
func startLoop(t *testing.T, cfg Config, setup ...func(*Loop)) (*Loop, context.CancelFunc) {
	t.Helper()
	if cfg.Interval == 0 {
		cfg.Interval = time.Hour // rounds are driven by RebalanceNow
	}
	if cfg.SessionTTL == 0 {
		cfg.SessionTTL = time.Second
	}
	cfg.Registerer = prometheus.NewRegistry()
	cfg.Logger = hclog.New(&hclog.LoggerOptions{Name: cfg.Name, Output: testWriter{t}, Level: hclog.Debug})
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range setup {
		f(l)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return l, cancel
}

// autoAck makes rs acknowledge every allocation as soon as it is
// published, until the test ends.
func autoAck(t *testing.T, rs ...*coordtest.Region) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var waits []func()
	for _, r := range rs {
		waits = append(waits, r.AutoAck(ctx))
	}
	t.Cleanup(func() {
		cancel()
		for _, wait := range waits {
			wait()
		}
	})
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (e *env) alloc(t *testing.T) etcdlayout.Allocation {
	t.Helper()
	as, err := coordtest.Allocations(context.Background(), e.cli, e.layout)
	if err != nil {
		t.Fatal(err)
	}
	return as["exports"]
}

// epoch finds a published epoch of exports in etcd's history.
func (e *env) epoch(t *testing.T, epoch uint64) etcdlayout.Allocation {
	t.Helper()
	ctx := context.Background()
	var rev int64
	for {
		var opts []clientv3.OpOption
		if rev > 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := e.cli.Get(ctx, e.layout.Alloc("exports"), opts...)
		if err != nil || len(resp.Kvs) == 0 {
			t.Fatalf("epoch %d not in history: %v", epoch, err)
		}
		var a etcdlayout.Allocation
		if err := json.Unmarshal(resp.Kvs[0].Value, &a); err != nil {
			t.Fatal(err)
		}
		if a.Epoch <= epoch {
			if a.Epoch != epoch {
				t.Fatalf("epoch %d never published (found %d)", epoch, a.Epoch)
			}
			return a
		}
		rev = resp.Kvs[0].ModRevision - 1
	}
}

// demand makes every region report offered load (cost/s) for exports.
func (e *env) demand(t *testing.T, offered map[string]float64) {
	t.Helper()
	for n, r := range e.regions {
		d := etcdlayout.PolicyDemand{Offered: offered[n], Admitted: offered[n]}
		if err := r.Report(context.Background(), time.Second, map[string]etcdlayout.PolicyDemand{"exports": d}); err != nil {
			t.Fatal(err)
		}
	}
}

// roundStable runs a round and waits until its growth (if any) is out.
func roundStable(t *testing.T, e *env, l *Loop) etcdlayout.Allocation {
	t.Helper()
	if _, err := l.RebalanceNow(context.Background()); err != nil {
		t.Fatalf("RebalanceNow: %v", err)
	}
	var a etcdlayout.Allocation
	waitFor(t, "a stable allocation", 10*time.Second, func() bool {
		a = e.alloc(t)
		return a.Phase == etcdlayout.PhaseStable
	})
	return a
}

// head is etcd's current revision.
func head(t *testing.T, e *env) int64 {
	t.Helper()
	resp, err := e.cli.Get(context.Background(), e.layout.Settings(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

func waitLeader(t *testing.T, l *Loop) {
	t.Helper()
	waitFor(t, "leadership", 15*time.Second, l.IsLeader)
}

func checkInvariant(t *testing.T, e *env) invariant.Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rep, err := invariant.Replay(ctx, e.cli, e.layout)
	if err != nil {
		t.Fatalf("replay: %v", err)
	}
	for _, v := range rep.Violations {
		t.Errorf("invariant: %v", v)
	}
	if rep.Epochs == 0 {
		t.Errorf("replay saw no epochs")
	}
	return rep
}

func TestDemandMovesSharesWithinFiveRounds(t *testing.T) {
	e := newEnv(t, "a", "b", "c")
	ctx, cancel := context.WithCancel(context.Background())
	for _, r := range e.regions {
		defer r.AutoAck(ctx)()
	}
	defer cancel()
	l, _ := startLoop(t, Config{Client: e.cli, Name: "c1"})
	waitLeader(t, l)
	e.demand(t, map[string]float64{"a": 5, "b": 5, "c": 5})
	// The leader's first round may have seen only some reports: settle.
	a := roundStable(t, e, l)
	for i := 0; i < 5 && math.Abs(a.Default["a"]-1.0/3) > 1e-9; i++ {
		a = roundStable(t, e, l)
	}
	for _, r := range []string{"a", "b", "c"} {
		if math.Abs(a.Default[r]-1.0/3) > 1e-9 {
			t.Fatalf("even demand: share of %s = %v, want 1/3 (%v)", r, a.Default[r], a.Default)
		}
	}
	for _, hot := range []string{"a", "b"} {
		e.demand(t, map[string]float64{hot: 10})
		rounds := 0
		for rounds = 1; rounds <= 5; rounds++ {
			a = roundStable(t, e, l)
			if a.Default[hot] > 0.8 {
				break
			}
		}
		if a.Default[hot] <= 0.8 {
			t.Fatalf("demand only in %s: share %v after 5 rounds (%v)", hot, a.Default[hot], a.Default)
		}
		t.Logf("demand in %s: share %.3f after %d rounds", hot, a.Default[hot], rounds)
	}
	checkInvariant(t, e)
}

func TestGrowthWaitsForEveryAck(t *testing.T) {
	e := newEnv(t, "a", "b", "c")
	ctx := context.Background()
	l, _ := startLoop(t, Config{Client: e.cli, Name: "c1", SkewMargin: 200 * time.Millisecond})
	waitLeader(t, l)
	e.demand(t, map[string]float64{"a": 5, "b": 5, "c": 5})
	first := roundStable(t, e, l)
	for _, r := range e.regions {
		if _, err := r.AckLatest(ctx); err != nil {
			t.Fatal(err)
		}
	}
	e.demand(t, map[string]float64{"a": 10})
	if _, err := l.RebalanceNow(ctx); err != nil {
		t.Fatal(err)
	}
	shrink := e.alloc(t)
	if shrink.Phase != etcdlayout.PhaseShrink || shrink.Epoch != first.Epoch+1 || shrink.Target == nil {
		t.Fatalf("want shrink epoch %d with a target, got %+v", first.Epoch+1, shrink)
	}
	for r, s := range shrink.Default {
		if want := math.Min(first.Default[r], shrink.Target.Default[r]); math.Abs(s-want) > 1e-12 {
			t.Errorf("shrink share of %s = %v, want min(%v, %v)", r, s, first.Default[r], shrink.Target.Default[r])
		}
	}
	// Two of three acknowledge: no growth, however often we ask.
	for _, n := range []string{"a", "b"} {
		if err := e.regions[n].Ack(ctx, "exports", shrink.Epoch); err != nil {
			t.Fatal(err)
		}
	}
	res, err := l.RebalanceNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Waiting) != 1 || len(res.Published) != 0 {
		t.Fatalf("want waiting, got %+v", res)
	}
	time.Sleep(200 * time.Millisecond)
	if got := e.alloc(t); got.Epoch != shrink.Epoch {
		t.Fatalf("grew before every ack: %+v", got)
	}
	if err := e.regions["c"].Ack(ctx, "exports", shrink.Epoch); err != nil {
		t.Fatal(err)
	}
	// The growth; the round owed since the waiting one may follow it at
	// once with a plan of its own.
	waitFor(t, "growth after the last ack", 5*time.Second, func() bool {
		return e.alloc(t).Epoch > shrink.Epoch
	})
	grown := e.epoch(t, shrink.Epoch+1)
	if grown.Phase != etcdlayout.PhaseStable || grown.Default["a"] != shrink.Target.Default["a"] {
		t.Fatalf("growth %+v, want the target %v", grown, shrink.Target.Default)
	}
	checkInvariant(t, e)
}

func TestSilentRegionCountsAtSafeOnlyAfterSkewMargin(t *testing.T) {
	e := newEnv(t, "a", "b", "c")
	ctx := context.Background()
	clk := clock.NewManual(time.Unix(1_700_000_000, 0))
	l, _ := startLoop(t, Config{Client: e.cli, Name: "c1", Clock: clk, SkewMargin: 5 * time.Second})
	waitLeader(t, l)
	e.demand(t, map[string]float64{"a": 5, "b": 5, "c": 5})
	roundStable(t, e, l)
	for _, r := range e.regions {
		if _, err := r.AckLatest(ctx); err != nil {
			t.Fatal(err)
		}
	}
	e.regions["c"].Kill()
	waitFor(t, "c's lease to expire", 10*time.Second, func() bool {
		resp, err := e.cli.Get(ctx, e.layout.RegionNodes("c"), clientv3.WithPrefix())
		return err == nil && len(resp.Kvs) == 0
	})
	delete(e.regions, "c")
	e.demand(t, map[string]float64{"a": 10})
	if _, err := l.RebalanceNow(ctx); err != nil {
		t.Fatal(err)
	}
	shrink := e.alloc(t)
	if shrink.Phase != etcdlayout.PhaseShrink {
		t.Fatalf("want a shrink, got %+v", shrink)
	}
	if shrink.Target.Default["c"] != shrink.Safe["c"] {
		t.Errorf("dead region's target %v, want its safe share %v", shrink.Target.Default["c"], shrink.Safe["c"])
	}
	for _, n := range []string{"a", "b"} {
		if err := e.regions[n].Ack(ctx, "exports", shrink.Epoch); err != nil {
			t.Fatal(err)
		}
	}
	clk.Advance(4 * time.Second)
	res, err := l.RebalanceNow(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := e.alloc(t); got.Epoch != shrink.Epoch || len(res.Waiting) != 1 {
		t.Fatalf("grew before the skew margin passed: %+v %+v", got, res)
	}
	clk.Advance(2 * time.Second)
	if _, err := l.RebalanceNow(ctx); err != nil {
		t.Fatal(err)
	}
	// The growth may come from this round or from an acknowledgement
	// round just before it (which a later round may already follow).
	if got := e.epoch(t, shrink.Epoch+1); got.Phase != etcdlayout.PhaseStable || got.Default["a"] != shrink.Target.Default["a"] {
		t.Fatalf("no growth after TTL + skew margin: %+v", got)
	}
	checkInvariant(t, e)
}

func TestDeposedLeaderCannotPublish(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	l, err := New(Config{Client: e.cli, Name: "old"})
	if err != nil {
		t.Fatal(err)
	}
	s1, err := concurrency.NewSession(e.cli, concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	defer s1.Close()
	el1 := concurrency.NewElection(s1, e.layout.Election())
	if err := el1.Campaign(ctx, "old"); err != nil {
		t.Fatal(err)
	}
	old := fence{key: el1.Key(), rev: el1.Rev()}
	a := &etcdlayout.Allocation{Policy: "exports", Epoch: 1, Phase: etcdlayout.PhaseStable, Default: map[string]float64{"a": 1}}
	if ok, err := l.publish(ctx, old, a, 0, head(t, e)); !ok || err != nil {
		t.Fatalf("leader publish: %v %v", ok, err)
	}
	// The old leader's session expires (revoked here) and another wins.
	if _, err := e.cli.Revoke(ctx, s1.Lease()); err != nil {
		t.Fatal(err)
	}
	s2, err := concurrency.NewSession(e.cli, concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	el2 := concurrency.NewElection(s2, e.layout.Election())
	if err := el2.Campaign(ctx, "new"); err != nil {
		t.Fatal(err)
	}
	cur := e.alloc(t)
	resp, _ := e.cli.Get(ctx, e.layout.Alloc("exports"))
	b := &etcdlayout.Allocation{Policy: "exports", Epoch: 2, Phase: etcdlayout.PhaseStable, Default: map[string]float64{"a": 0.5}}
	ok, err := l.publish(ctx, old, b, resp.Kvs[0].ModRevision, resp.Header.Revision)
	if ok || !errors.Is(err, ErrNotLeader) {
		t.Fatalf("deposed publish: ok=%v err=%v, want ErrNotLeader", ok, err)
	}
	if got := e.alloc(t); got.Epoch != cur.Epoch {
		t.Fatalf("deposed leader's write landed: %+v", got)
	}
	if err := l.publishSettings(ctx, old); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("deposed settings write: %v", err)
	}
}

func TestNewLeaderFinishesPendingShrink(t *testing.T) {
	e := newEnv(t, "a", "b", "c")
	ctx := context.Background()
	cli1 := e.srv.Client(t)
	l1, stop1 := startLoop(t, Config{Client: cli1, Name: "c1", SkewMargin: 200 * time.Millisecond})
	waitLeader(t, l1)
	l2, _ := startLoop(t, Config{Client: e.cli, Name: "c2", SkewMargin: 200 * time.Millisecond})
	e.demand(t, map[string]float64{"a": 5, "b": 5, "c": 5})
	roundStable(t, e, l1)
	for _, r := range e.regions {
		if _, err := r.AckLatest(ctx); err != nil {
			t.Fatal(err)
		}
	}
	e.demand(t, map[string]float64{"b": 10})
	if _, err := l1.RebalanceNow(ctx); err != nil {
		t.Fatal(err)
	}
	shrink := e.alloc(t)
	if shrink.Phase != etcdlayout.PhaseShrink {
		t.Fatalf("want a pending shrink, got %+v", shrink)
	}
	// Kill c1: its client dies without resigning; its session lease expires.
	_ = cli1.Close()
	stop1()
	waitLeader(t, l2)
	for _, r := range e.regions {
		if err := r.Ack(ctx, "exports", shrink.Epoch); err != nil {
			t.Fatal(err)
		}
	}
	// The growth; the new leader's first round, which waited on the
	// shrink, is owed and may follow it at once with a plan of its own.
	waitFor(t, "the new leader to publish the growth", 10*time.Second, func() bool {
		return e.alloc(t).Epoch > shrink.Epoch
	})
	grown := e.epoch(t, shrink.Epoch+1)
	if grown.Phase != etcdlayout.PhaseStable {
		t.Fatalf("after failover got %+v, want stable epoch %d", grown, shrink.Epoch+1)
	}
	for r, s := range shrink.Target.Default {
		if grown.Default[r] != s {
			t.Errorf("region %s: grown %v, want the pending target %v", r, grown.Default[r], s)
		}
	}
	checkInvariant(t, e)
}
