package rlqs

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/policy"
)

// Server serves envoy.service.rate_limit_quota.v3.RateLimitQuotaService.
// See the package doc.
type Server struct {
	rlqsv3.UnimplementedRateLimitQuotaServiceServer
	cfg Config
	m   *metrics

	mu          sync.Mutex
	streams     map[uint64]*stream
	groups      map[bucket.Key]*group
	holds       map[string]map[string]*hold // policy → holder → hold
	nextID      uint64
	draining    bool
	drained     chan struct{} // closed by Drain: streams end
	closedDrain bool
	set         *policy.Set // the policies the consumers were resolved against

	nonce   string
	wake    chan struct{}
	reports atomic.Uint64 // usage reports handled, for tests and metrics
	rounds  atomic.Uint64
}

// stream is one Envoy's stream.
type stream struct {
	id      uint64
	domain  string
	buckets map[string]*consumer
	out     chan *rlqsv3.RateLimitQuotaResponse
	closed  bool
	seq     uint64 // buckets subscribed so far

	// lastReport is when the Envoy last reported; dropped that a response
	// was not queued since the last one that was (see stalled).
	lastReport time.Time
	dropped    bool
}

// stalled reports whether ss's Envoy may not be reading what the node
// sends (a paused process): it has not reported for two intervals and the
// margin, or its queue is full or dropped a response. Assignments sent
// before may then still wait in the stream's flow-control window and be
// applied, each with its full TTL, whenever the Envoy reads again, so the
// node neither changes nor abandons its buckets while ss stalls: it
// renews their leases as they are. The caller holds mu.
func (s *Server) stalled(ss *stream, now time.Time) bool {
	return ss.dropped || len(ss.out) == cap(ss.out) || now.Sub(ss.lastReport) > 2*s.cfg.Interval+s.cfg.Margin
}

// kind is what a bucket id resolved to.
type kind uint8

const (
	kindLeased      kind = iota // a token-bucket policy: assignments are leases
	kindAllow                   // no rule, unlimited, shadow or replaced: ALLOW_ALL
	kindUnsupported             // a window policy or a descriptor Match refuses: no assignment
)

// consumer is one bucket of one stream.
type consumer struct {
	s      *stream
	id     map[string]string
	key    string
	holder string
	kind   kind
	g      *group // kindLeased only

	demand     float64 // requests per second, smoothed
	reported   bool
	lastReport time.Time
	lastUse    time.Time

	// What was last sent, and the lease behind it.
	sent      sentAssignment
	hasSent   bool
	leased    bool
	rate      float64 // the lease's rate as granted (renewals name it)
	burst     int64
	sentAt    time.Time
	freshFrac float64 // the share in force at the last fresh lease
}

// sentAssignment is an assignment's strategy, compared to tell a renewal
// (the filter keeps its token state) from a change (a new, full bucket).
type sentAssignment struct {
	deny, allow bool
	tb          tokenBucket
}

// group is the consumers of one region bucket (policy version and subject).
type group struct {
	key       bucket.Key
	pol       *policy.Policy
	subject   bucket.Subject
	consumers map[*consumer]struct{}
	// born is when the group's first consumer subscribed: for one
	// assignment's length (TTL + margin) the group settles (see round).
	born time.Time
}

// hold is what HeldAbove needs of one holder's lease: the share it was
// taken at and when it ends, and the same of the lease it replaced.
type hold struct {
	subject              string
	share, prevShare     float64
	expiry, prevEnd      time.Time
	policyName, holderID string
}

// New returns a Server; Run re-splits and sends assignments.
func New(cfg Config) (*Server, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	return &Server{
		cfg: cfg, m: m,
		streams: map[uint64]*stream{},
		groups:  map[bucket.Key]*group{},
		holds:   map[string]map[string]*hold{},
		wake:    make(chan struct{}, 1),
		drained: make(chan struct{}),
		nonce:   nonce(),
	}, nil
}

// Register adds the service to a gRPC server.
func (s *Server) Register(g grpc.ServiceRegistrar) {
	rlqsv3.RegisterRateLimitQuotaServiceServer(g, s)
}

// Reports returns how many usage reports (bucket entries) the server has
// handled; Rounds how many re-splits it has run.
func (s *Server) Reports() uint64 { return s.reports.Load() }

// Rounds returns how many re-split rounds have completed.
func (s *Server) Rounds() uint64 { return s.rounds.Load() }

