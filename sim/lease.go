package sim

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/quotacoord/quota/allocator"
	"github.com/quotacoord/quota/bucket"
)

// The lease layer: one region's bucket for one subject handed out as
// leases to consumers that decide on their own (Envoys over RLQS), so that
// an operator can choose the lease TTL, the reporting interval and the
// number of consumers per node from the predicted overshoot (which must be
// 0) and under-admission.
//
// The consumers are served by Nodes nodes of the region (consumer i by
// node i mod Nodes), each with its own rounds, offset from the other
// nodes' by ReportInterval/Nodes (nodes are not synchronised). As in
// internal/rlqs, a node splits among its own consumers only, and offers
// them its part of the leasable rate: its consumers' demand over all the
// region's consumers' (the nodes' demand reports), at least half the even
// part; the region's bucket grants what no other lease holds.
//
// Every ReportInterval each consumer reports what it was offered; its node
// splits the leasable rate R·(1 − Reserve) among them max-min fair by
// demand (allocator.Target, as internal/rlqs does), shapes each share as
// the filter's token bucket (whole-second fill intervals: ⌊ρ⌋ tokens per
// second, or one token every ⌈1/ρ⌉ s; the burst one fill) and asks the
// region's bucket for the lease with bucket.Memory.LeaseAt, the reference
// model of the Redis lease script. An unchanged assignment renews its
// lease; a changed one takes a fresh one (its burst charged again), and a
// consumer whose lease is refused is sent DENY_ALL. An assignment reaches
// its consumer within LeaseConfig.Delay (at most the Margin the lease
// counts); the consumer enforces it as the filter does: a changed one is a
// new, full bucket, an equal one only extends the TTL, and a bucket with
// no assignment or an expired one denies (the DENY_ALL behaviours the
// bound needs).

// LeaseConfig describes one run of the lease layer.
type LeaseConfig struct {
	// Name labels the run in tables.
	Name string
	// Capacity and Refill are the region's bucket: f·C tokens and f·r
	// tokens per second.
	Capacity int64
	Refill   float64
	// Consumers is how many consumers share the bucket, 1 to MaxLeaseConsumers.
	Consumers int
	// Nodes is how many of the region's nodes serve the consumers, 1 to
	// Consumers; default 1.
	Nodes int
	// TTL is every assignment's time to live, whole seconds, above
	// ReportInterval + Margin so that a renewal arrives before it ends.
	TTL time.Duration
	// ReportInterval is how often consumers report and the node re-splits.
	ReportInterval time.Duration
	// Margin is what a lease counts beyond the TTL for delivery; default 1 s.
	Margin time.Duration
	// Delay is the longest an assignment takes to reach its consumer
	// (each draws U[0, Delay]); at most Margin, which the bound rests on.
	Delay time.Duration
	// Reserve is the part of the refill never leased, in [0, 0.9].
	Reserve float64
	// Offered is the total offered load as a multiple of Refill.
	Offered float64
	// Move re-draws how the offered load falls on the consumers every
	// Move (0: never; an even spread).
	Move time.Duration
	// Duration is the simulated time; Tick the decision step (default 100 ms).
	Duration, Tick time.Duration
	// Seed seeds the arrivals and the delays.
	Seed uint64
}

// MaxLeaseConsumers bounds LeaseConfig.Consumers.
const MaxLeaseConsumers = 1024

// ErrLeaseConfig is wrapped by every error about a LeaseConfig.
var ErrLeaseConfig = errors.New("sim: invalid lease config")

// LeaseResult is what a lease run measured.
type LeaseResult struct {
	Config LeaseConfig
	// Overshoot is the largest overshoot(W) over the windows LeaseWindows
	// against the region's bucket (C + r·W, the bound a region's share
	// must keep); 0 means no window admitted more than the bucket alone.
	Overshoot float64
	// Admitted is what the consumers admitted; Ideal what one bucket of
	// the same capacity and refill admits on the same requests.
	Admitted, Ideal int64
	// UnderAdmission is 1 − Admitted/Ideal.
	UnderAdmission float64
	// Grants counts fresh leases (a burst charged), Renewals extended
	// ones, Refusals the rounds a consumer got DENY_ALL.
	Grants, Renewals, Refusals int
}

