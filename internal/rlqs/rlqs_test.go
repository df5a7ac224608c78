package rlqs

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/boundcheck"
	"github.com/quotacoord/quota/internal/clock"
	"github.com/quotacoord/quota/internal/policy"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"))
}

// edgePolicies: tenants of domain edge get 30 requests per second, burst
// 60, as a token bucket (leasable); path /free has no limit.
const edgePolicies = `domain: edge
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 30, burst: 60}
  - key: path
    value: window
    rate_limit: {unit: second, requests_per_unit: 30}
`

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// region is one region's node: a Memory store, an RLQS server on a
// loopback listener, and its Envoys.
type region struct {
	name     string
	srv      *Server
	store    *bucket.Memory
	conn     *grpc.ClientConn
	clients  []*Client
	reg      *prometheus.Registry
	share    func() float64
	setShare func(float64)
	kill     func() // stops the gRPC server without a drain
	reports  uint64 // usage entries sent so far
}

type harness struct {
	t   *testing.T
	clk *clock.Manual
	set atomic.Pointer[policy.Set]
}

func newHarness(t *testing.T) *harness {
	set, err := policy.Parse("edge.yaml", []byte(edgePolicies))
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, clk: clock.NewManual(t0)}
	h.set.Store(set)
	return h
}

func (h *harness) region(name string, share float64, clients int, ccfg ClientConfig, mod func(*Config)) *region {
	t := h.t
	store, err := bucket.NewMemory(bucket.MemoryConfig{Clock: h.clk})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	r := &region{name: name, store: store, reg: prometheus.NewRegistry()}
	r.share = func() float64 { mu.Lock(); defer mu.Unlock(); return share }
	cfg := Config{
		Policies: h.set.Load,
		Subjects: policy.EnvoySubjects{PlainKeys: []string{"tenant", "path"}},
		Share:    func(string, string) float64 { return r.share() },
		Store:    store, Node: name, Interval: time.Second, TTL: 3 * time.Second, Margin: time.Second,
		Clock: h.clk, Registerer: r.reg,
	}
	if mod != nil {
		mod(&cfg)
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.srv = srv
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	srv.Register(gs)
	go func() { _ = gs.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	r.conn = conn
	ctx, cancel := context.WithCancel(context.Background())
	ccfg.Clock = h.clk
	for range clients {
		c := NewClient(ccfg)
		if err := c.Connect(ctx, conn); err != nil {
			t.Fatal(err)
		}
		r.clients = append(r.clients, c)
	}
	t.Cleanup(func() {
		cancel()
		for _, c := range r.clients {
			c.Close()
		}
		_ = conn.Close()
		gs.Stop()
	})
	r.setShare = func(f float64) { mu.Lock(); defer mu.Unlock(); share = f }
	r.kill = gs.Stop
	return r
}

// round is one report interval: every client reports, the server runs a
// round once it has every report, and every client applies the response
// before the clock moves again (delivery takes no clock time).
func (r *region) round(t *testing.T) {
	t.Helper()
	before := make([]uint64, len(r.clients))
	up := make([]bool, len(r.clients))
	for i, c := range r.clients {
		before[i] = c.Responses()
		c.mu.Lock()
		n := len(c.buckets)
		c.mu.Unlock()
		switch err := c.Report(); {
		case errors.Is(err, ErrNotConnected):
			continue // the filter drops the usage of a stream that is down
		case err != nil:
			t.Fatal(err)
		}
		up[i] = true
		r.reports += uint64(n)
	}
	waitFor(t, "reports", func() bool { return r.srv.Reports() >= r.reports })
	r.srv.Step(context.Background())
	for i, c := range r.clients {
		c.mu.Lock()
		n := len(c.buckets)
		c.mu.Unlock()
		if n > 0 && up[i] {
			waitFor(t, "responses", func() bool { return c.Responses() > before[i] })
		}
	}
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// TestRLQSBound: 3 regions × 4 Envoys, one tenant offered 3× its budget,
// the demand moving between regions and between Envoys every 10 s, an
// Envoy's stream cut for 2 s every 7 s. Every
// window admits at most C + r·W, and the under-admission against one
// ideal global bucket on the merged stream is reported.
func TestRLQSBound(t *testing.T) {
	h := newHarness(t)
	ccfg := ClientConfig{Domain: "edge", NoAssignment: DenyAll, Expired: DenyAll}
	var regions []*region
	for _, n := range []string{"eu", "us", "ap"} {
		regions = append(regions, h.region(n, 1.0/3, 4, ccfg, nil))
	}
	limits := bucket.Limits{Algorithm: bucket.TokenBucket, Capacity: 60, RefillPerSecond: 30}
	id := map[string]string{"tenant": "acme"}
	rng := rand.New(rand.NewPCG(1, 2))
	const (
		step    = 100 * time.Millisecond
		offered = 90.0 // 3× the refill
		seconds = 60
	)
	weights := make([]float64, 12)
	acc := make([]float64, 12)
	var adms []boundcheck.Admission
	var offers []time.Time
	regionOffers := make([][]time.Time, len(regions))
	var cut *Client
	for s := 0; s < seconds*10; s++ {
		if s%100 == 0 {
			// Demand moves: most of it to one region, and within it
			// mostly to one Envoy.
			hot := rng.IntN(3)
			for i := range weights {
				weights[i] = 0.02
				if i/4 == hot {
					weights[i] = 0.1
				}
			}
			weights[hot*4+rng.IntN(4)] = 0.5
			sum := 0.0
			for _, w := range weights {
				sum += w
			}
			for i := range weights {
				weights[i] /= sum
			}
		}
		// Now and then an Envoy's stream is cut for 2 s: its assignment
		// stays in force until its TTL, its usage is dropped, and it
		// subscribes again on a new stream (a new lease holder).
		if s%70 == 35 {
			cut = regions[rng.IntN(3)].clients[rng.IntN(4)]
			cut.Close()
		}
		if s%70 == 55 && cut != nil {
			if err := cut.Connect(context.Background(), cutConn(regions, cut)); err != nil {
				t.Fatal(err)
			}
			cut = nil
		}
		now := h.clk.Advance(step)
		for i := range weights {
			acc[i] += offered * weights[i] * step.Seconds()
			c := regions[i/4].clients[i%4]
			for ; acc[i] >= 1; acc[i]-- {
				offers = append(offers, now)
				regionOffers[i/4] = append(regionOffers[i/4], now)
				if c.Allow(id) {
					adms = append(adms, boundcheck.Admission{Policy: "p", Subject: "acme", Region: regions[i/4].name, At: now, Cost: 1})
				}
			}
		}
		if s%10 == 9 {
			for _, r := range regions {
				r.round(t)
			}
		}
	}
	rep, err := boundcheck.Check(boundcheck.Config{
		Limits:  map[string]bucket.Limits{"p": limits},
		Windows: []time.Duration{step, time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 30 * time.Second},
	}, adms)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range rep.Violations {
		t.Errorf("over the bound: %v", v)
	}
	// Two figures: against one ideal global bucket (the regions' shares
	// stay at 1/3 here, no coordinator moves them), and against an ideal
	// bucket per region at its share (what the RLQS layer itself loses).
	ideal := boundcheck.IdealAdmitted(offers, limits)
	regional := 0
	for _, o := range regionOffers {
		regional += boundcheck.IdealAdmitted(o, bucket.Limits{Capacity: limits.Capacity / 3, RefillPerSecond: limits.RefillPerSecond / 3})
	}
	t.Logf("offered %d, admitted %d; an ideal global bucket %d (under-admission %.1f%%); ideal buckets per region at its share %d (under-admission %.1f%%)",
		len(offers), len(adms), ideal, 100*(1-float64(len(adms))/float64(ideal)), regional, 100*(1-float64(len(adms))/float64(regional)))
	if float64(len(adms)) < 0.75*float64(regional) {
		t.Errorf("admitted %d, under 75%% of the regions' ideal %d", len(adms), regional)
	}
	var changes, leased float64
	for _, r := range regions {
		changes += value(r.srv.m.changes)
		leased += value(r.srv.m.leased)
	}
	var denied float64
	for _, r := range regions {
		denied += value(r.srv.m.leaseDenied)
	}
	t.Logf("assignment changes %v, lease denials %v; leased at the end %.1f tokens/s", changes, denied, leased)
}

// cutConn returns the connection of c's region.
func cutConn(regions []*region, c *Client) *grpc.ClientConn {
	for _, r := range regions {
		for _, rc := range r.clients {
			if rc == c {
				return r.conn
			}
		}
	}
	return nil
}

// value reads a gauge or counter.
func value(c prometheus.Metric) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return math.NaN()
	}
	if m.Gauge != nil {
		return m.Gauge.GetValue()
	}
	return m.GetCounter().GetValue()
}