// StreamRateLimitQuotas serves one Envoy's stream: reports in, assignments
// out. It returns when the stream ends; the stream's leases lapse at
// their ends.
func (s *Server) StreamRateLimitQuotas(st grpc.BidiStreamingServer[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]) error {
	ss, err := s.open()
	if err != nil {
		return err
	}
	defer s.close(ss)
	errc := make(chan error, 1)
	go func() {
		for {
			r, err := st.Recv()
			if err == nil {
				err = s.handle(ss, r)
			}
			if err != nil {
				errc <- err
				return
			}
		}
	}()
	for {
		select {
		case resp := <-ss.out:
			if err := st.Send(resp); err != nil {
				return err
			}
		case err := <-errc:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-st.Context().Done():
			return st.Context().Err()
		case <-s.drained:
			// Send what Drain queued (TTL 0), then end the stream: the
			// Envoy reconnects, to another node when this one stops.
			for {
				select {
				case resp := <-ss.out:
					if err := st.Send(resp); err != nil {
						return err
					}
				default:
					return status.Error(codes.Unavailable, "rlqs: node draining")
				}
			}
		}
	}
}

func (s *Server) open() (*stream, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.streams) >= s.cfg.MaxStreams {
		s.m.refused.Inc()
		return nil, status.Errorf(codes.ResourceExhausted, "rlqs: %d streams held, at most %d", len(s.streams), s.cfg.MaxStreams)
	}
	if s.draining {
		return nil, status.Error(codes.Unavailable, "rlqs: draining")
	}
	s.nextID++
	ss := &stream{id: s.nextID, buckets: map[string]*consumer{}, out: make(chan *rlqsv3.RateLimitQuotaResponse, 4), lastReport: s.cfg.Clock.Now()}
	s.streams[ss.id] = ss
	s.m.streams.Set(float64(len(s.streams)))
	return ss, nil
}

// close forgets a stream's buckets. Their leases are not released: the
// Envoy keeps enforcing its assignments until their TTL, and the leases
// end then.
func (s *Server) close(ss *stream) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss.closed = true
	for _, c := range ss.buckets {
		s.forget(c)
	}
	delete(s.streams, ss.id)
	s.m.streams.Set(float64(len(s.streams)))
}

// forget removes c from its group; the caller holds mu.
func (s *Server) forget(c *consumer) {
	delete(c.s.buckets, c.key)
	if c.g != nil {
		delete(c.g.consumers, c)
		if len(c.g.consumers) == 0 {
			delete(s.groups, c.g.key)
		}
	}
	s.m.buckets.Dec()
}