// LeaseWindows are the window lengths a lease run measures.
var LeaseWindows = []time.Duration{100 * time.Millisecond, time.Second, 3 * time.Second, 10 * time.Second, 30 * time.Second}

func (c LeaseConfig) withDefaults() (LeaseConfig, error) {
	if c.Margin == 0 {
		c.Margin = time.Second
	}
	if c.Tick == 0 {
		c.Tick = 100 * time.Millisecond
	}
	if c.Nodes == 0 {
		c.Nodes = 1
	}
	bad := func(format string, args ...any) (LeaseConfig, error) {
		return LeaseConfig{}, fmt.Errorf("%w: %s", ErrLeaseConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case c.Capacity < 1:
		return bad("capacity %d, want ≥ 1", c.Capacity)
	case !(c.Refill > 0) || math.IsInf(c.Refill, 0):
		return bad("refill %v, want > 0", c.Refill)
	case c.Consumers < 1 || c.Consumers > MaxLeaseConsumers:
		return bad("consumers %d, want 1 to %d", c.Consumers, MaxLeaseConsumers)
	case c.Nodes < 1 || c.Nodes > c.Consumers:
		return bad("nodes %d, want 1 to the consumers (%d)", c.Nodes, c.Consumers)
	case c.ReportInterval < c.Tick || c.ReportInterval%c.Tick != 0:
		return bad("report interval %v, want a multiple of the tick %v", c.ReportInterval, c.Tick)
	case c.TTL%time.Second != 0 || c.TTL <= c.ReportInterval+c.Margin:
		return bad("TTL %v, want whole seconds above report interval + margin (%v)", c.TTL, c.ReportInterval+c.Margin)
	case c.Margin < 0 || c.Delay < 0 || c.Delay > c.Margin:
		return bad("delay %v, margin %v: want 0 ≤ delay ≤ margin", c.Delay, c.Margin)
	case !(c.Reserve >= 0 && c.Reserve <= 0.9):
		return bad("reserve %v, want 0 to 0.9", c.Reserve)
	case !(c.Offered >= 0) || math.IsInf(c.Offered, 0):
		return bad("offered %v, want ≥ 0", c.Offered)
	case c.Move < 0:
		return bad("move %v, want ≥ 0", c.Move)
	case c.Duration < c.ReportInterval || c.Duration > MaxDuration:
		return bad("duration %v, want report interval to %v", c.Duration, MaxDuration)
	case c.Tick <= 0:
		return bad("tick %v, want > 0", c.Tick)
	}
	return c, nil
}

// leaseShape is an assignment as the filter enforces it: a token bucket of
// burst tokens refilled at rate per second, or a blanket denial.
type leaseShape struct {
	rate  float64
	burst int64
	deny  bool
}

// shapeFor is the whole-second token bucket that refills at most rate per
// second (internal/rlqs sends the same), its burst one fill, at most lim.
func shapeFor(rate float64, lim int64) (leaseShape, bool) {
	switch {
	case rate >= 1:
		n := math.Floor(rate)
		return leaseShape{rate: n, burst: min(int64(n), lim)}, true
	case rate > 0 && math.Ceil(1/rate-1e-9) <= 60:
		return leaseShape{rate: 1 / math.Ceil(1/rate-1e-9), burst: 1}, true
	}
	return leaseShape{}, false
}

// leaseConsumer is one consumer: its filter's bucket and the node's view
// of its lease.
type leaseConsumer struct {
	holder  string
	weight  float64
	offered int64   // since the last report
	demand  float64 // smoothed requests per second

	// The filter's side.
	has         bool
	shape       leaseShape
	tokens      float64
	ts, expires time.Duration
	pending     []leaseDelivery // in arrival order
	sent        leaseShape      // the node's side: the last assignment sent
	sentAt      time.Duration
	hasSent     bool
	leased      leaseShape // the lease behind sent, as the store granted it
}

type leaseDelivery struct {
	at    time.Duration
	shape leaseShape
}

// apply delivers an assignment at its arrival, as the filter applies it.
func (c *leaseConsumer) apply(d leaseDelivery, ttl time.Duration) {
	c.expires = d.at + ttl
	if c.has && c.shape == d.shape {
		return // the same assignment: a longer TTL, the same tokens
	}
	c.has, c.shape = true, d.shape
	c.tokens, c.ts = float64(d.shape.burst), d.at
}

// allow decides one request at now.
func (c *leaseConsumer) allow(now time.Duration) bool {
	if !c.has || now >= c.expires || c.shape.deny {
		return false
	}
	c.tokens = min(float64(c.shape.burst), c.tokens+c.shape.rate*(now-c.ts).Seconds())
	c.ts = now
	if c.tokens >= 1 {
		c.tokens--
		return true
	}
	return false
}

// RunLeases runs the lease layer described by cfg.
func RunLeases(cfg LeaseConfig) (*LeaseResult, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	origin := time.Unix(1_000_000_000, 0)
	store, err := bucket.NewMemory(bucket.MemoryConfig{})
	if err != nil {
		return nil, err
	}
	limits := bucket.Limits{Capacity: cfg.Capacity, RefillPerSecond: cfg.Refill,
		IdleTTL: time.Duration(float64(cfg.Capacity)/cfg.Refill*float64(time.Second)) + cfg.TTL + cfg.Margin + time.Minute}
	key, err := bucket.NewKey("leases", 1, "s0")
	if err != nil {
		return nil, err
	}
	req := bucket.Request{Key: key, Limits: limits, Share: 1}
	ideal, err := NewIdealBucket(cfg.Capacity, cfg.Refill)
	if err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x1ea5e))
	cs := make([]*leaseConsumer, cfg.Consumers)
	for i := range cs {
		cs[i] = &leaseConsumer{holder: "c" + strconv.Itoa(i), weight: 1 / float64(cfg.Consumers)}
	}
	res := &LeaseResult{Config: cfg}
	var adms []Admission
	ticks := int64(cfg.Duration / cfg.Tick)
	per := int64(cfg.ReportInterval / cfg.Tick)
	nodes := make([][]*leaseConsumer, cfg.Nodes)
	for i, c := range cs {
		nodes[i%cfg.Nodes] = append(nodes[i%cfg.Nodes], c)
	}
	for k := int64(1); k <= ticks; k++ {
		now := time.Duration(k) * cfg.Tick
		if cfg.Move > 0 && now%cfg.Move == cfg.Tick {
			moveDemand(rng, cs)
		}
		var offered, admitted int64
		for _, c := range cs {
			for len(c.pending) > 0 && c.pending[0].at <= now {
				c.apply(c.pending[0], cfg.TTL)
				c.pending = c.pending[1:]
			}
			n := int64(poisson(rng, cfg.Offered*cfg.Refill*c.weight*cfg.Tick.Seconds()))
			c.offered += n
			offered += n
			for range n {
				if c.allow(now) {
					admitted++
				}
			}
		}
		if admitted > 0 {
			adms = append(adms, Admission{At: now, Count: admitted})
			res.Admitted += admitted
		}
		if _, err := ideal.Take(now, 0, offered); err != nil {
			return nil, err
		}
		for j, own := range nodes {
			if k%per == int64(j)*per/int64(cfg.Nodes) {
				if err := leaseRound(&cfg, store, &req, origin, now, rng, own, res, nodePart(cs, own, cfg.Nodes)); err != nil {
					return nil, err
				}
			}
		}
	}
	m, err := Measure(adms, float64(cfg.Capacity), cfg.Refill, LeaseWindows)
	if err != nil {
		return nil, err
	}
	for _, o := range m.Overshoot {
		res.Overshoot = max(res.Overshoot, o)
	}
	res.Ideal = ideal.Admitted()
	res.UnderAdmission = UnderAdmission(res.Admitted, res.Ideal)
	return res, nil
}

