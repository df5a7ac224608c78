package regional

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/policy"
)

// errBreakerOpen stands for the store's error while the breaker is open.
var errBreakerOpen = errors.New("regional: store circuit breaker open")

// Node decides admission checks for one region. Build it with New, give it
// policies with SetPolicies, and serve it with Register (gRPC) and Handler
// (HTTP). A Node is safe for concurrent use.
type Node struct {
	cfg Config
	set atomic.Pointer[policy.Set]
	// fingerprint is fingerprintOf the current policies (a string).
	fingerprint atomic.Value
	// pins is Config.Shares when it pins (nil otherwise): asserted once
	// here so that a check pays no interface assertion.
	pins PinnedShareSource
	// nodes is Config.Shares when it counts the region's nodes, nil when
	// this node is the whole region.
	nodes RegionNodes
	// history is Config.Shares when it remembers past shares, nil when
	// shares never change.
	history ShareHistory
	brk     *breaker
	neg     *negativeCache
	replay  *replayCache
	live    *liveSubjects
	m       *metrics
	tracer  trace.Tracer
	// tracing is false with the no-op provider: spans are then not started
	// at all (starting a no-op span still allocates its options and context).
	tracing bool
	log     hclog.Logger
	// envoySubj turns Envoy descriptor values into subjects: salted
	// hashes except for Config.EnvoyPlainKeys.
	envoySubj policy.EnvoySubjects
	// access is what callers may do, swapped whole by SetGrants.
	access   atomic.Pointer[access]
	inflight *inflight

	deadlines   *deadlines // of store calls (see callStore)
	takeLatency prometheus.Observer
	// apiOps holds the bucket operations counter of each API the node
	// serves (see admitOps), looked up once: a vector lookup hashes the
	// label on every check. Read-only after New.
	apiOps map[string]prometheus.Counter
	// states caches what checks read of each policy (see stateOf):
	// *policy.Policy -> *policyState.
	states     sync.Map
	nstates    atomic.Int64
	decisionN  atomic.Uint64
	lastDegLog atomic.Int64
	degSkipped atomic.Int64
	draining   atomic.Bool // see Drain
	// leases decides hot subjects of leasable policies in memory (nil
	// when the store cannot lease), see nodelease.go.
	leases *nodeLeases
	// versions tells a check when its policy's key version changed (see
	// keyVersions), for bucket.Request.Since.
	versions keyVersions
}

// New validates cfg, fills in its defaults and returns a Node without
// policies (not ready until SetPolicies). It starts no goroutines.
func New(cfg Config) (*Node, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	n := &Node{
		cfg:     cfg,
		brk:     newBreaker(cfg.BreakerThreshold, cfg.BreakerCooldown),
		neg:     newNegativeCache(cfg.NegativeCacheSize),
		replay:  newReplayCache(cfg.IdempotencySize, cfg.IdempotencyTTL),
		live:    newLiveSubjects(cfg.MaxLiveSubjects),
		m:       m,
		tracer:  cfg.TracerProvider.Tracer("github.com/quotacoord/quota/internal/regional"),
		tracing: !isNoopProvider(cfg.TracerProvider),
		log:     cfg.Logger,

		envoySubj: policy.EnvoySubjects{Salt: cfg.SubjectSalt, PlainKeys: cfg.EnvoyPlainKeys},
		inflight:  newInflight(cfg.CallerMaxInflight),
	}
	n.SetGrants(cfg.Grants, cfg.Tokens)
	if cfg.saltGenerated {
		n.log.Warn("no subject salt given: hashing subjects with a random salt of this process only; " +
			"nodes sharing a Redis must share a salt (-subject-salt, or -etcd to share one through etcd), " +
			"and a restart starts every hashed bucket afresh")
	}
	n.takeLatency = m.storeLatency.WithLabelValues("take_all")
	n.apiOps = make(map[string]prometheus.Counter)
	for _, api := range []string{"admission", "envoy"} {
		n.apiOps[api] = m.bucketOps.WithLabelValues(api)
	}
	n.deadlines = newDeadlines(cfg.StoreTimeout)
	if ps, ok := cfg.Shares.(PinnedShareSource); ok {
		n.pins = ps
	}
	if rn, ok := cfg.Shares.(RegionNodes); ok {
		n.nodes = rn
	}
	if sh, ok := cfg.Shares.(ShareHistory); ok {
		n.history = sh
	}
	n.leases = newNodeLeases(n, cfg.Store)
	return n, nil
}