// handle applies one message of a stream.
func (s *Server) handle(ss *stream, r *rlqsv3.RateLimitQuotaUsageReports) error {
	now := s.cfg.Clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if ss.closed {
		return nil
	}
	s.refreshPolicies(now) // a moved consumer's old lease lapses at its end
	switch d := r.GetDomain(); {
	case ss.domain == "" && (d == "" || len(d) > policy.MaxDomainBytes):
		return status.Errorf(codes.InvalidArgument, "rlqs: the first message must name a domain of 1 to %d bytes", policy.MaxDomainBytes)
	case ss.domain == "":
		ss.domain = d
	case d != "" && d != ss.domain:
		return status.Errorf(codes.InvalidArgument, "rlqs: domain %q on a stream of domain %q: open another stream", d, ss.domain)
	}
	ss.lastReport = now
	woke := false
	for i, u := range r.GetBucketQuotaUsages() {
		id := u.GetBucketId().GetBucket()
		if err := s.validID(id); err != nil {
			return status.Errorf(codes.InvalidArgument, "rlqs: usage %d: %v", i, err)
		}
		s.reports.Add(1)
		s.m.reports.Inc()
		key := idKey(id)
		c := ss.buckets[key]
		if c == nil {
			if len(ss.buckets) >= s.cfg.MaxBuckets {
				s.m.overflow.Inc()
				continue
			}
			c = s.subscribe(ss, id, key, now)
			woke = true
		}
		elapsed := u.GetTimeElapsed().AsDuration()
		var measured time.Duration
		if c.reported {
			measured = now.Sub(c.lastReport)
		}
		d := demandRate(u.GetNumRequestsAllowed(), u.GetNumRequestsDenied(), elapsed, measured, s.cfg.Interval)
		if c.reported {
			c.demand = 0.5*c.demand + 0.5*d
		} else {
			c.demand = d
		}
		c.reported, c.lastReport = true, now
		if u.GetNumRequestsAllowed()+u.GetNumRequestsDenied() > 0 {
			c.lastUse = now
		}
		s.recordDemand(c, u.GetNumRequestsAllowed(), u.GetNumRequestsDenied(), d)
	}
	if woke {
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
	return nil
}

// recordDemand passes one usage report of c (rate d requests per second)
// to Config.Demand; the caller holds mu.
func (s *Server) recordDemand(c *consumer, allowed, denied uint64, d float64) {
	if s.cfg.Demand == nil || c.kind != kindLeased || c.g == nil {
		return
	}
	pressured := denied > 0 || !c.leased || d >= c.rate/2
	name, subject := c.g.pol.Name, c.g.subject.String()
	if allowed > 0 {
		s.cfg.Demand.Record(name, subject, int64(min(allowed, math.MaxInt64)), true, pressured)
	}
	if denied > 0 {
		s.cfg.Demand.Record(name, subject, int64(min(denied, math.MaxInt64)), false, pressured)
	}
}

func (s *Server) validID(id map[string]string) error {
	if len(id) == 0 || len(id) > MaxBucketIDEntries {
		return fmt.Errorf("bucket id of %d entries, want 1 to %d", len(id), MaxBucketIDEntries)
	}
	n := 0
	for k, v := range id {
		if k == "" {
			return errors.New("bucket id with an empty key")
		}
		n += len(k) + len(v)
	}
	if n > s.cfg.MaxBucketIDBytes {
		return fmt.Errorf("bucket id of %d bytes, at most %d", n, s.cfg.MaxBucketIDBytes)
	}
	return nil
}

// subscribe resolves a new bucket id to a policy and subject, as the
// Envoy rate limit service matches a descriptor; the caller holds mu.
func (s *Server) subscribe(ss *stream, id map[string]string, key string, now time.Time) *consumer {
	// Holder names are unique across this node's processes (the nonce):
	// a lease of an earlier process's stream may still be in use.
	ss.seq++
	c := &consumer{s: ss, id: id, key: key, lastUse: now,
		holder: s.cfg.Node + "." + s.nonce + "." + strconv.FormatUint(ss.id, 36) + "." + strconv.FormatUint(ss.seq, 36)}
	ss.buckets[key] = c
	s.m.buckets.Inc()
	s.resolve(c, now)
	return c
}

// resolve matches c's bucket id against the current policies and puts it
// in its group; the caller holds mu. A consumer that moves to another
// group (a policy edit) is left unleased: its next lease is a fresh one.
func (s *Server) resolve(c *consumer, now time.Time) {
	old := c.g
	if old != nil {
		delete(old.consumers, c)
		if len(old.consumers) == 0 {
			delete(s.groups, old.key)
		}
	}
	c.g, c.kind = nil, kindUnsupported
	defer func() {
		if c.g != old {
			c.leased, c.rate, c.burst = false, 0, 0
		}
	}()
	ms, err := s.set.Match(c.s.domain, [][]policy.Entry{descriptor(c.id, s.cfg.KeyOrder)}, s.cfg.Subjects)
	switch {
	case err != nil:
		s.cfg.Logger.Debug("bucket id is not a descriptor the policies take", "error", err)
		s.m.unsupported.Inc()
	case ms[0].Policy == nil || ms[0].Unlimited || ms[0].Shadow || ms[0].Replaced:
		c.kind = kindAllow
	case ms[0].Policy.Limits.Algorithm != bucket.TokenBucket || bucket.MaxLeaseFor(ms[0].Policy.Limits) < s.cfg.TTL+s.cfg.Margin:
		s.cfg.Logger.Debug("bucket id matches a policy that cannot be leased", "policy", ms[0].Policy.Name)
		s.m.unsupported.Inc()
	default:
		p := ms[0].Policy
		req, err := s.cfg.Request(p, ms[0].BucketSubject, now)
		if err != nil {
			s.m.unsupported.Inc()
			break
		}
		g := s.groups[req.Key]
		if g == nil {
			g = &group{key: req.Key, pol: p, subject: ms[0].BucketSubject, consumers: map[*consumer]struct{}{}, born: now}
			s.groups[req.Key] = g
		}
		if len(g.consumers) >= MaxConsumers {
			s.m.overflow.Inc()
			break
		}
		g.consumers[c] = struct{}{}
		c.g, c.kind = g, kindLeased
	}
}

// Run re-splits every Interval (and at once when a bucket subscribes)
// until ctx ends, then drains: every assignment is sent again with TTL 0
// (the filter falls back to its expired-assignment behaviour) and the
// leases end a TTL plus the margin later.
func (s *Server) Run(ctx context.Context) error {
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			s.Drain(context.WithoutCancel(ctx))
			return nil
		case <-t.C:
		case <-s.wake:
		}
		s.Step(ctx)
	}
}

