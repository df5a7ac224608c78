package regional

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/boundcheck"
	"github.com/quotacoord/quota/internal/clock"
	"github.com/quotacoord/quota/internal/grants"
	"github.com/quotacoord/quota/internal/policy"
	"github.com/quotacoord/quota/internal/redistest"
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

// leasingStore is a store that leases: bucket.Memory or bucket.Redis.
type leasingStore interface {
	bucket.Store
	bucket.Leaser
}

// leaseStore is a region's store (Redis, or an in-process bucket.Memory
// standing for it) that counts the calls a node makes to it.
type leaseStore struct {
	leasingStore
	takes, leases, refunds atomic.Int64
}

func (s *leaseStore) Refund(ctx context.Context, req bucket.Request) (bucket.Decision, error) {
	s.refunds.Add(1)
	return s.leasingStore.Refund(ctx, req)
}

func (s *leaseStore) TakeAll(ctx context.Context, reqs []bucket.Request) ([]bucket.Decision, error) {
	s.takes.Add(1)
	return s.leasingStore.TakeAll(ctx, reqs)
}

func (s *leaseStore) Lease(ctx context.Context, q bucket.LeaseRequest) (bucket.Lease, error) {
	s.leases.Add(1)
	return s.leasingStore.Lease(ctx, q)
}