// SetPolicies swaps in a new policy set; checks already running finish
// with the set they started with. A nil set is ignored.
func (n *Node) SetPolicies(s *policy.Set) {
	if s == nil {
		return
	}
	n.versions.update(s, n.cfg.Clock.Now())
	n.set.Store(s)
	n.fingerprint.Store(fingerprintOf(s, &n.cfg))
	n.live.forget(s)
	// The old policies' states hold their live subjects: let them go.
	n.states.Clear()
	n.nstates.Store(0)
	n.m.policies.Set(float64(s.Len()))
	n.RefreshShareGauges()
}

// Policies returns the current policy set, nil before the first.
func (n *Node) Policies() *policy.Set { return n.set.Load() }

// RefreshShareGauges republishes the default share of every policy (the
// share of a subject without an override, asked with an empty subject).
func (n *Node) RefreshShareGauges() {
	s := n.set.Load()
	if s == nil {
		return
	}
	n.m.shares.Reset()
	for _, p := range s.Policies() {
		n.m.shares.WithLabelValues(p.Name, n.cfg.Region).Set(n.cfg.Shares.Share(p.Name, ""))
	}
}

// Ready reports whether the node can decide: policies are loaded and the
// share source is ready.
func (n *Node) Ready() bool {
	return !n.draining.Load() && n.set.Load() != nil && n.cfg.Shares.Ready()
}

// item is one bucket decision within a check.
type item struct {
	label     string         // policy name for metrics and replies
	pol       *policy.Policy // nil for an Envoy limit override
	subject   string
	req       bucket.Request
	mode      policy.FailureMode
	scale     float64 // local bucket scale for FailLocal
	shadow    bool
	unlimited bool
	// state is pol's policyState when policyItem made the item (nil
	// otherwise).
	state *policyState
	// live is the policy's live-subject set (nil for unlimited policies
	// and Envoy overrides); fresh says this check made subject live, and
	// refused that the check is denied without asking the store.
	live    *subjectSet
	fresh   bool
	refused bool
}

// outcome is the decision of a whole check.
type outcome struct {
	decs     []bucket.Decision
	known    []bool // false: the bucket was not asked (all-or-nothing cut it short)
	allowed  bool   // every enforced (non-shadow, limited) item admitted
	degraded policy.FailureMode
	negative bool // the negative cache decided
}

func (it *item) limit() float64 {
	if it.req.Share <= 0 {
		return 0
	}
	return it.req.Share * float64(it.req.Limits.Capacity)
}

// oneOutcome is room for the decisions and the store request of a check
// of one item, which a caller that already allocates per check can embed
// to save decide its allocations.
type oneOutcome struct {
	d   [1]bucket.Decision
	k   [1]bool
	req [1]bucket.Request // what take asks the store for
}