// plan is one consumer's part of a round, decided without the lock.
type plan struct {
	c       *consumer
	demand  float64
	prev    sentAssignment
	hasPrev bool
	leased  bool
	rate    float64
	burst   int64
	sentAt  time.Time
	fresh   float64 // share at the last fresh lease
	abandon bool
	stalled bool // keep the assignment in force (see Server.stalled)
}

// Step runs one round: abandons idle buckets, splits each leased bucket's
// rate among its consumers by demand, takes or renews their leases and
// sends every stream its assignments.
func (s *Server) Step(ctx context.Context) {
	now := s.cfg.Clock.Now()
	type work struct {
		g     *group
		plans []plan
	}
	var works []work
	var others []plan
	s.mu.Lock()
	if s.draining {
		s.mu.Unlock()
		return
	}
	moved := s.refreshPolicies(now)
	idle := func(c *consumer) bool { return now.Sub(c.lastUse) >= s.cfg.IdleAfter && !s.stalled(c.s, now) }
	for _, ss := range s.streams {
		for _, c := range ss.buckets {
			if idle(c) {
				others = append(others, plan{c: c, abandon: true, leased: c.leased})
				continue
			}
			if c.kind != kindLeased {
				others = append(others, plan{c: c})
			}
		}
	}
	for _, g := range s.groups {
		w := work{g: g}
		for c := range g.consumers {
			if idle(c) {
				continue
			}
			w.plans = append(w.plans, plan{c: c, demand: c.demand, prev: c.sent, hasPrev: c.hasSent, leased: c.leased,
				rate: c.rate, burst: c.burst, sentAt: c.sentAt, fresh: c.freshFrac, stalled: s.stalled(c.s, now)})
		}
		works = append(works, w)
	}
	s.mu.Unlock()

	for _, m := range moved {
		s.releaseLease(ctx, m)
	}
	actions := map[*consumer]*rlqsv3.RateLimitQuotaResponse_BucketAction{}
	results := map[*consumer]plan{}
	for i := range others {
		p := &others[i]
		if p.abandon {
			if p.leased {
				s.release(ctx, p.c)
			}
			actions[p.c] = &rlqsv3.RateLimitQuotaResponse_BucketAction{
				BucketId:     &rlqsv3.BucketId{Bucket: p.c.id},
				BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}},
			}
			continue
		}
		if p.c.kind == kindAllow {
			actions[p.c] = s.assignment(p.c.id, sentAssignment{allow: true}, s.cfg.TTL)
		}
	}
	var rounds []*groupRound
	for _, w := range works {
		if r := s.prepare(ctx, now, w.g, w.plans, actions, results); r != nil {
			rounds = append(rounds, r)
		}
	}
	s.renewAll(ctx, rounds)
	for _, r := range rounds {
		s.finish(ctx, now, r, actions, results)
	}

	s.mu.Lock()
	out := map[*stream][]*rlqsv3.RateLimitQuotaResponse_BucketAction{}
	for c, a := range actions {
		if c.s.closed || c.s.buckets[c.key] != c {
			continue
		}
		if _, ok := a.BucketAction.(*rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_); ok {
			s.forget(c)
			s.m.abandoned.Inc()
		} else if r, ok := results[c]; ok {
			if c.hasSent && r.prev != c.sent {
				s.m.changes.Inc()
			}
			c.sent, c.hasSent, c.leased, c.rate, c.burst, c.sentAt, c.freshFrac = r.prev, true, r.leased, r.rate, r.burst, now, r.fresh
		}
		out[c.s] = append(out[c.s], a)
	}
	s.sendLocked(out)
	s.pruneHolds(now)
	var leased float64
	for _, g := range s.groups {
		for c := range g.consumers {
			if c.leased {
				leased += c.rate
			}
		}
	}
	s.m.leased.Set(leased)
	s.mu.Unlock()
	s.rounds.Add(1)
}

