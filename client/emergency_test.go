package client_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/client"
	"github.com/quotacoord/quota/client/clienttest"
	"github.com/quotacoord/quota/internal/clock"
	"github.com/quotacoord/quota/internal/policy"
	"github.com/quotacoord/quota/internal/redistest"
	"github.com/quotacoord/quota/internal/regional"
)

// fixedShare is a region's share of every policy, as a coordinator would
// publish it.
type fixedShare float64

func (f fixedShare) Share(string, string) float64 { return float64(f) }
func (fixedShare) Ready() bool                    { return true }

// regionNode is an in-process regional node deciding from the shared Redis,
// served over real gRPC on loopback until stop.
type regionNode struct {
	addr string
	gs   *grpc.Server
	done chan struct{}
}

// startRegionNode serves a node that holds share of every policy in doc.
func startRegionNode(t *testing.T, share float64, doc string) *regionNode {
	t.Helper()
	return serveNode(t, regional.Config{Shares: fixedShare(share), SubjectSalt: "client-emergency-test", StoreTimeout: 2 * time.Second}, doc)
}

// serveNode serves a real regional node of cfg on the shared Redis (an
// in-process store for its local failure mode) with the policies of doc.
func serveNode(t *testing.T, cfg regional.Config, doc string) *regionNode {
	t.Helper()
	store, err := bucket.NewRedis(bucket.RedisConfig{Client: redistest.Client(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	local, err := bucket.NewMemory(bucket.MemoryConfig{MaxBuckets: 1000})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Region, cfg.Store, cfg.Local = "test", store, local
	n, err := regional.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "policies.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	set, err := policy.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	n.SetPolicies(set)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rn := &regionNode{addr: lis.Addr().String(), gs: grpc.NewServer(), done: make(chan struct{})}
	n.Register(rn.gs)
	go func() {
		defer close(rn.done)
		_ = rn.gs.Serve(lis)
	}()
	t.Cleanup(rn.stop)
	return rn
}

// stop kills the node's server: open connections close and new ones are
// refused (idempotent).
func (rn *regionNode) stop() {
	rn.gs.Stop()
	<-rn.done
}

// emergencyPolicy is a policy name unique to the test (the Redis is shared).
func emergencyPolicy(t *testing.T) string { return unique(t, "emergency") }

// TestEmergencyBucketAfterNodeStops: three clients of a region whose share
// is 0.75 of a policy of capacity 20 learn the share from the node, then
// the node dies. Each client's emergency bucket admits 20·0.75/3 = 5, so
// the three together admit the region's 15 and no more, whatever they
// admitted through the node before; refill adds 0.75·r/3 per second each.
// Nothing is charged locally while the node answers.
func TestEmergencyBucketAfterNodeStops(t *testing.T) {
	name := emergencyPolicy(t)
	const capacity, refill, share, clients = 20, 1.0, 0.75, 3
	node := startRegionNode(t, share, fmt.Sprintf(`policies:
  - name: %s
    version: 1
    subject: tenant
    capacity: %d
    refill_per_second: %g
    failure_mode: closed
`, name, capacity, refill))
	clk := clock.NewManual(time.Unix(1_800_000_000, 0))
	reg := prometheus.NewRegistry()
	em := client.Emergency{Clients: clients, Clock: clk,
		Policies: []client.EmergencyPolicy{{Name: name, Limits: bucket.Limits{Capacity: capacity, RefillPerSecond: refill}}}}
	var cs []*client.Client
	for range clients {
		cs = append(cs, newClient(t, node.addr, client.WithTimeout(2*time.Second), client.WithEmergency(em), client.WithRegisterer(reg)))
	}
	ctx := context.Background()
	// Through the node: the region's bucket (0.75·20 = 15) decides.
	nodeAdmitted := 0
	for i := 0; i < 18; i++ {
		d, err := cs[i%clients].Allow(ctx, "tenant-a", name, 1)
		if err != nil {
			t.Fatal(err)
		}
		if d.Degraded != "" || d.Limit != 15 || len(d.Policies) != 1 || d.Policies[0].Share != share {
			t.Fatalf("node decision %d: %+v", i, d)
		}
		if d.Allowed {
			nodeAdmitted++
		}
	}
	if nodeAdmitted != 15 {
		t.Fatalf("the node admitted %d of tenant-a, want its region's 15", nodeAdmitted)
	}

	node.stop()
	perClient := make([]int, clients)
	for round := 0; round < 10; round++ {
		for i, c := range cs {
			d, err := c.Allow(ctx, "tenant-a", name, 1)
			if err != nil {
				t.Fatalf("client %d after the node stopped: %v", i, err)
			}
			if d.Degraded != client.DegradedClientLocal || d.Cause == nil || d.DecidedBy != name || d.Limit != 5 ||
				d.Policies[0].Share != share/clients {
				t.Fatalf("client %d: local decision %+v", i, d)
			}
			if d.Allowed {
				perClient[i]++
			} else if d.RetryAfter <= 0 {
				t.Errorf("client %d: local denial without retry-after: %+v", i, d)
			}
		}
	}
	total := 0
	for i, n := range perClient {
		if n != 5 {
			t.Errorf("client %d admitted %d locally, want 20·0.75/3 = 5", i, n)
		}
		total += n
	}
	if total != 15 {
		t.Errorf("clients admitted %d together, want the region's 15", total)
	}
	// 4 s refill 0.75·1/3·4 = 1 token per client.
	clk.Advance(4 * time.Second)
	for i, c := range cs {
		for j, want := range []bool{true, false} {
			if d, err := c.Allow(ctx, "tenant-a", name, 1); err != nil || d.Allowed != want {
				t.Errorf("client %d, check %d after 4 s: %+v, %v; want allowed %v", i, j, d, err, want)
			}
		}
	}
	// Another subject has its own bucket; a cost above a client's part of
	// the share is denied, within the policy's capacity it is no error.
	if d, err := cs[0].Allow(ctx, "tenant-b", name, 6); err != nil || d.Allowed || d.Remaining != 5 {
		t.Errorf("cost 6 over a bucket of 5: %+v, %v", d, err)
	}
	if d, err := cs[0].Allow(ctx, "tenant-b", name, 5); err != nil || !d.Allowed || d.Remaining != 0 {
		t.Errorf("cost 5: %+v, %v", d, err)
	}
	if _, err := cs[0].Allow(ctx, "tenant-b", name, capacity+1); !errors.Is(err, client.ErrInvalidRequest) {
		t.Errorf("cost above the policy's capacity: %v, want ErrInvalidRequest", err)
	}

	wantCounts := map[string]float64{client.OutcomeLocalAllowed: 15 + 3 + 1, client.OutcomeLocalDenied: 15 + 3 + 1,
		client.OutcomeOpen: 0, client.OutcomeClosed: 0}
	if got := len(series(t, reg)); got != len(wantCounts) {
		t.Errorf("%d series, want %d", got, len(wantCounts))
	}
	for outcome, want := range wantCounts {
		if got := counter(t, reg, outcome); got != want {
			t.Errorf("quota_client_local_decisions_total{outcome=%q} = %v, want %v", outcome, got, want)
		}
	}
}

// series reads quota_client_local_decisions_total by outcome.
func series(t *testing.T, g prometheus.Gatherer) map[string]float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "quota_client_local_decisions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" {
					out[l.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

// counter reads quota_client_local_decisions_total{outcome}.
func counter(t *testing.T, g prometheus.Gatherer, outcome string) float64 {
	t.Helper()
	return series(t, g)[outcome]
}

// TestEmergencyModesStillDecide: with the node stopped, what the
// emergency buckets cannot decide (a policy without one, a share never
// learned) goes to the unreachable mode, and clients without emergency
// buckets fail open or closed as before.
func TestEmergencyModesStillDecide(t *testing.T) {
	name, other := emergencyPolicy(t), emergencyPolicy(t)
	node := startRegionNode(t, 0.5, fmt.Sprintf(`policies:
  - {name: %s, version: 1, subject: tenant, capacity: 10, refill_per_second: 0.01, failure_mode: closed}
  - {name: %s, version: 1, subject: tenant, capacity: 10, refill_per_second: 0.01, failure_mode: closed}
`, name, other))
	em := client.Emergency{Clients: 1, Policies: []client.EmergencyPolicy{{Name: name, Limits: bucket.Limits{Capacity: 10, RefillPerSecond: 0.01}}}}
	reg := prometheus.NewRegistry()
	learned := newClient(t, node.addr, client.WithEmergency(em), client.WithUnreachable(client.UnreachableClosed),
		client.WithRegisterer(reg), client.WithTimeout(2*time.Second))
	unlearned := newClient(t, node.addr, client.WithEmergency(em), client.WithUnreachable(client.UnreachableOpen),
		client.WithRegisterer(reg), client.WithTimeout(2*time.Second))
	strict := newClient(t, node.addr, client.WithEmergency(em), client.WithTimeout(2*time.Second))
	open := newClient(t, node.addr, client.WithUnreachable(client.UnreachableOpen), client.WithRegisterer(reg))
	closed := newClient(t, node.addr, client.WithUnreachable(client.UnreachableClosed), client.WithRegisterer(reg))
	ctx := context.Background()
	for _, c := range []*client.Client{learned, strict} {
		if d, err := c.Allow(ctx, "warm-up", name, 1); err != nil || d.Degraded != "" {
			t.Fatalf("warm-up through the node: %+v, %v", d, err)
		}
	}
	node.stop()

	steps := []struct {
		name     string
		c        *client.Client
		policies []string
		allowed  bool
		degraded string
		wantErr  bool
	}{
		{"learned share: local bucket", learned, []string{name}, true, client.DegradedClientLocal, false},
		{"policy without a bucket: closed", learned, []string{name, other}, false, client.DegradedClientClosed, false},
		{"share never learned: open", unlearned, []string{name}, true, client.DegradedClientOpen, false},
		{"mode error: local bucket still decides", strict, []string{name}, true, client.DegradedClientLocal, false},
		{"mode error: no bucket, an error", strict, []string{other}, false, "", true},
		{"no emergency: open", open, []string{name}, true, client.DegradedClientOpen, false},
		{"no emergency: closed", closed, []string{name}, false, client.DegradedClientClosed, false},
	}
	for _, s := range steps {
		d, err := s.c.Check(ctx, client.Request{Subject: "tenant-a", Policies: s.policies})
		if (err != nil) != s.wantErr {
			t.Errorf("%s: err %v", s.name, err)
			continue
		}
		if d.Allowed != s.allowed || d.Degraded != s.degraded || (!s.wantErr && d.Cause == nil) {
			t.Errorf("%s: %+v", s.name, d)
		}
	}
	for outcome, want := range map[string]float64{client.OutcomeLocalAllowed: 1, client.OutcomeOpen: 2, client.OutcomeClosed: 2} {
		if got := counter(t, reg, outcome); got != want {
			t.Errorf("%s: %v, want %v", outcome, got, want)
		}
	}
}

// TestEmergencyOnTimeout: a node too slow for the client's timeout is
// unreachable as well; a node that answers with an error is not (its
// answer stands), and a batch is decided check by check, all or nothing
// across each check's policies.
func TestEmergencyOnTimeout(t *testing.T) {
	srv := clienttest.Start(t, map[string]int64{"exports": 4, "daily": 2}, nil)
	clk := clock.NewManual(time.Unix(1_800_000_000, 0))
	c := newClient(t, srv.Addr, client.WithTimeout(100*time.Millisecond), client.WithEmergency(client.Emergency{Clients: 2, Clock: clk,
		Policies: []client.EmergencyPolicy{
			{Name: "exports", Limits: bucket.Limits{Capacity: 4}},
			{Name: "daily", Limits: bucket.Limits{Capacity: 2}, Share: 1},
		}}))
	ctx := context.Background()
	// exports' share is learned from the node (1), daily's configured.
	if d, err := c.Allow(ctx, "warm-up", "exports", 1); err != nil || d.Degraded != "" {
		t.Fatalf("warm-up: %+v, %v", d, err)
	}
	if _, err := c.Allow(ctx, "s", "unknown", 1); err == nil {
		t.Fatal("a NotFound from the node became a decision")
	}
	srv.SetDelay(2 * time.Second)
	ds, err := c.CheckBatch(ctx, []client.Request{
		{Subject: "s", Policies: []string{"exports"}, Cost: 2},
		{Subject: "s", Policies: []string{"exports", "daily"}},
		{Subject: "s", Policies: []string{"daily", "exports"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	// Buckets of 4/2 = 2 (exports) and 2/2 = 1 (daily): the first check
	// empties exports, so the second and third are denied by it and
	// charge daily nothing.
	want := []struct {
		allowed   bool
		decidedBy string
		own       []bool
	}{
		{true, "exports", []bool{true}},
		{false, "exports", []bool{false, true}},
		{false, "exports", []bool{true, false}},
	}
	for i, w := range want {
		d := ds[i]
		if d.Allowed != w.allowed || d.DecidedBy != w.decidedBy || d.Degraded != client.DegradedClientLocal || len(d.Policies) != len(w.own) {
			t.Errorf("check %d: %+v", i, d)
			continue
		}
		for j, own := range w.own {
			if d.Policies[j].Allowed != own {
				t.Errorf("check %d policy %d: %+v", i, j, d.Policies[j])
			}
		}
	}
	if d, err := c.Allow(ctx, "s", "daily", 1); err != nil || !d.Allowed || d.Remaining != 0 {
		t.Errorf("daily after two denied checks: %+v, %v (a denial charged it)", d, err)
	}
	if d, err := c.Check(ctx, client.Request{Subject: "raw key", HashSubject: true, Policies: []string{"exports"}}); err != nil || !d.Allowed {
		t.Errorf("hashed subject: %+v, %v", d, err)
	}
	if _, err := c.Allow(ctx, "not a subject", "exports", 1); !errors.Is(err, client.ErrInvalidRequest) {
		t.Errorf("invalid subject: %v", err)
	}
}

// TestEmergencyShrinksToTheNodesLimit: a configured capacity above the
// policy's real one (the policy shrank) does not let the bucket exceed
// the node's limit.
func TestEmergencyShrinksToTheNodesLimit(t *testing.T) {
	srv := clienttest.Start(t, map[string]int64{"exports": 6}, nil)
	c := newClient(t, srv.Addr, client.WithUnreachable(client.UnreachableClosed), client.WithEmergency(client.Emergency{Clients: 2,
		Policies: []client.EmergencyPolicy{{Name: "exports", Limits: bucket.Limits{Capacity: 10}}}}))
	ctx := context.Background()
	if _, err := c.Allow(ctx, "warm-up", "exports", 1); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	admitted := 0
	for i := 0; i < 10; i++ {
		d, err := c.Allow(ctx, "s", "exports", 1)
		if err != nil || d.Degraded != client.DegradedClientLocal {
			t.Fatalf("check %d: %+v, %v", i, d, err)
		}
		if d.Allowed {
			admitted++
		}
	}
	if admitted != 3 {
		t.Errorf("admitted %d, want the node's limit 6 over 2 clients = 3", admitted)
	}
}

// TestEmergencyWithoutShare: a region the node reports no share for
// denies everything locally too, charging nothing, with the unreachable
// retry-after; a share that comes back is used again.
func TestEmergencyWithoutShare(t *testing.T) {
	srv := clienttest.Start(t, map[string]int64{"exports": 4, "daily": 4}, nil)
	srv.SetShare(0)
	pols := []client.EmergencyPolicy{{Name: "exports", Limits: bucket.Limits{Capacity: 4}}, {Name: "daily", Limits: bucket.Limits{Capacity: 4}, Share: 1}}
	c := newClient(t, srv.Addr, client.WithUnreachable(client.UnreachableOpen), client.WithUnreachableRetryAfter(7*time.Second),
		client.WithEmergency(client.Emergency{Clients: 1, Policies: pols}))
	ctx := context.Background()
	if _, err := c.Allow(ctx, "warm-up", "exports", 1); err != nil {
		t.Fatal(err)
	}
	srv.SetDelay(time.Second) // beyond the client's 250ms timeout
	d, err := c.Check(ctx, client.Request{Subject: "s", Policies: []string{"daily", "exports"}})
	if err != nil || d.Allowed || d.Degraded != client.DegradedClientLocal || d.DecidedBy != "exports" || d.RetryAfter != 7*time.Second ||
		!d.Policies[0].Allowed || d.Policies[1].Allowed || d.Policies[1].Share != 0 {
		t.Fatalf("no share: %+v, %v", d, err)
	}
	// daily was not charged: its bucket of 4 admits 4.
	if d, err := c.Allow(ctx, "s", "daily", 4); err != nil || !d.Allowed {
		t.Errorf("daily after the denial: %+v, %v", d, err)
	}
	srv.SetDelay(0)
	srv.SetShare(0.5)
	if _, err := c.Allow(ctx, "warm-up", "exports", 1); err != nil {
		t.Fatal(err)
	}
	srv.SetDelay(time.Second)
	if d, err := c.Allow(ctx, "s", "exports", 2); err != nil || !d.Allowed || d.Limit != 2 {
		t.Errorf("share 0.5 of 4: %+v, %v", d, err)
	}
}

func TestEmergencyConfig(t *testing.T) {
	ok := client.EmergencyPolicy{Name: "p", Limits: bucket.Limits{Capacity: 10, RefillPerSecond: 1}}
	tests := []struct {
		name string
		e    client.Emergency
	}{
		{"no clients", client.Emergency{Policies: []client.EmergencyPolicy{ok}}},
		{"too many clients", client.Emergency{Clients: client.MaxEmergencyClients + 1, Policies: []client.EmergencyPolicy{ok}}},
		{"no policies", client.Emergency{Clients: 1}},
		{"too many policies", client.Emergency{Clients: 1, Policies: make([]client.EmergencyPolicy, client.MaxEmergencyPolicies+1)}},
		{"negative max buckets", client.Emergency{Clients: 1, MaxBuckets: -1, Policies: []client.EmergencyPolicy{ok}}},
		{"empty name", client.Emergency{Clients: 1, Policies: []client.EmergencyPolicy{{Limits: ok.Limits}}}},
		{"bad name", client.Emergency{Clients: 1, Policies: []client.EmergencyPolicy{{Name: "a b", Limits: ok.Limits}}}},
		{"named twice", client.Emergency{Clients: 1, Policies: []client.EmergencyPolicy{ok, ok}}},
		{"zero capacity", client.Emergency{Clients: 1, Policies: []client.EmergencyPolicy{{Name: "p"}}}},
		{"idle TTL below a refill", client.Emergency{Clients: 1, Policies: []client.EmergencyPolicy{
			{Name: "p", Limits: bucket.Limits{Capacity: 10, RefillPerSecond: 1, IdleTTL: time.Second}}}}},
		{"share above 1+overcommit", client.Emergency{Clients: 1, Policies: []client.EmergencyPolicy{{Name: "p", Limits: ok.Limits, Share: 1.5}}}},
		{"negative share", client.Emergency{Clients: 1, Policies: []client.EmergencyPolicy{{Name: "p", Limits: ok.Limits, Share: -0.1}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if c, err := client.New("127.0.0.1:1", client.WithEmergency(tt.e)); !errors.Is(err, client.ErrInvalidConfig) {
				if c != nil {
					c.Close()
				}
				t.Errorf("err = %v, want ErrInvalidConfig", err)
			}
		})
	}
	// Defaults: a zero IdleTTL becomes the shortest valid one, for every
	// algorithm.
	for _, l := range []bucket.Limits{
		{Capacity: 10, RefillPerSecond: 0.001},
		{Capacity: 10},
		{Algorithm: bucket.FixedWindow, Capacity: 10, Window: time.Hour},
		{Algorithm: bucket.SlidingWindow, Capacity: 10, Window: time.Hour},
		{Algorithm: bucket.SlidingLog, Capacity: 10, Window: time.Second},
	} {
		c, err := client.New("127.0.0.1:1", client.WithEmergency(client.Emergency{Clients: 1, Policies: []client.EmergencyPolicy{{Name: "p", Limits: l}}}))
		if err != nil {
			t.Errorf("%+v: %v", l, err)
			continue
		}
		c.Close()
	}
	// A registry holding another collector of the name is refused.
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: "quota_client_local_decisions_total", Help: "not ours"}))
	if c, err := client.New("127.0.0.1:1", client.WithRegisterer(reg)); !errors.Is(err, client.ErrInvalidConfig) {
		if c != nil {
			c.Close()
		}
		t.Errorf("clashing registry: %v", err)
	}
}