// decide charges every enforced item all or nothing, then each shadow item
// on its own. now is the node's clock reading for the check. A check of
// one item keeps its decisions in one (allocated when nil).
func (n *Node) decide(ctx context.Context, now time.Time, items []item, one *oneOutcome) (outcome, error) {
	out := outcome{allowed: true}
	var room []bucket.Request // for take, when it holds the request
	if len(items) == 1 {
		if one == nil {
			one = new(oneOutcome)
		}
		out.decs, out.known = one.d[:], one.k[:]
		room = one.req[:]
	} else {
		out.decs, out.known = make([]bucket.Decision, len(items)), make([]bool, len(items))
	}
	// Room for the enforced items of a check of up to 16 policies, on the
	// stack.
	var enforceRoom [16]int
	enforce, shadow := enforceRoom[:0], []int(nil)
	for i := range items {
		it := &items[i]
		switch {
		case it.unlimited:
			out.decs[i] = bucket.Decision{Allowed: true, Limit: math.Inf(1), Remaining: math.Inf(1)}
			out.known[i] = true
		case it.refused && !it.shadow:
			// The store recently refused to grow and this subject holds no
			// bucket: denied here, as the store would refuse it.
			out.decs[i] = n.denyRefused(it, now)
			out.known[i] = true
			out.allowed = false
			out.degraded = policy.FailClosed
		case it.refused:
			out.decs[i] = bucket.Decision{Allowed: false, Limit: it.limit(), RetryAfter: n.cfg.BreakerCooldown}
			out.known[i] = true
		case it.req.Share <= 0 || it.req.Cost > it.req.Limits.Capacity:
			// Nothing the store could answer would admit this: a zero share,
			// or a cost above the policy's capacity (Envoy hits_addend).
			out.decs[i] = bucket.Decision{Allowed: false, Limit: it.limit(), ResetAfter: fullAfter(it.req.Limits)}
			out.known[i] = true
			if !it.shadow {
				out.allowed = false
			}
		case it.shadow:
			shadow = append(shadow, i)
		default:
			enforce = append(enforce, i)
		}
	}
	if len(enforce) > 0 && out.allowed && n.leases != nil {
		// Every enforced bucket leased here: decided in memory.
		if decs, allowed, ok := n.leases.decide(ctx, now, items, enforce); ok {
			for j, i := range enforce {
				out.decs[i], out.known[i] = decs[j], true
			}
			out.allowed = allowed
			enforce = nil
		}
	}
	if len(enforce) > 0 && out.allowed {
		for _, i := range enforce {
			it := &items[i]
			if d, hit := n.neg.deny(it.req.Key, it.req, now); hit {
				out.decs[i], out.known[i] = d, true
				out.allowed, out.negative = false, true
				n.m.negHits.Inc()
				break
			}
		}
	}
	// The store takes at most bucket.MaxTakeAll buckets at once: larger
	// checks go in chunks, and a denial refunds the chunks before it.
	for start := 0; start < len(enforce) && out.allowed; start += bucket.MaxTakeAll {
		chunk := enforce[start:min(start+bucket.MaxTakeAll, len(enforce))]
		decs, mode, err := n.take(ctx, now, items, chunk, room)
		if err != nil {
			return out, err
		}
		if mode != "" && (out.degraded == "" || mode == policy.FailClosed) {
			out.degraded = mode
		}
		for j, i := range chunk {
			if !decs[j].Allowed && !blocked(decs[j], items[i].req.Cost) {
				// TakeAll reports every bucket of a denied call as not
				// allowed; one that did not block it admitted on its own.
				decs[j].Allowed = true
			}
			out.decs[i], out.known[i] = decs[j], true
			if !decs[j].Allowed {
				out.allowed = false
				if mode == "" {
					n.neg.add(items[i].req.Key, items[i].req, decs[j], now)
				}
			}
		}
		if !out.allowed && start > 0 {
			n.refundEnforced(ctx, now, items, enforce[:start])
		}
	}
	for _, i := range enforce {
		if !out.known[i] {
			out.decs[i] = bucket.Decision{Allowed: true, Limit: items[i].limit()}
		}
	}
	for _, i := range shadow {
		decs, _, err := n.take(ctx, now, items, []int{i}, room)
		if err != nil {
			return out, err
		}
		out.decs[i], out.known[i] = decs[0], true
	}
	return out, nil
}

// refundEnforced gives back what earlier chunks of a denied check took.
func (n *Node) refundEnforced(ctx context.Context, now time.Time, items []item, idx []int) {
	refunds := make([]item, len(idx))
	for j, i := range idx {
		refunds[j] = items[i]
	}
	n.refund(ctx, now, refunds)
}