// groupRound is one group's round once its rate is split: the bucket
// request and, in lease order, what each consumer is to be sent.
type groupRound struct {
	g     *group
	req   bucket.Request
	share float64
	steps []roundStep
}

// roundStep is one consumer's part of a round: the assignment it is to
// get, whether its lease is renewed first (and the renewal's answer, from
// the round's batch), or a DENY_ALL.
type roundStep struct {
	p        *plan
	want     sentAssignment
	deny     bool
	renew    bool
	renewal  bucket.Lease
	renewErr error
}

// prepare splits one group's rate among its consumers and decides what
// each is to be sent; nil when nothing is left to lease (the policies
// changed under the round, or everything was kept or denied at once).
func (s *Server) prepare(ctx context.Context, now time.Time, g *group, plans []plan, actions map[*consumer]*rlqsv3.RateLimitQuotaResponse_BucketAction, results map[*consumer]plan) *groupRound {
	if len(plans) == 0 {
		return nil
	}
	req, err := s.cfg.Request(g.pol, g.subject, now)
	if err != nil || req.Key != g.key {
		// The policies changed under the round: the next one resolves
		// the consumers again.
		return nil
	}
	l, share := req.Limits, req.Share
	plans, kept := s.keepStalled(ctx, now, g, req, plans, actions, results)
	if share <= 0 {
		for i := range plans {
			s.deny(ctx, now, &plans[i], actions, results)
		}
		return nil
	}
	avail := max(0, share*l.RefillPerSecond*(1-s.cfg.Reserve)*s.part(g)-kept)
	demands := make([]float64, len(plans))
	for i := range plans {
		demands[i] = plans[i].demand
	}
	rates := split(avail, demands)
	// While the group settles, each consumer gets at most 1/(n+1) of the
	// rate, n the consumers so far: Envoys of one fleet subscribe within a
	// reporting interval of each other, and a first assignment of the
	// whole rate would hold it (and its burst) to its end, leaving those
	// that follow DENY_ALL.
	if now.Sub(g.born) < s.cfg.TTL+s.cfg.Margin {
		for i := range rates {
			rates[i] = min(rates[i], avail/float64(len(plans)+1))
		}
	}
	// Shrinks first: the rate they give up becomes free once their old
	// leases' cut passes.
	order := make([]int, len(plans))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		da, db := rates[a]-plans[a].rate, rates[b]-plans[b].rate
		switch {
		case da < db:
			return -1
		case da > db:
			return 1
		}
		return 0
	})
	r := &groupRound{g: g, req: req, share: share}
	for _, i := range order {
		p := &plans[i]
		tb, ok := tokenBucketFor(rates[i])
		// The burst is at most the region's capacity f·C (a rate above
		// it refills continuously all the same).
		tb.MaxTokens = uint32(min(float64(tb.MaxTokens), math.Floor(share*float64(l.Capacity))))
		if !ok || tb.MaxTokens == 0 {
			r.steps = append(r.steps, roundStep{p: p, deny: true})
			continue
		}
		want := sentAssignment{tb: tb}
		// A dead band: every change costs a fresh burst (the filter starts
		// a new, full bucket), so a rate within DeadBand of the one in
		// force keeps it.
		// A stalled stream keeps the assignment in force.
		if p.leased && p.hasPrev && !p.prev.deny && !p.prev.allow && (p.stalled || math.Abs(rates[i]-p.prev.tb.rate()) <= DeadBand*p.prev.tb.rate() && p.prev.tb.MaxTokens <= tb.MaxTokens+p.prev.tb.MaxTokens/5) {
			want = p.prev
		}
		// A renewal keeps the Envoy's token state: only when the same
		// assignment is still live there when this one arrives (or the
		// stream stalls: what it holds arrives with a fresh TTL), and was
		// leased at no more than the share now in force.
		renew := p.leased && p.hasPrev && p.prev == want && (p.stalled || now.Add(s.cfg.Margin).Before(p.sentAt.Add(s.cfg.TTL))) && p.fresh <= share
		r.steps = append(r.steps, roundStep{p: p, want: want, renew: renew})
	}
	return r
}

// part is this node's part of g's bucket (Config.Part), 1 without one
// or when it answers outside (0, 1].
func (s *Server) part(g *group) float64 {
	if s.cfg.Part == nil {
		return 1
	}
	if p := s.cfg.Part(g.pol.Name, g.subject.String()); p > 0 && p <= 1 {
		return p
	}
	return 1
}