func (s *leaseStore) Release(ctx context.Context, q bucket.LeaseRelease) (bucket.Lease, error) {
	s.leases.Add(1)
	return s.leasingStore.Release(ctx, q)
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
  - name: narrow
    capacity: 10
    rate: 5/s
    lease: {fraction: 1, ttl: 2s}
`

// newLeaseNode builds a node of region r on store, on clk, with the
// policies of leasePolicies.
func newLeaseNode(t testing.TB, clk clock.Clock, store bucket.Store, r ShareSource) *Node {
	t.Helper()
	g, err := grants.Parse("g", []byte("default: [{actions: [check, refund], policies: ['*']}]"))
	if err != nil {
		t.Fatal(err)
	}
	n, err := New(Config{Region: "r", Store: store, Local: memoryStore(t, clk), Shares: r, Clock: clk,
		Registerer: prometheus.NewRegistry(), NodeLeaseHot: 5, Grants: g})
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
	store := &leaseStore{leasingStore: memoryStore(t, clk)}
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

// heatUp checks subject at 100/s for a second on n so that its leasable
// policies get leases.
func heatUp(t *testing.T, clk *clock.Manual, n *Node, subject string, policies ...string) {
	t.Helper()
	for i := 0; i < 100; i++ {
		leaseCheck(t, n, subject, 1, policies...)
		clk.Advance(10 * time.Millisecond)
	}
}

// leaseOf returns n's lease of policy for subject, nil when none.
func leaseOf(t *testing.T, n *Node, policyName, subject string) *nodeLease {
	t.Helper()
	p, _ := n.Policies().Get(policyName)
	key, err := bucket.NewKey(p.Name, p.KeyVersion(), subject)
	if err != nil {
		t.Fatal(err)
	}
	n.leases.mu.RLock()
	defer n.leases.mu.RUnlock()
	return n.leases.leased[key]
}

// remaining peeks e's tokens at now.
func (e *nodeLease) remaining(now time.Time) float64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	d, _ := e.st.TakeAt(now, &e.prep, 1, 0)
	return d.Remaining
}

// TestNodeLeaseMultiPolicy: a check naming a leased and an unleasable
// policy always goes to the store; one naming two leased policies is
// decided from both leases all or nothing: a denial by one charges the
// other nothing.
func TestNodeLeaseMultiPolicy(t *testing.T) {
	clk := clock.NewManual(time.Unix(1_800_000_000, 0))
	store := &leaseStore{leasingStore: memoryStore(t, clk)}
	n := newLeaseNode(t, clk, store, &leaseRegion{share: 1, nodes: 1})

	heatUp(t, clk, n, "mixed", "hot", "plain")
	before := store.takes.Load()
	leaseCheck(t, n, "mixed", 1, "hot", "plain")
	if store.takes.Load() != before+1 {
		t.Fatal("a check with an unleased policy was not sent to the store")
	}

	heatUp(t, clk, n, "both", "hot", "narrow")
	hot, narrow := leaseOf(t, n, "hot", "both"), leaseOf(t, n, "narrow", "both")
	if hot == nil || narrow == nil {
		t.Fatalf("leases after a hot second: hot %v narrow %v", hot != nil, narrow != nil)
	}
	before = store.takes.Load()
	// Spend narrow's lease, then check once more at the same instant.
	for narrow.remaining(clk.Now()) >= 1 {
		if r := leaseCheck(t, n, "both", 1, "hot", "narrow"); !r.Allowed {
			t.Fatal("denied while both leases hold tokens")
		}
	}
	h0 := hot.remaining(clk.Now())
	r := leaseCheck(t, n, "both", 1, "hot", "narrow")
	if r.Allowed || r.DecidedBy != "narrow" {
		t.Fatalf("allowed %v decided by %q, want a denial by narrow", r.Allowed, r.DecidedBy)
	}
	if h1 := hot.remaining(clk.Now()); h1 != h0 {
		t.Fatalf("hot's lease went from %v to %v on a check narrow denied", h0, h1)
	}
	if store.takes.Load() != before {
		t.Fatalf("%d store takes for checks decided from leases", store.takes.Load()-before)
	}
}

// TestNodeLeaseRefund: a charge decided from a lease is refunded into
// the lease, not into the region's bucket.
func TestNodeLeaseRefund(t *testing.T) {
	clk := clock.NewManual(time.Unix(1_800_000_000, 0))
	store := &leaseStore{leasingStore: memoryStore(t, clk)}
	n := newLeaseNode(t, clk, store, &leaseRegion{share: 1, nodes: 1})
	heatUp(t, clk, n, "r", "hot")
	e := leaseOf(t, n, "hot", "r")
	if e == nil {
		t.Fatal("no lease after a hot second")
	}
	leaseCheck(t, n, "r", 3, "hot")
	was := e.remaining(clk.Now())
	resp, err := (&admission{n: n}).Refund(context.Background(), &quotav1.RefundRequest{Charges: []*quotav1.Charge{{Policy: "hot", Subject: "r", Cost: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	if !resp.Refunds[0].Refunded {
		t.Fatal("refund into a live lease not reported refunded")
	}
	if got := e.remaining(clk.Now()); got != min(was+2, float64(e.burst)) {
		t.Fatalf("lease holds %v after refunding 2 to %v (burst %d)", got, was, e.burst)
	}
	if store.refunds.Load() != 0 {
		t.Fatal("a leased charge was refunded to the region's bucket")
	}
}

// TestNodeLeaseShrink: the region's sync may acknowledge a shrink only
// after the node's leases above the new share end (HeldAbove), and a check
// at the shrunk share drops the lease and goes to the store.
func TestNodeLeaseShrink(t *testing.T) {
	clk := clock.NewManual(time.Unix(1_800_000_000, 0))
	store := &leaseStore{leasingStore: memoryStore(t, clk)}
	region := &leaseRegion{share: 1, nodes: 2}
	n := newLeaseNode(t, clk, store, region)
	heatUp(t, clk, n, "s", "hot")
	e := leaseOf(t, n, "hot", "s")
	if e == nil {
		t.Fatal("no lease after a hot second")
	}
	if e.rate > 15+1e-9 {
		t.Fatalf("lease rate %v above the node's half of the region's 30/s", e.rate)
	}
	half := func(string) float64 { return 0.5 }
	if got := n.HeldAbove("hot", half); !got.After(clk.Now()) {
		t.Fatalf("HeldAbove = %v, want the lease's end after %v", got, clk.Now())
	}
	// The region sync's gate (process.go) reports the node's leases.
	gate := &rlqsGate{}
	gate.node.Store(n)
	if got := gate.HeldAbove("hot", half); !got.Equal(n.HeldAbove("hot", half)) {
		t.Fatalf("the sync's gate reports %v, the node %v", got, n.HeldAbove("hot", half))
	}
	if got := n.HeldAbove("hot", func(string) float64 { return 1 }); !got.IsZero() {
		t.Fatalf("HeldAbove at the lease's own share = %v, want zero", got)
	}
	region.setShare(0.5)
	before := store.takes.Load()
	leaseCheck(t, n, "s", 1, "hot")
	if store.takes.Load() != before+1 {
		t.Fatal("a check at a shrunk share was decided from the old lease")
	}
	if got := n.HeldAbove("hot", half); !got.IsZero() {
		t.Fatalf("HeldAbove after the lease was dropped = %v, want zero", got)
	}
}

// TestNodeLeaseBound: 3 regions at share ⅓ × 2 nodes with node leases on,
// one subject offered 3.3× its budget (100 checks/s for r = 30/s) with
// the demand moving between regions and nodes every 3 s: what all nodes
// admit stays within C + r·W in every window, and the under-admission
// against one ideal global bucket fed the same requests is reported.
func TestNodeLeaseBound(t *testing.T) {
	clk := clock.NewManual(time.Unix(1_800_000_000, 0))
	type node struct {
		n      *Node
		region string
	}
	var nodes []node
	var stores []*leaseStore
	for r := 0; r < 3; r++ {
		store := &leaseStore{leasingStore: memoryStore(t, clk)}
		stores = append(stores, store)
		region := &leaseRegion{share: 1.0 / 3, nodes: 2}
		for k := 0; k < 2; k++ {
			nodes = append(nodes, node{n: newLeaseNode(t, clk, store, region), region: string(rune('a' + r))})
		}
	}
	hot, _ := nodes[0].n.Policies().Get("hot")
	prep, err := bucket.Prepare(hot.Limits)
	if err != nil {
		t.Fatal(err)
	}
	var ideal bucket.State
	var regional [3]bucket.State // an ideal bucket per region at its share
	var adms []boundcheck.Admission
	idealAdmitted, regionalAdmitted := 0, 0
	const step = 10 * time.Millisecond
	const steps = 6000 // 60 s
	for i := 0; i < steps; i++ {
		phase := i / 300 // 3 s
		// Two thirds of the checks to one node, a third to the next.
		target := phase % len(nodes)
		if i%3 == 2 {
			target = (phase + 1 + phase/len(nodes)) % len(nodes)
		}
		nd := nodes[target]
		if d, err := ideal.TakeAt(clk.Now(), &prep, 1, 1); err != nil {
			t.Fatal(err)
		} else if d.Allowed {
			idealAdmitted++
		}
		if d, _ := regional[target/2].TakeAt(clk.Now(), &prep, 1.0/3, 1); d.Allowed {
			regionalAdmitted++
		}
		if r := leaseCheck(t, nd.n, "t1", 1, "hot"); r.Allowed {
			adms = append(adms, boundcheck.Admission{Policy: "hot", Subject: "t1", Region: nd.region,
				Node: string(rune('0' + target)), At: clk.Now(), Cost: 1})
		}
		clk.Advance(step)
	}
	rep, err := boundcheck.Check(boundcheck.Config{Limits: map[string]bucket.Limits{"hot": hot.Limits},
		Windows: []time.Duration{100 * time.Millisecond, time.Second, 2 * time.Second, 10 * time.Second, 30 * time.Second}}, adms)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range rep.Violations {
		t.Errorf("over the bound: %v", v)
	}
	var takes, leases int64
	for _, s := range stores {
		takes += s.takes.Load()
		leases += s.leases.Load()
	}
	under := 1 - float64(len(adms))/float64(idealAdmitted)
	t.Logf("admitted %d; ideal global bucket %d: under-admission %.1f%%; ideal buckets per region at share 1/3 %d: %.1f%%; peak %.3f over %d windows; store takes %d, lease calls %d for %d checks",
		len(adms), idealAdmitted, 100*under, regionalAdmitted, 100*(1-float64(len(adms))/float64(regionalAdmitted)), rep.Peak, rep.Windows, takes, leases, steps)
	if takes+leases > steps/2 {
		t.Errorf("%d store calls for %d checks: the leases decided too few", takes+leases, steps)
	}
}

// TestNodeLeaseEnvoy: an Envoy rule with burst and lease is leased for a
// hot descriptor value, whose requests are then decided without the store.
func TestNodeLeaseEnvoy(t *testing.T) {
	clk := clock.NewManual(time.Unix(1_800_000_000, 0))
	store := &leaseStore{leasingStore: memoryStore(t, clk)}
	n, err := New(Config{Region: "r", Store: store, Local: memoryStore(t, clk), Shares: &leaseRegion{share: 1, nodes: 1},
		Clock: clk, Registerer: prometheus.NewRegistry(), NodeLeaseHot: 5, EnvoyPlainKeys: []string{"tenant"}})
	if err != nil {
		t.Fatal(err)
	}
	set, err := policy.Parse("e.yaml", []byte("domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 30, burst: 60, lease: {fraction: 1, ttl: 2s}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	n.SetPolicies(set)
	r := &rls{n: n}
	req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{desc("tenant", "e1")}}
	var takes int64
	ok := 0
	for i := 0; i < 300; i++ { // 3 s at 100/s
		if i == 100 {
			takes = store.takes.Load()
		}
		resp, err := r.ShouldRateLimit(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if i >= 100 && resp.OverallCode == rlsv3.RateLimitResponse_OK {
			ok++
		}
		clk.Advance(10 * time.Millisecond)
	}
	if got := store.takes.Load() - takes; got != 0 {
		t.Fatalf("%d store takes after the first second, want none", got)
	}
	if ok == 0 || ok > 60+2*30 {
		t.Fatalf("admitted %d in 2 s from the lease, want some and at most C + 2r = 120", ok)
	}
}

// TestNodeLeaseRedis: on real Redis and the wall clock, a hot subject is
// leased, renewed (TTL 200 ms), decided without Redis takes in between,
// and what the node admits stays within C + r·W.
func TestNodeLeaseRedis(t *testing.T) {
	rs, ok := redisStore(t, redistest.Client(t)).(leasingStore)
	if !ok {
		t.Fatal("bucket.Redis does not lease")
	}
	store := &leaseStore{leasingStore: rs}
	n, err := New(Config{Region: "r", Store: store, Local: memoryStore(t, clock.Real{}), Shares: &leaseRegion{share: 1, nodes: 1},
		Registerer: prometheus.NewRegistry(), NodeLeaseHot: 5, StoreTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	set, err := policy.Parse("p.yaml", []byte("policies:\n  - name: hot\n    capacity: 60\n    rate: 30/s\n    lease: {fraction: 1, ttl: 200ms}\n"))
	if err != nil {
		t.Fatal(err)
	}
	n.SetPolicies(set)
	subject := redistest.Unique(t)
	var adms []boundcheck.Admission
	var takesAt1s int64
	start := time.Now()
	for time.Since(start) < 2*time.Second {
		if takesAt1s == 0 && time.Since(start) >= time.Second {
			takesAt1s = store.takes.Load()
		}
		sent := time.Now()
		if r := leaseCheck(t, n, subject, 1, "hot"); r.Allowed {
			adms = append(adms, boundcheck.Admission{Policy: "hot", Subject: subject, Region: "r", Sent: sent, At: time.Now(), Cost: 1})
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := store.takes.Load() - takesAt1s; got > 5 {
		t.Errorf("%d Redis takes in the second second, want the lease to decide", got)
	}
	if got := store.leases.Load(); got < 3 {
		t.Errorf("%d lease calls in 2 s at TTL 200ms, want renewals", got)
	}
	hot, _ := n.Policies().Get("hot")
	rep, err := boundcheck.Check(boundcheck.Config{Limits: map[string]bucket.Limits{"hot": hot.Limits}, Slack: 5 * time.Millisecond}, adms)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range rep.Violations {
		t.Errorf("over the bound: %v", v)
	}
	t.Logf("admitted %d in 2 s (ideal %.0f), Redis takes %d, lease calls %d, peak %.3f",
		len(adms), 60+30*time.Since(start).Seconds(), store.takes.Load(), store.leases.Load(), rep.Peak)
}

// demandRegion is a leaseRegion whose shares source also knows this
// node's part of the region's demand (RegionDemandParts).
type demandRegion struct {
	*leaseRegion
	mu   sync.Mutex
	part float64
}

func (r *demandRegion) DemandPart(string, string) (float64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.part, r.part > 0
}

func (r *demandRegion) setPart(f float64) {
	r.mu.Lock()
	r.part = f
	r.mu.Unlock()
}

// TestNodeLeaseDemandSplit: two nodes of one region at share 1 share a
// store; the subject's demand sits on node a (90% of the region's, as
// the nodes' demand reports say). a's lease may take 90% of the refill,
// not half; when the reports move the demand away (30% on a), a's next
// renewal shrinks the lease to its new part. The store never leases more
// than the refill in total.
func TestNodeLeaseDemandSplit(t *testing.T) {
	clk := clock.NewManual(time.Unix(1_800_000_000, 0))
	store := &leaseStore{leasingStore: memoryStore(t, clk)}
	region := &leaseRegion{share: 1, nodes: 2}
	ra, rb := &demandRegion{leaseRegion: region, part: 0.9}, &demandRegion{leaseRegion: region, part: 0.1}
	a, b := newLeaseNode(t, clk, store, ra), newLeaseNode(t, clk, store, rb)
	heatUp(t, clk, a, "t1", "hot")
	leaseCheck(t, b, "t1", 1, "hot")
	e := leaseOf(t, a, "hot", "t1")
	if e == nil {
		t.Fatal("node a took no lease of a subject checked 100 times a second")
	}
	e.mu.Lock()
	rate := e.rate
	e.mu.Unlock()
	if rate <= 15+1e-9 || rate > 27+1e-9 {
		t.Fatalf("node a's lease: %.2f tokens/s; want above the even part (15) and at most its demand part 0.9 × 30 = 27", rate)
	}
	ra.setPart(0.3)
	for range 150 { // 1.5 s at 100/s: past half the 2 s TTL
		leaseCheck(t, a, "t1", 1, "hot")
		clk.Advance(10 * time.Millisecond)
	}
	e = leaseOf(t, a, "hot", "t1")
	if e == nil {
		t.Fatal("node a lost its lease")
	}
	e.mu.Lock()
	shrunk := e.rate
	e.mu.Unlock()
	if shrunk > 9+1e-9 {
		t.Errorf("node a's lease after its part fell to 0.3: %.2f tokens/s, want at most 9", shrunk)
	}
	t.Logf("node a's lease: %.1f tokens/s at part 0.9, %.1f at part 0.3 (even part 15)", rate, shrunk)
}