// take asks the store for items[idx] all or nothing, and the failure modes
// when the store fails or the breaker is open. mode is empty when the store
// decided. The requests go in room when it has space for them.
func (n *Node) take(ctx context.Context, now time.Time, items []item, idx []int, room []bucket.Request) ([]bucket.Decision, policy.FailureMode, error) {
	in := room[:0]
	if cap(in) < len(idx) {
		in = make([]bucket.Request, len(idx))
	}
	in = in[:len(idx)]
	for j, i := range idx {
		in[j] = items[i].req
		in[j].Share = n.windowShare(&items[i])
		in[j].Withheld = n.withheld(&items[i])
	}
	reqs, at := mergeRequests(in)
	storeErr := errBreakerOpen
	if ok, probe := n.brk.allow(now); ok {
		var decs []bucket.Decision
		var err error
		if overCapacity(reqs) >= 0 {
			// A summed cost exceeds the capacity: nothing would admit it.
			decs = denyAll(reqs)
			n.brk.release(probe)
		} else {
			decs, err = n.callStore(ctx, now, reqs, probe)
		}
		if err == nil {
			return spread(decs, at), "", nil
		}
		if ctx.Err() != nil {
			return nil, "", fmt.Errorf("regional: check abandoned by caller: %w", ctx.Err())
		}
		if isInputError(err) {
			return nil, "", err
		}
		if errors.Is(err, bucket.ErrMemoryFull) {
			// The store refused to grow (the in-process primary at its
			// bucket cap, or Redis at maxmemory): the check is denied, the
			// policies refuse new subjects for a cooldown, and the breaker
			// is not involved.
			for _, i := range idx {
				if it := &items[i]; it.live != nil {
					it.live.refused(it.subject, it.fresh, now, n.cfg.BreakerCooldown)
				}
			}
			return n.denyFull(now, items, idx, err), policy.FailClosed, nil
		}
		storeErr = err
	}
	decs, mode, err := n.degrade(ctx, now, items, idx)
	if err != nil {
		return nil, "", err
	}
	n.logDegraded(now, mode, storeErr)
	return decs, mode, nil
}

// withheld is the part of it's share that a token bucket this check
// creates does not start with: the share above the lowest the region held
// for the subject during the bucket's full refill time (its idle TTL
// without refill), see ShareHistory. Window algorithms (see windowShare),
// and a node whose shares never change, withhold nothing.
func (n *Node) withheld(it *item) float64 {
	l := &it.req.Limits
	if n.history == nil || (l.Algorithm != "" && l.Algorithm != bucket.TokenBucket) {
		return 0
	}
	within := fullAfter(*l)
	if within <= 0 {
		within = l.IdleTTL
	}
	low := n.history.LowestShare(it.label, it.subject, within)
	return min(it.req.Share, max(0, it.req.Share-low))
}

// windowSkew is how far the store's clock (Redis TIME, which aligns the
// windows) may run slow or be stepped back: a window's history reaches
// that much further back.
const windowSkew = time.Second

// windowShare is the share a window algorithm's count is charged against:
// the lowest share the region held for the subject during the longest
// time the count can span (bucket.Limits.CountedFor: a whole window, two
// for the sliding window counter, plus windowSkew), so that growth in the
// middle of a window takes effect only once no count made before it can
// remain. A region whose share grows mid-window keeps what it admitted at
// the old share, and one whose share shrank keeps what it spent at its
// old, larger one; charged this way the regions together stay within the
// window's budget. The span is measured back from now on the share
// history's monotonic clock, never placed by this node's wall clock in
// the store's windows: a wall clock stepped back would put the window's
// start too late and charge a window that began before a growth at the
// grown share. A token bucket, and a node whose shares never change, use
// the share as read.
func (n *Node) windowShare(it *item) float64 {
	share := it.req.Share
	if n.history == nil {
		return share
	}
	within, ok := it.req.Limits.CountedFor(windowSkew)
	if !ok {
		return share
	}
	return min(share, n.history.LowestShare(it.label, it.subject, within))
}