// renewAll sends every renewal the rounds ask for, in one batch when the
// store takes batches (bucket.BatchLeaser: one Redis round trip per
// bucket.MaxLeaseBatch leases), and records each answer in its step. A
// renewal's answer does not depend on the other consumers' fresh leases
// of the round (a consumer whose lease shrinks counts at its old rate to
// the cut), so sending the renewals before them changes no grant.
func (s *Server) renewAll(ctx context.Context, rounds []*groupRound) {
	var reqs []bucket.LeaseRequest
	var steps []*roundStep
	for _, r := range rounds {
		for i := range r.steps {
			st := &r.steps[i]
			if !st.renew {
				continue
			}
			reqs = append(reqs, bucket.LeaseRequest{Request: r.req, Holder: st.p.c.holder, Rate: st.p.rate, Burst: st.p.burst,
				For: s.cfg.TTL + s.cfg.Margin, Cut: s.cfg.Margin, Renew: true})
			steps = append(steps, st)
		}
	}
	if len(reqs) == 0 {
		return
	}
	if b, ok := s.cfg.Store.(bucket.BatchLeaser); ok {
		leases, errs := b.LeaseAll(ctx, reqs)
		for i, st := range steps {
			st.renewal, st.renewErr = leases[i], errs[i]
		}
		return
	}
	for i, st := range steps {
		st.renewal, st.renewErr = s.cfg.Store.Lease(ctx, reqs[i])
	}
}

// finish leases each consumer's part of a prepared round, in its order: a
// renewal granted is kept, anything else takes a fresh lease.
func (s *Server) finish(ctx context.Context, now time.Time, r *groupRound, actions map[*consumer]*rlqsv3.RateLimitQuotaResponse_BucketAction, results map[*consumer]plan) {
	g, req, share := r.g, r.req, r.share
	for i := range r.steps {
		st := &r.steps[i]
		p, want := st.p, st.want
		if st.deny {
			s.deny(ctx, now, p, actions, results)
			continue
		}
		if st.renew {
			if st.renewErr == nil && st.renewal.Granted && st.renewal.Renewed {
				s.grant(now, p, g, share, want, st.renewal, false, actions, results)
				continue
			}
			if st.renewErr != nil {
				s.cfg.Logger.Warn("lease renewal failed", "policy", g.pol.Name, "error", st.renewErr)
			}
		}
		tb := want.tb
		// The previous assignment stays counted to its own end: an Envoy
		// whose stream is cut before this one arrives keeps enforcing it
		// until its TTL.
		lease, err := s.cfg.Store.Lease(ctx, bucket.LeaseRequest{Request: req, Holder: p.c.holder, Rate: tb.rate(), Burst: int64(tb.MaxTokens),
			For: s.cfg.TTL + s.cfg.Margin, Cut: s.cfg.TTL + s.cfg.Margin})
		if err != nil {
			s.cfg.Logger.Warn("lease failed", "policy", g.pol.Name, "error", err)
			s.deny(ctx, now, p, actions, results)
			continue
		}
		if !lease.Granted {
			s.m.leaseDenied.Inc()
			s.deny(ctx, now, p, actions, results)
			continue
		}
		if lease.Rate < tb.rate() {
			// Part of the rate is still held by other leases: enforce
			// what was granted (the lease records more, which is safe).
			got, ok := tokenBucketFor(lease.Rate)
			if !ok {
				s.deny(ctx, now, p, actions, results)
				continue
			}
			got.MaxTokens = min(got.MaxTokens, tb.MaxTokens)
			want = sentAssignment{tb: got}
		}
		s.grant(now, p, g, share, want, lease, true, actions, results)
	}
}

