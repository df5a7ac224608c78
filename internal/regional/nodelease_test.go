package regional

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/boundcheck"
	"github.com/quotacoord/quota/internal/clock"
	"github.com/quotacoord/quota/internal/policy"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

// leaseRegion is one region's shares in the node lease tests: a fixed
// share for every subject and the number of the region's nodes.
type leaseRegion struct {
	mu    sync.Mutex
	share float64
	nodes int
}

func (r *leaseRegion) Share(string, string) float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.share
}
func (r *leaseRegion) Ready() bool { return true }
func (r *leaseRegion) Nodes() int  { return r.nodes }

func (r *leaseRegion) setShare(f float64) {
	r.mu.Lock()
	r.share = f
	r.mu.Unlock()
}

// leaseStore is a region's store (an in-process bucket.Memory standing
// for its Redis) that counts the calls a node makes to it.
type leaseStore struct {
	*bucket.Memory
	takes, leases atomic.Int64
}

func (s *leaseStore) TakeAll(ctx context.Context, reqs []bucket.Request) ([]bucket.Decision, error) {
	s.takes.Add(1)
	return s.Memory.TakeAll(ctx, reqs)
}

func (s *leaseStore) Lease(ctx context.Context, q bucket.LeaseRequest) (bucket.Lease, error) {
	s.leases.Add(1)
	return s.Memory.Lease(ctx, q)
}

func (s *leaseStore) Release(ctx context.Context, q bucket.LeaseRelease) (bucket.Lease, error) {
	s.leases.Add(1)
	return s.Memory.Release(ctx, q)
}

const leasePolicies = `
policies:
  - name: hot
    capacity: 60
    rate: 30/s
    lease: {fraction: 1, ttl: 2s}
  - name: plain
    capacity: 60
    rate: 30/s
`

// newLeaseNode builds a node of region r on store, on clk, with the
// policies of leasePolicies.
func newLeaseNode(t testing.TB, clk clock.Clock, store bucket.Store, r *leaseRegion) *Node {
	t.Helper()
	n, err := New(Config{Region: "r", Store: store, Local: memoryStore(t, clk), Shares: r, Clock: clk,
		Registerer: prometheus.NewRegistry(), NodeLeaseHot: 5})
	if err != nil {
		t.Fatal(err)
	}
	set, err := policy.Parse("p.yaml", []byte(leasePolicies))
	if err != nil {
		t.Fatal(err)
	}
	n.SetPolicies(set)
	return n
}

func leaseCheck(t testing.TB, n *Node, subject string, cost int64, policies ...string) *quotav1.CheckResponse {
	t.Helper()
	resp, err := (&admission{n: n}).Check(context.Background(), &quotav1.CheckRequest{Subject: subject, Policies: policies, Cost: cost})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestNodeLeaseHotSubject: a subject checked 100 times a second turns hot,
// is leased, and is then decided without the store (a renewal every TTL/2
// is the only store call); what the node admits stays within C + r·W and
// close to the budget; a cold subject keeps going to the store.
func TestNodeLeaseHotSubject(t *testing.T) {
	clk := clock.NewManual(time.Unix(1_800_000_000, 0))
	store := &leaseStore{Memory: memoryStore(t, clk)}
	n := newLeaseNode(t, clk, store, &leaseRegion{share: 1, nodes: 1})
	var adms []boundcheck.Admission
	const step = 10 * time.Millisecond
	start := clk.Now()
	var takesAfter int64
	for i := 0; i < 1000; i++ { // 10 s at 100/s, 3.3× the rate
		if i == 100 {
			takesAfter = store.takes.Load()
		}
		if r := leaseCheck(t, n, "t1", 1, "hot"); r.Allowed {
			adms = append(adms, boundcheck.Admission{Policy: "hot", Subject: "t1", Region: "r", At: clk.Now(), Cost: 1})
		}
		clk.Advance(step)
	}
	took := store.takes.Load() - takesAfter
	if took > 0 {
		t.Errorf("%d store takes after the first second: want none (decided from the lease)", took)
	}
	if l := store.leases.Load(); l > 20 {
		t.Errorf("%d lease calls in 10 s at TTL 2s: want a renewal per second at most", l)
	}
	hot, _ := n.Policies().Get("hot")
	rep, err := boundcheck.Check(boundcheck.Config{Limits: map[string]bucket.Limits{"hot": hot.Limits}}, adms)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Violations) > 0 {
		t.Fatalf("over the bound: %v", rep.Violations[0])
	}
	ideal := 60 + 30*clk.Now().Sub(start).Seconds()
	if got := float64(len(adms)); got < 0.8*ideal {
		t.Errorf("admitted %v, want at least 80%% of the ideal %v", got, ideal)
	}
	t.Logf("admitted %d of ideal %.0f, peak %.3f, lease calls %d", len(adms), ideal, rep.Peak, store.leases.Load())

	// A cold subject still goes to the store.
	before := store.takes.Load()
	leaseCheck(t, n, "cold", 1, "hot")
	if store.takes.Load() != before+1 {
		t.Fatal("a cold subject's check did not reach the store")
	}
}