// moveDemand re-draws how the offered load falls on the consumers: a
// random weight each, some of them idle.
func moveDemand(rng *rand.Rand, cs []*leaseConsumer) {
	var sum float64
	for _, c := range cs {
		c.weight = 0
		if rng.Float64() < 0.75 {
			c.weight = rng.ExpFloat64()
		}
		sum += c.weight
	}
	for _, c := range cs {
		if sum > 0 {
			c.weight /= sum
		} else {
			c.weight = 1 / float64(len(cs))
		}
	}
}

// nodePart is the part of the leasable rate a node serving own (of all
// the consumers cs, on nodes nodes) offers them, as the node takes it
// from the nodes' demand reports (regional's demandPart): its consumers'
// demand over all of it, at least half the even part; the whole with one
// node. The demands are those of each consumer's node's last round: the
// reports lag by up to one interval (a real node's by its demand report
// interval).
func nodePart(cs, own []*leaseConsumer, nodes int) float64 {
	if nodes <= 1 {
		return 1
	}
	var mine, all float64
	for _, c := range cs {
		all += c.demand
	}
	for _, c := range own {
		mine += c.demand
	}
	part := 0.5 / float64(nodes)
	if all > 0 {
		part = max(part, mine/all)
	}
	return part
}

// leaseRound is one node's round at now for its consumers cs and its part
// of the leasable rate: demands from the reports, the max-min split, one
// lease call per consumer and the assignments sent.
func leaseRound(cfg *LeaseConfig, store *bucket.Memory, req *bucket.Request, origin time.Time, now time.Duration, rng *rand.Rand, cs []*leaseConsumer, res *LeaseResult, part float64) error {
	regions := make([]allocator.Region, len(cs))
	leasable := cfg.Refill * (1 - cfg.Reserve) * part
	for i, c := range cs {
		c.demand = allocator.Smooth(c.demand, float64(c.offered)/cfg.ReportInterval.Seconds(), 0.5)
		c.offered = 0
		regions[i] = allocator.Region{Name: c.holder, Demand: c.demand / leasable, Live: true}
	}
	shares, err := allocator.Target(allocator.Params{Algorithm: allocator.MaxMinFair}, regions)
	if err != nil {
		return fmt.Errorf("sim: lease split: %w", err)
	}
	at := origin.Add(now)
	for i, c := range cs {
		rate := max(0, min(1, shares[i])) * leasable * (1 - allocator.Tolerance)
		want, ok := shapeFor(rate, cfg.Capacity)
		var lease bucket.Lease
		if ok {
			// Every change costs a fresh burst: a rate within a fifth of
			// the one in force keeps it.
			if c.hasSent && !c.sent.deny && math.Abs(want.rate-c.sent.rate) <= 0.2*c.sent.rate && c.sent.burst <= want.burst+c.sent.burst/5 {
				want = c.sent
			}
			ask := want
			renew := c.hasSent && want == c.sent && now+cfg.Margin < c.sentAt+cfg.TTL
			if renew {
				ask = c.leased // a renewal names the lease as granted
			}
			// As the node does: a renewal keeps the Envoy's token state and
			// ends the old lease after the margin; a changed assignment
			// leaves the one it replaces counted to its own end (TTL and
			// margin), since a consumer whose stream is cut keeps it.
			cut := cfg.TTL + cfg.Margin
			if renew {
				cut = cfg.Margin
			}
			lease, err = store.LeaseAt(at, bucket.LeaseRequest{Request: *req, Holder: c.holder, Rate: ask.rate, Burst: ask.burst,
				For: cfg.TTL + cfg.Margin, Cut: cut, Renew: renew})
			if err != nil {
				return fmt.Errorf("sim: lease for %s: %w", c.holder, err)
			}
			if lease.Granted && lease.Rate < want.rate {
				// Other leases still hold part of the rate: enforce what
				// was granted.
				got, gok := shapeFor(lease.Rate, want.burst)
				want, ok = got, gok
			}
		}
		if !ok || !lease.Granted {
			if c.hasSent && !c.sent.deny {
				// As the node does: the lease in force ends a TTL and the
				// margin after the DENY_ALL that replaces it was sent.
				if _, err := store.ReleaseAt(at, bucket.LeaseRelease{Request: *req, Holder: c.holder, Within: cfg.TTL + cfg.Margin}); err != nil {
					return fmt.Errorf("sim: release for %s: %w", c.holder, err)
				}
			}
			want = leaseShape{deny: true}
			res.Refusals++
		} else {
			c.leased = leaseShape{rate: lease.Rate, burst: lease.Burst}
			if lease.Renewed {
				res.Renewals++
			} else {
				res.Grants++
			}
		}
		c.sent, c.sentAt, c.hasSent = want, now, true
		// One stream per consumer: responses arrive in order.
		arrive := now + time.Duration(rng.Int64N(int64(cfg.Delay)+1))
		if n := len(c.pending); n > 0 {
			arrive = max(arrive, c.pending[n-1].at)
		}
		c.pending = append(c.pending, leaseDelivery{at: arrive, shape: want})
	}
	return nil
}