// keepStalled keeps, as they are, the leases of the consumers whose
// stream stalls holding an assignment leased above the share now in
// force: whatever waits in such a stream (renewals of that assignment)
// may be applied at any time, each with a full TTL, so the lease must
// keep counting against the region's bucket (bucket.LeaseRequest.Keep)
// and the shrink must not be acknowledged (the hold keeps the old share
// and an end a TTL and the margin ahead: HeldAbove). Once the stream
// reads again, the next round replaces the assignment as for any shrink.
// It returns the other plans and the rate the kept leases hold; a lease
// the store no longer holds goes the usual way.
func (s *Server) keepStalled(ctx context.Context, now time.Time, g *group, req bucket.Request, plans []plan,
	actions map[*consumer]*rlqsv3.RateLimitQuotaResponse_BucketAction, results map[*consumer]plan) ([]plan, float64) {
	rest := plans[:0:0]
	kept := 0.0
	for i := range plans {
		p := &plans[i]
		if !p.stalled || !p.leased || !p.hasPrev || p.prev.deny || p.prev.allow || p.fresh <= req.Share+1e-12 {
			rest = append(rest, *p)
			continue
		}
		lease, err := s.cfg.Store.Lease(ctx, bucket.LeaseRequest{Request: req, Holder: p.c.holder, Rate: p.rate, Burst: p.burst,
			For: s.cfg.TTL + s.cfg.Margin, Cut: s.cfg.Margin, Renew: true, Keep: true})
		if err != nil || !lease.Renewed {
			if err != nil {
				s.cfg.Logger.Warn("keeping a stalled stream's lease failed", "policy", g.pol.Name, "error", err)
			}
			rest = append(rest, *p)
			continue
		}
		s.m.kept.Inc()
		s.grant(now, p, g, p.fresh, p.prev, lease, false, actions, results)
		kept += lease.Rate
	}
	return rest, kept
}

// grant records a lease and the assignment that goes with it.
func (s *Server) grant(now time.Time, p *plan, g *group, share float64, a sentAssignment, l bucket.Lease, fresh bool, actions map[*consumer]*rlqsv3.RateLimitQuotaResponse_BucketAction, results map[*consumer]plan) {
	r := *p
	r.prev, r.leased, r.rate, r.burst = a, true, l.Rate, l.Burst
	if fresh {
		r.fresh = share
	}
	results[p.c] = r
	actions[p.c] = s.assignment(p.c.id, a, s.cfg.TTL)
	s.mu.Lock()
	hs := s.holds[g.pol.Name]
	if hs == nil {
		hs = map[string]*hold{}
		s.holds[g.pol.Name] = hs
	}
	h := hs[p.c.holder]
	if h == nil {
		h = &hold{subject: g.key.Subject(), policyName: g.pol.Name, holderID: p.c.holder}
		hs[p.c.holder] = h
	}
	end := now.Add(s.cfg.TTL + s.cfg.Margin)
	if fresh {
		h.prevShare, h.prevEnd = h.share, h.expiry
		h.share = share
	}
	h.expiry = end
	s.mu.Unlock()
}

// deny answers DENY_ALL (no lease) and ends the consumer's lease a TTL
// plus the margin later (see release).
func (s *Server) deny(ctx context.Context, now time.Time, p *plan, actions map[*consumer]*rlqsv3.RateLimitQuotaResponse_BucketAction, results map[*consumer]plan) {
	if p.leased {
		s.release(ctx, p.c)
	}
	r := *p
	r.prev, r.leased, r.rate, r.burst = sentAssignment{deny: true}, false, 0, 0
	results[p.c] = r
	actions[p.c] = s.assignment(p.c.id, r.prev, s.cfg.TTL)
}

// leaseRef names one holder's lease on one group's bucket.
type leaseRef struct {
	g      *group
	holder string
}

// release ends c's lease once the last assignment sent for it can no
// longer be in force: the Envoy may never receive what replaces it (a cut
// stream, a dropped response), so the lease lasts to that assignment's
// TTL plus the margin from its send.
func (s *Server) release(ctx context.Context, c *consumer) {
	if c.g != nil {
		s.releaseLease(ctx, leaseRef{c.g, c.holder})
	}
}

func (s *Server) releaseLease(ctx context.Context, r leaseRef) {
	now := s.cfg.Clock.Now()
	req, err := s.cfg.Request(r.g.pol, r.g.subject, now)
	if err == nil {
		req.Key, req.Limits, req.Share = r.g.key, r.g.pol.Limits, max(req.Share, 1e-9)
		_, err = s.cfg.Store.Release(ctx, bucket.LeaseRelease{Request: req, Holder: r.holder, Within: s.cfg.TTL + s.cfg.Margin})
	}
	if err != nil {
		s.cfg.Logger.Warn("lease release failed; it ends at its expiry", "error", err)
	}
	s.mu.Lock()
	if h := s.holds[r.g.pol.Name][r.holder]; h != nil {
		h.expiry = minTime(h.expiry, now.Add(s.cfg.TTL+s.cfg.Margin))
	}
	s.mu.Unlock()
}