// mergeRequests asks a bucket named twice (an Envoy request may repeat a
// descriptor) once, for the summed cost. at[j] is the merged request of
// in[j]; at is nil when no bucket repeats and reqs is then in itself.
func mergeRequests(in []bucket.Request) (reqs []bucket.Request, at []int) {
	repeats := false
	for j := 1; j < len(in) && !repeats; j++ {
		for k := 0; k < j; k++ {
			if in[k].Key == in[j].Key {
				repeats = true
				break
			}
		}
	}
	if !repeats {
		return in, nil
	}
	at = make([]int, len(in))
	for j, r := range in {
		dup := -1
		for k := range reqs {
			if reqs[k].Key == r.Key {
				dup = k
				break
			}
		}
		if dup < 0 {
			reqs = append(reqs, r)
			at[j] = len(reqs) - 1
			continue
		}
		at[j] = dup
		reqs[dup].Cost = min(reqs[dup].Cost+r.Cost, reqs[dup].Limits.Capacity+1)
	}
	return reqs, at
}

// spread maps merged decisions back to the requests they came from.
func spread(decs []bucket.Decision, at []int) []bucket.Decision {
	if at == nil {
		return decs
	}
	out := make([]bucket.Decision, len(at))
	for j, k := range at {
		out[j] = decs[k]
	}
	return out
}

// denyAll answers requests that no bucket could admit.
func denyAll(reqs []bucket.Request) []bucket.Decision {
	decs := make([]bucket.Decision, len(reqs))
	for k := range reqs {
		decs[k] = bucket.Decision{Allowed: false, Limit: reqs[k].Share * float64(reqs[k].Limits.Capacity), ResetAfter: fullAfter(reqs[k].Limits)}
	}
	return decs
}

// blocked reports whether d's bucket itself denied cost (rather than being
// left uncharged because another bucket of the same TakeAll denied).
func blocked(d bucket.Decision, cost int64) bool {
	return !d.Allowed && (d.RetryAfter > 0 || d.Remaining < float64(cost))
}

// overCapacity returns the index of a request whose cost exceeds its
// capacity, or -1.
func overCapacity(reqs []bucket.Request) int {
	for k := range reqs {
		if reqs[k].Cost > reqs[k].Limits.Capacity {
			return k
		}
	}
	return -1
}

// callStore is one TakeAll on the primary store within the time budget,
// traced, timed and reported to the breaker. Untraced, the call's context
// is a shared deadline (see deadlines): it ends StoreTimeout after the
// call, or up to an eighth of it later, and not with ctx.
func (n *Node) callStore(ctx context.Context, now time.Time, reqs []bucket.Request, probe bool) ([]bucket.Decision, error) {
	var sctx context.Context
	var span trace.Span = noop.Span{}
	if n.tracing {
		var cancel context.CancelFunc
		sctx, cancel = context.WithTimeout(ctx, n.cfg.StoreTimeout)
		defer cancel()
		sctx, span = n.tracer.Start(sctx, "bucket.TakeAll", trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(attribute.Int("quota.buckets", len(reqs))))
	} else {
		sctx = n.deadlines.get()
	}
	start := time.Now()
	decs, err := n.cfg.Store.TakeAll(sctx, reqs)
	n.takeLatency.Observe(time.Since(start).Seconds())
	if err == nil && len(decs) != len(reqs) {
		err = fmt.Errorf("regional: store answered %d decisions for %d requests", len(decs), len(reqs))
	}
	switch {
	case err == nil:
		span.End()
		n.brk.success(probe)
		if probe {
			n.m.breakerOpen.Set(0)
			n.log.Info("store answered the breaker's probe; breaker closed")
		}
		return decs, nil
	case ctx.Err() != nil || isInputError(err) || errors.Is(err, bucket.ErrMemoryFull):
		// Not a store failure: the caller went away, the input was bad, or
		// the in-process store is at its bucket cap (a flood of new
		// subjects must never open the breaker).
		span.End()
		n.brk.release(probe)
		return nil, err
	}
	span.RecordError(err)
	span.SetStatus(codes.Error, "store failed")
	span.End()
	kind := "error"
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		kind = "timeout"
	case strings.Contains(strings.ToLower(err.Error()), "script"):
		kind = "script"
	}
	n.m.storeErrors.WithLabelValues(kind).Inc()
	if n.brk.failure(now, probe) {
		n.m.breakerOpens.Inc()
		n.m.breakerOpen.Set(1)
		n.log.Warn("store circuit breaker opened", "cooldown", n.cfg.BreakerCooldown, "error", err)
	}
	return nil, fmt.Errorf("regional: store take: %w", err)
}

