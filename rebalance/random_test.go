package rebalance

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/quotacoord/quota/internal/coordinator/coordtest"
	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/invariant"
)

// TestRandomDemandRestartsAndFailover drives random demand, lazy
// acknowledgements, node restarts (region a runs two nodes) and a coordinator replaced while a
// shrink may be pending, then replays etcd's history: the shares a region
// may be enforcing never sum above 1 + ε.
func TestRandomDemandRestartsAndFailover(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 7))
	e := newEnv(t, "a", "b", "c")
	ctx := context.Background()
	// Region a runs a second node, which reports, acknowledges and
	// restarts on its own.
	a2 := coordtest.NewNode(e.cli, e.layout, "a", "node-1")
	if err := a2.Register(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a2.Kill)
	e.regions["a/node-1"] = a2
	cli1 := e.srv.Client(t)
	l, stop := startLoop(t, Config{Client: cli1, Name: "c1", SkewMargin: 100 * time.Millisecond})
	waitLeader(t, l)
	const steps = 14
	for step := range steps {
		offered := map[string]float64{}
		for n := range e.regions {
			if rng.Float64() < 0.7 {
				offered[n] = rng.Float64() * 20
			}
		}
		e.demand(t, offered)
		for n, r := range e.regions {
			switch x := rng.Float64(); {
			case x < 0.1:
				if err := r.Stop(ctx); err != nil {
					t.Fatal(err)
				}
				if err := r.Register(ctx, time.Second); err != nil {
					t.Fatal(err)
				}
				t.Logf("step %d: region %s restarted", step, n)
			case x < 0.75:
				if _, err := r.AckLatest(ctx); err != nil {
					t.Fatal(err)
				}
			}
		}
		if step == steps/2 {
			// Kill the leader mid-protocol; a fresh coordinator takes over.
			_ = cli1.Close()
			stop()
			l, _ = startLoop(t, Config{Client: e.srv.Client(t), Name: "c2", SkewMargin: 100 * time.Millisecond})
			waitLeader(t, l)
			t.Logf("step %d: coordinator replaced", step)
		}
		if _, err := l.RebalanceNow(ctx); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
	}
	// Liveness: once every node acknowledges, the protocol settles on
	// the demand; two opposite demands make sure shares move (the random
	// steps above run faster than a skew margin and may leave a shrink
	// pending throughout).
	for _, hot := range []string{"a", "c"} {
		offered := map[string]float64{"a": 1, "a/node-1": 1, "b": 1, "c": 1}
		offered[hot] = 20
		settle(t, e, l, offered)
	}
	rep := checkInvariant(t, e)
	t.Logf("replayed %d revisions, %d epochs, %d acks; max Σ-ε %.6f", rep.Revisions, rep.Epochs, rep.Acks, rep.MaxSum)
	if rep.Epochs < 3 {
		t.Errorf("only %d epochs published: nothing moved", rep.Epochs)
	}
}

// settle reports offered, then acknowledges and runs rounds until one
// publishes nothing and waits for nothing over a stable allocation.
func settle(t *testing.T, e *env, l *Loop, offered map[string]float64) {
	t.Helper()
	ctx := context.Background()
	e.demand(t, offered)
	waitFor(t, "the allocation to settle", 15*time.Second, func() bool {
		for _, r := range e.regions {
			if _, err := r.AckLatest(ctx); err != nil {
				t.Fatal(err)
			}
		}
		res, err := l.RebalanceNow(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return len(res.Published) == 0 && len(res.Waiting) == 0 && e.alloc(t).Phase == etcdlayout.PhaseStable
	})
}

// TestNaiveProtocolBreaksTheInvariant shows what the two-step protocol
// prevents, and that the checker can fail: publishing growth before the
// shrinking regions acknowledged lets the shares sum above 1.
func TestNaiveProtocolBreaksTheInvariant(t *testing.T) {
	e := newEnv(t, "a", "b", "c")
	ctx := context.Background()
	l, _ := startLoop(t, Config{Client: e.cli, Name: "c1", Protocol: ProtocolNaive})
	waitLeader(t, l)
	e.demand(t, map[string]float64{"a": 5, "b": 5, "c": 5})
	roundStable(t, e, l)
	for _, r := range e.regions {
		if _, err := r.AckLatest(ctx); err != nil {
			t.Fatal(err)
		}
	}
	e.demand(t, map[string]float64{"a": 10})
	if _, err := l.RebalanceNow(ctx); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	rep, err := invariant.Replay(rctx, e.cli, e.layout)
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK() {
		t.Fatalf("naive publish without acknowledgements passed the checker: %+v", rep)
	}
	t.Logf("first violation: %v", rep.Violations[0])
}