// refreshPolicies resolves every consumer again when the policy set
// changed, and returns the leases of those that moved to another bucket
// (to be released); the caller holds mu.
func (s *Server) refreshPolicies(now time.Time) []leaseRef {
	set := s.cfg.Policies()
	if set == s.set {
		return nil
	}
	s.set = set
	var moved []leaseRef
	for _, ss := range s.streams {
		for _, c := range ss.buckets {
			g, leased := c.g, c.leased
			s.resolve(c, now)
			if leased && c.g != g {
				moved = append(moved, leaseRef{g, c.holder})
			}
		}
	}
	return moved
}

// assignment builds a quota assignment action.
func (s *Server) assignment(id map[string]string, a sentAssignment, ttl time.Duration) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	var st *typev3.RateLimitStrategy
	switch {
	case a.allow:
		st = &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_ALLOW_ALL}}
	case a.deny:
		st = &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}}
	default:
		st = &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
			MaxTokens: a.tb.MaxTokens, TokensPerFill: wrapperspb.UInt32(a.tb.PerFill), FillInterval: durationpb.New(a.tb.Fill)}}}
	}
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{
		BucketId: &rlqsv3.BucketId{Bucket: id},
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
			AssignmentTimeToLive: durationpb.New(ttl), RateLimitStrategy: st}},
	}
}

// sendLocked queues one response per stream; a stream whose queue is full
// (it does not read) misses this round: its assignments expire unless a
// later round reaches it. The caller holds mu.
func (s *Server) sendLocked(out map[*stream][]*rlqsv3.RateLimitQuotaResponse_BucketAction) {
	for ss, acts := range out {
		slices.SortFunc(acts, func(a, b *rlqsv3.RateLimitQuotaResponse_BucketAction) int {
			ka, kb := idKey(a.GetBucketId().GetBucket()), idKey(b.GetBucketId().GetBucket())
			switch {
			case ka < kb:
				return -1
			case ka > kb:
				return 1
			}
			return 0
		})
		select {
		case ss.out <- &rlqsv3.RateLimitQuotaResponse{BucketAction: acts}:
			ss.dropped = false
		default:
			ss.dropped = true
			s.m.dropped.Inc()
		}
	}
}

// Drain sends every bucket its assignment again with TTL 0, so that each
// Envoy falls back to its expired-assignment behaviour at once (before
// this node stops), and ends the leases a TTL plus the margin later. No round runs
// after it.
func (s *Server) Drain(ctx context.Context) {
	s.mu.Lock()
	s.draining = true
	var leased []*consumer
	out := map[*stream][]*rlqsv3.RateLimitQuotaResponse_BucketAction{}
	for _, ss := range s.streams {
		for _, c := range ss.buckets {
			if c.hasSent {
				out[ss] = append(out[ss], s.assignment(c.id, c.sent, 0))
			}
			if c.leased {
				leased = append(leased, c)
			}
		}
	}
	s.sendLocked(out)
	if !s.closedDrain {
		s.closedDrain = true
		close(s.drained)
	}
	s.mu.Unlock()
	for _, c := range leased {
		s.release(ctx, c)
	}
}

// HeldAbove returns when the last lease of policy taken above the share
// that share(subject) reports now ends (zero when none): a node
// acknowledges a shrink of policy's share only after it. It counts each
// holder's current lease and the one it replaced (which stays in use
// until the margin after the replacement was sent).
func (s *Server) HeldAbove(policyName string, share func(subject string) float64) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	var until time.Time
	for _, h := range s.holds[policyName] {
		f := share(h.subject) + 1e-12
		if h.share > f && h.expiry.After(until) {
			until = h.expiry
		}
		if h.prevShare > f && h.prevEnd.After(until) {
			until = h.prevEnd
		}
	}
	return until
}

// pruneHolds drops holds whose leases have all ended; the caller holds mu.
func (s *Server) pruneHolds(now time.Time) {
	for p, hs := range s.holds {
		for id, h := range hs {
			if !h.expiry.After(now) && !h.prevEnd.After(now) {
				delete(hs, id)
			}
		}
		if len(hs) == 0 {
			delete(s.holds, p)
		}
	}
}

// nonce returns 8 random base-36 characters.
func nonce() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	const digits = "0123456789abcdefghijklmnopqrstuvwxyz"
	for i := range b {
		b[i] = digits[int(b[i])%len(digits)]
	}
	return string(b[:])
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