// degrade decides items[idx] by their failure modes. Any closed policy
// denies the whole check (charging nothing); otherwise local policies take
// from the in-process store at share × local scale / the region's nodes
// (localShare) and open ones admit.
// When the in-process store is at its bucket cap and the check needs a new
// bucket, the local policies deny with a retry-after, as closed ones do.
func (n *Node) degrade(ctx context.Context, now time.Time, items []item, idx []int) ([]bucket.Decision, policy.FailureMode, error) {
	decs := make([]bucket.Decision, len(idx))
	retry := n.brk.retryIn(now)
	if retry <= 0 {
		retry = n.cfg.BreakerCooldown
	}
	closed := false
	var local []int
	for j, i := range idx {
		it := &items[i]
		switch it.mode {
		case policy.FailClosed:
			closed = true
			decs[j] = bucket.Decision{Allowed: false, Limit: it.limit(), RetryAfter: retry, ResetAfter: retry}
		case policy.FailLocal:
			local = append(local, j)
		default:
			decs[j] = bucket.Decision{Allowed: true, Limit: it.limit(), Remaining: it.limit()}
		}
		n.m.degraded.WithLabelValues(it.label, n.cfg.Region, string(modeOf(it.mode))).Inc()
	}
	if closed {
		for _, j := range local {
			decs[j] = bucket.Decision{Allowed: true, Limit: items[idx[j]].limit()}
		}
		return decs, policy.FailClosed, nil
	}
	if len(local) == 0 {
		return decs, policy.FailOpen, nil
	}
	reqs := make([]bucket.Request, len(local))
	for k, j := range local {
		it := &items[idx[j]]
		reqs[k] = it.req
		reqs[k].Share = n.localShare(it)
	}
	merged, at := mergeRequests(reqs)
	var ldecs []bucket.Decision
	if overCapacity(merged) >= 0 {
		ldecs = denyAll(merged)
	} else {
		var err error
		ldecs, err = n.cfg.Local.TakeAll(ctx, merged)
		switch {
		case errors.Is(err, bucket.ErrMemoryFull):
			// The local buckets are at -local-max-buckets: the check
			// needs a new one, so it is denied as fail-closed denies.
			for _, j := range local {
				decs[j] = bucket.Decision{Allowed: false, Limit: items[idx[j]].limit(), RetryAfter: retry, ResetAfter: retry}
			}
			n.m.memoryFull.WithLabelValues("local").Inc()
			return decs, policy.FailLocal, nil
		case err != nil:
			return nil, "", fmt.Errorf("regional: local bucket: %w", err)
		}
	}
	ldecs = spread(ldecs, at)
	for k, j := range local {
		decs[j] = ldecs[k]
	}
	return decs, policy.FailLocal, nil
}

// localShare is the share of it's in-process bucket under failure mode
// local: the region's share divided among the region's registered nodes
// (each decides apart, and all of them may fail over at once), times the
// policy's local_scale, which an operator sets to keep less still.
func (n *Node) localShare(it *item) float64 {
	share := it.req.Share * it.scale
	if n.nodes != nil {
		share /= float64(max(1, n.nodes.Nodes()))
	}
	return share
}

// denyFull answers items[idx] when the in-process primary store is at its
// bucket cap (err wraps bucket.ErrMemoryFull): each is denied with a
// retry-after of one breaker cooldown, counted as a degraded closed
// decision, and logged at a bounded rate. The store charged nothing that
// this denial must give back, except as bucket.Memory.TakeAll documents.
func (n *Node) denyFull(now time.Time, items []item, idx []int, err error) []bucket.Decision {
	retry := n.cfg.BreakerCooldown
	decs := make([]bucket.Decision, len(idx))
	for j, i := range idx {
		it := &items[i]
		decs[j] = bucket.Decision{Allowed: false, Limit: it.limit(), RetryAfter: retry, ResetAfter: retry}
		n.m.degraded.WithLabelValues(it.label, n.cfg.Region, string(policy.FailClosed)).Inc()
	}
	n.m.memoryFull.WithLabelValues("primary").Inc()
	n.logDegraded(now, policy.FailClosed, err)
	return decs
}

// denyRefused answers an item refused by its live-subject set: denied
// with a retry-after of one breaker cooldown, counted as a degraded closed
// decision of a full store.
func (n *Node) denyRefused(it *item, now time.Time) bucket.Decision {
	n.m.degraded.WithLabelValues(it.label, n.cfg.Region, string(policy.FailClosed)).Inc()
	n.m.memoryFull.WithLabelValues("primary").Inc()
	n.logDegraded(now, policy.FailClosed, errStoreRefused)
	return bucket.Decision{Allowed: false, Limit: it.limit(), RetryAfter: n.cfg.BreakerCooldown, ResetAfter: n.cfg.BreakerCooldown}
}

// errStoreRefused is logged for checks refused without asking the store.
var errStoreRefused = errors.New("regional: store refused new buckets within the last cooldown")

// fullAfter is how long an empty bucket with limits l takes to be full
// again: a window, or capacity over refill.
func fullAfter(l bucket.Limits) time.Duration {
	if l.Window > 0 {
		return l.Window
	}
	if l.RefillPerSecond > 0 {
		if s := float64(l.Capacity) / l.RefillPerSecond; s < float64(math.MaxInt64/int64(time.Second)) {
			return time.Duration(s * float64(time.Second))
		}
	}
	return 0
}

func modeOf(m policy.FailureMode) policy.FailureMode {
	switch m {
	case policy.FailClosed, policy.FailLocal:
		return m
	}
	return policy.FailOpen
}

// logDegraded logs a degraded decision at most once per
// DegradedLogInterval, with the number of lines left out since.
func (n *Node) logDegraded(now time.Time, mode policy.FailureMode, err error) {
	last := n.lastDegLog.Load()
	if now.UnixNano()-last < int64(n.cfg.DegradedLogInterval) || !n.lastDegLog.CompareAndSwap(last, now.UnixNano()) {
		n.degSkipped.Add(1)
		return
	}
	n.log.Warn("decided in a degraded mode", "mode", string(mode), "error", err, "suppressed", n.degSkipped.Swap(0))
}

// logDecision logs one decision in every DecisionLogEvery, with a one-way
// hash of the subject only, and each policy's cost (0 for a peek).
func (n *Node) logDecision(api, subject string, items []item, out outcome) {
	every := n.cfg.DecisionLogEvery
	if every <= 0 || n.decisionN.Add(1)%uint64(every) != 0 {
		return
	}
	names := make([]string, len(items))
	costs := make([]int64, len(items))
	for i := range items {
		names[i], costs[i] = items[i].label, items[i].req.Cost
	}
	n.log.Info("decision", "api", api, "subject_hash", bucket.HashSubject("decision-log", subject)[:14],
		"policies", names, "costs", costs, "allowed", out.allowed, "degraded", string(out.degraded), "negative_cache", out.negative)
}

// account counts the outcome and reports demand.
func (n *Node) account(items []item, out outcome) {
	for i := range items {
		it := &items[i]
		d := out.decs[i]
		result := resultAllowed
		switch {
		case it.unlimited:
			result = resultUnlimited
		case it.shadow && !d.Allowed:
			result = resultShadowDenied
		case !it.shadow && !out.allowed:
			result = resultDenied
		}
		n.decisionCounter(it, result).Inc()
		if !d.Allowed && d.RetryAfter > 0 {
			n.m.retryAfter.WithLabelValues(it.label).Observe(d.RetryAfter.Seconds())
		}
		if n.cfg.Demand == nil || it.pol == nil || it.unlimited || it.req.Cost == 0 {
			continue
		}
		cost := demandCost(items, i)
		if cost == 0 {
			continue
		}
		admitted := d.Allowed && (it.shadow || out.allowed)
		pressured := out.known[i] && (!d.Allowed || d.Remaining < d.Limit/2)
		n.cfg.Demand.Record(it.pol.Name, it.subject, cost, admitted, pressured)
	}
}

// demandCost is the demand items[i] reports: its cost, but no more than
// what its policy's capacity leaves after the items before it in the same
// check that charge the same bucket. A cost above the capacity can never
// be admitted in any region, so counting it whole would let one request
// (an Envoy hits_addend of 2^53, or one descriptor repeated) drag the
// region's share of the policy towards its caller; capped, one request
// weighs at most one full bucket per policy and subject.
func demandCost(items []item, i int) int64 {
	it := &items[i]
	room := it.pol.Limits.Capacity
	for j := 0; j < i && room > 0; j++ {
		if prev := &items[j]; prev.pol == it.pol && prev.req.Key == it.req.Key {
			room -= min(prev.req.Cost, room)
		}
	}
	return max(min(it.req.Cost, room), 0)
}

// decisionResults are the results whose counters policyState holds.
var decisionResults = [...]string{resultAllowed, resultDenied, resultShadowDenied, resultUnlimited}

// policyState is what the checks of one loaded policy read beside the
// policy, worked out once per policy rather than on every check: its
// bucket key version (a hash of its limits), its live-subject set (a
// lookup by name and version under a lock) and its decision counters (a
// counter vector lookup hashes the three label values).
type policyState struct {
	version  uint32
	live     *subjectSet // nil for an unlimited policy
	counters [len(decisionResults)]prometheus.Counter
}

// maxPolicyStates bounds the policies whose states are cached; the cache
// is emptied when it is full, and whenever the policies change.
const maxPolicyStates = 4096

// stateOf returns p's policyState, from the cache keyed by the policy.
func (n *Node) stateOf(p *policy.Policy) *policyState {
	if v, ok := n.states.Load(p); ok {
		return v.(*policyState)
	}
	st := &policyState{version: p.KeyVersion()}
	if !p.Unlimited {
		st.live = n.live.set(p)
	}
	for i, x := range decisionResults {
		st.counters[i] = n.m.decisions.WithLabelValues(p.Name, n.cfg.Region, x)
	}
	if n.nstates.Add(1) > maxPolicyStates {
		n.states.Clear()
		n.nstates.Store(0)
	}
	n.states.Store(p, st)
	return st
}

// decisionCounter returns the decisions counter of it's policy, the
// node's region and result: for an item of a loaded policy from its
// policyState, else from the vector.
func (n *Node) decisionCounter(it *item, result string) prometheus.Counter {
	r := -1
	for i, x := range decisionResults {
		if x == result {
			r = i
			break
		}
	}
	if it.pol == nil || it.label != it.pol.Name || r < 0 {
		return n.m.decisions.WithLabelValues(it.label, n.cfg.Region, result)
	}
	st := it.state
	if st == nil {
		st = n.stateOf(it.pol)
	}
	return st.counters[r]
}

// isNoopProvider reports whether tp is the no-op tracer provider.
func isNoopProvider(tp trace.TracerProvider) bool {
	_, ok := tp.(noop.TracerProvider)
	return ok
}

// startSpan starts a span named name when tracing is on; otherwise it
// returns ctx and a no-op span without allocating.
func (n *Node) startSpan(ctx context.Context, name string) (context.Context, trace.Span) {
	if !n.tracing {
		return ctx, noop.Span{}
	}
	return n.tracer.Start(ctx, name)
}
