package regional

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/grants"
	"github.com/quotacoord/quota/internal/policy"
)

// RejectedHeader is the response header that carries the reason when the
// Envoy API answers OVER_LIMIT for a request it cannot decide.
const RejectedHeader = "x-quota-rejected"

// rls serves envoy.service.ratelimit.v3.RateLimitService.
type rls struct {
	rlsv3.UnimplementedRateLimitServiceServer
	n *Node
}

// envoyCheck is a validated Envoy request: one item per limited descriptor.
type envoyCheck struct {
	items   []item
	slot    []int // slot[i] is the item of descriptor i, or -1 (no limit, replaced, refund)
	refunds []item
	limits  []*rlsv3.RateLimitResponse_RateLimit // current_limit per descriptor

	// one is the room of a request of one descriptor with one entry (the
	// common case), nil for other requests, which do not carry it.
	one *envoyOne
}

// envoyOne is an envoyCheck with room for a request of one descriptor
// with one entry, so that its check and reply take one allocation.
type envoyOne struct {
	check envoyCheck
	room  struct {
		entry    [1]policy.Entry
		entries  [1][]policy.Entry
		item     [1]item
		slot     [1]int
		limitPtr [1]*rlsv3.RateLimitResponse_RateLimit
		limit    [1]rlsv3.RateLimitResponse_RateLimit
		resp     rlsv3.RateLimitResponse
		status   [1]rlsv3.RateLimitResponse_DescriptorStatus
		statPtr  [1]*rlsv3.RateLimitResponse_DescriptorStatus
		dur      [1]durationpb.Duration
		match    [1]policy.DescriptorMatch
		outcome  oneOutcome
	}
}

// outcomeRoom is where decide keeps the decisions of a check of one
// item: the room of a one-descriptor request, nil for others.
func (ec *envoyCheck) outcomeRoom() *oneOutcome {
	if ec.one == nil {
		return nil
	}
	return &ec.one.room.outcome
}

// ShouldRateLimit implements the Envoy rate limit service with Envoy's
// semantics; see the package documentation. The request pins the shares at
// its start and releases them on return (after its refunds), whatever path
// it takes.
//
// Input never makes it fail: Envoy admits a request whose rate limit call
// fails (unless failure_mode_deny is set), so a request the node cannot
// decide (too many descriptors or entries, an empty or oversize key or
// domain, an invalid limit override) is answered OVER_LIMIT with the
// reason in RejectedHeader, and charges nothing. Values of any length are
// hashed, and a hits_addend above MaxCost is denied like any cost above
// the capacity. Errors are left for policies not yet loaded (Unavailable)
// and for a caller that went away.
func (r *rls) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	shares := r.n.beginShares()
	defer shares.end()
	set := r.n.set.Load()
	if set == nil {
		return nil, status.Error(codes.Unavailable, "policies are not loaded yet")
	}
	// An unknown bearer token leaves the caller anonymous: an error here
	// would make Envoy admit the request.
	who, perms, _ := r.n.callerPerms(ctx)
	now := r.n.cfg.Clock.Now()
	ec, err := r.n.prepareEnvoy(set, req, &shares, perms, now)
	if err != nil {
		return r.n.rejectEnvoy(req, err), nil
	}
	ops := len(ec.items) + len(ec.refunds)
	if !r.n.admitOps("envoy", who, ops) {
		return r.n.rejectEnvoy(req, errCallerBusy), nil
	}
	defer r.n.inflight.release(who, ops)
	ctx, span := r.n.startSpan(ctx, "regional.ShouldRateLimit")
	defer span.End()
	out, err := r.n.decide(ctx, now, ec.items, ec.outcomeRoom())
	if err != nil {
		switch {
		case ctx.Err() != nil:
			return nil, statusOf(err)
		case isInputError(err):
			return r.n.rejectEnvoy(req, err), nil
		}
		// The reason reaches the client: no internal error text in it.
		r.n.logDegraded(now, policy.FailClosed, err)
		return r.n.rejectEnvoy(req, errUndecided), nil
	}
	r.n.account(ec.items, out)
	r.n.logDecision("envoy", req.GetDomain(), ec.items, out)
	traceDecision(span, ec.items, out, "")
	refunded := r.n.refund(ctx, now, ec.refunds)

	// The reply's messages are allocated in blocks, one per kind, rather
	// than one by one.
	var resp *rlsv3.RateLimitResponse
	var sts []rlsv3.RateLimitResponse_DescriptorStatus
	var durs []durationpb.Duration
	if one := ec.one; one != nil {
		resp, sts, durs = &one.room.resp, one.room.status[:], one.room.dur[:]
		resp.Statuses = one.room.statPtr[:]
	} else {
		resp = &rlsv3.RateLimitResponse{Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(ec.slot))}
		sts = make([]rlsv3.RateLimitResponse_DescriptorStatus, len(ec.slot))
		durs = make([]durationpb.Duration, len(ec.slot))
	}
	resp.OverallCode = rlsv3.RateLimitResponse_OK
	min := -1
	ri := 0
	for i, s := range ec.slot {
		st := &sts[i]
		st.Code = rlsv3.RateLimitResponse_OK
		resp.Statuses[i] = st
		if s == -2 { // a refund
			st.CurrentLimit = ec.limits[i]
			if d := refunded[ri]; d != nil {
				st.LimitRemaining = clampUint32(d.Remaining)
				st.DurationUntilReset = setDuration(&durs[i], d.ResetAfter)
			}
			ri++
			continue
		}
		if s < 0 {
			continue
		}
		it := &ec.items[s]
		d := out.decs[s]
		if it.unlimited {
			st.LimitRemaining = math.MaxUint32
			continue
		}
		st.CurrentLimit = ec.limits[i]
		st.LimitRemaining = clampUint32(d.Remaining)
		if !d.Allowed && !it.shadow && out.known[s] {
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
			st.DurationUntilReset = setDuration(&durs[i], retryOrReset(d))
		} else {
			st.DurationUntilReset = setDuration(&durs[i], d.ResetAfter)
		}
		if min < 0 || st.LimitRemaining < resp.Statuses[min].LimitRemaining {
			min = i
		}
	}
	if out.degraded != "" {
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, &corev3.HeaderValue{Key: "x-quota-degraded", Value: string(out.degraded)})
	}
	if r.n.cfg.Headers == HeadersDraft && min >= 0 {
		st := resp.Statuses[min]
		reset := int64(math.Ceil(st.DurationUntilReset.AsDuration().Seconds()))
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd,
			&corev3.HeaderValue{Key: "RateLimit-Limit", Value: strconv.FormatUint(uint64(st.CurrentLimit.GetRequestsPerUnit()), 10)},
			&corev3.HeaderValue{Key: "RateLimit-Remaining", Value: strconv.FormatUint(uint64(st.LimitRemaining), 10)},
			&corev3.HeaderValue{Key: "RateLimit-Reset", Value: strconv.FormatInt(reset, 10)},
		)
	}
	return resp, nil
}

// prepareEnvoy validates req and maps each descriptor to a bucket item at
// the share the request's pin reads. What the caller's perms do not grant
// is left out, never refused: a limit override without the override
// grant is ignored (the matched rule decides) and a refund without the
// refund grant is charged as a plain hit, both counted in
// quota_regional_forbidden_actions_total. A descriptor whose rule the
// caller may not check is an error (PermissionDenied), which
// ShouldRateLimit answers OVER_LIMIT. Errors are gRPC statuses. now is
// the node's clock reading for the request.
func (n *Node) prepareEnvoy(set *policy.Set, req *rlsv3.RateLimitRequest, shares *sharePin, perms grants.Perms, now time.Time) (*envoyCheck, error) {
	if req == nil {
		return nil, status.Error(codes.InvalidArgument, "empty request")
	}
	descs := req.GetDescriptors()
	if len(descs) == 0 || len(descs) > MaxDescriptors {
		return nil, status.Errorf(codes.InvalidArgument, "request has %d descriptors, want 1 to %d", len(descs), MaxDescriptors)
	}
	var ec *envoyCheck
	var entries [][]policy.Entry
	var lims []rlsv3.RateLimitResponse_RateLimit
	var matches []policy.DescriptorMatch
	if len(descs) == 1 && len(descs[0].GetEntries()) == 1 {
		one := &envoyOne{}
		ec = &one.check
		ec.one = one
		room := &one.room
		e := descs[0].GetEntries()[0]
		room.entry[0] = policy.Entry{Key: e.GetKey(), Value: e.GetValue()}
		room.entries[0] = room.entry[:]
		entries = room.entries[:]
		ec.items, ec.slot, ec.limits = room.item[:0], room.slot[:], room.limitPtr[:]
		lims = room.limit[:]
		matches = room.match[:]
	} else {
		ec = &envoyCheck{}
		entries = flatEntries(descs)
		ec.items = make([]item, 0, len(descs))
		ec.slot = make([]int, len(descs))
		ec.limits = make([]*rlsv3.RateLimitResponse_RateLimit, len(descs))
		lims = make([]rlsv3.RateLimitResponse_RateLimit, len(descs))
		matches = make([]policy.DescriptorMatch, len(descs))
	}
	for _, d := range entries {
		for j := range d {
			if d[j].Key == remoteAddressKey {
				d[j].Value = ipSubject(d[j].Value, n.cfg.IPv6SubjectPrefix)
			}
		}
	}
	err := set.MatchTo(matches, req.GetDomain(), entries, n.envoySubj)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	hits := uint64(req.GetHitsAddend())
	if hits == 0 {
		hits = 1
	}
	for i, d := range descs {
		ec.slot[i] = -1
		cost := hits
		if h := d.GetHitsAddend(); h != nil {
			cost = h.GetValue()
		}
		// MaxCost exceeds every capacity: a larger hits_addend is denied
		// like any cost above the capacity, never refused.
		cost = min(cost, MaxCost)
		m := matches[i]
		var ruleName string // the matched rule's policy, "" for none
		if m.Policy != nil {
			ruleName = m.Policy.Name
		}
		limit, negative := d.GetLimit(), d.GetIsNegativeHits()
		if limit != nil {
			// Validated whether granted or not: bad input is refused the
			// same for every caller.
			if err := validOverride(limit); err != nil {
				return nil, status.Errorf(codes.InvalidArgument, "descriptor %d: %v", i, err)
			}
		}
		if limit != nil && !perms.Allows(grants.Override, ruleName) {
			n.forbid("envoy", grants.Override)
			limit = nil
		}
		if negative && !perms.Allows(grants.Refund, ruleName) {
			n.forbid("envoy", grants.Refund)
			negative = false
		}
		if m.Policy != nil && !m.Replaced && !perms.Allows(grants.Check, ruleName) {
			n.forbid("envoy", grants.Check)
			return nil, status.Errorf(codes.PermissionDenied, "descriptor %d: caller may not check policy %q", i, ruleName)
		}
		var it item
		switch {
		case limit != nil:
			it, err = n.overrideItem(req.GetDomain(), entries[i], limit, m, int64(cost), shares)
			if err != nil {
				return nil, status.Errorf(codes.InvalidArgument, "descriptor %d: %v", i, err)
			}
		case m.Policy == nil || m.Replaced:
			continue
		case m.Unlimited:
			it = item{label: m.Policy.Name, pol: m.Policy, unlimited: true}
		default:
			it, err = n.policyItem(m.Policy, m.Subject, m.BucketSubject, int64(cost), shares, now)
			if err != nil {
				return nil, status.Errorf(codes.InvalidArgument, "descriptor %d: %v", i, err)
			}
			it.shadow = it.shadow || m.Shadow
		}
		if !it.unlimited {
			ec.limits[i] = envoyLimitInto(&lims[i], it)
		}
		if negative && !it.unlimited {
			// A refund never fills a bucket above its capacity.
			it.req.Cost = min(it.req.Cost, it.req.Limits.Capacity)
			ec.slot[i] = -2
			ec.refunds = append(ec.refunds, it)
			continue
		}
		ec.slot[i] = len(ec.items)
		ec.items = append(ec.items, it)
	}
	return ec, nil
}

// remoteAddressKey is the descriptor key of Envoy's remote_address
// action: its value, the client address, is aggregated to
// Config.IPv6SubjectPrefix.
const remoteAddressKey = "remote_address"

// errUndecided is the reason given for a request that failed for a cause
// other than its input (logged, not told to the client).
var errUndecided = errors.New("the node could not decide this request")

// maxRejectReason bounds the reason RejectedHeader carries.
const maxRejectReason = 256

// rejectEnvoy answers a request the node cannot decide (err says why):
// OVER_LIMIT overall and for every descriptor, the reason in
// RejectedHeader (printable ASCII), counted by API. Envoy then denies
// the request whatever its failure_mode_deny.
func (n *Node) rejectEnvoy(req *rlsv3.RateLimitRequest, err error) *rlsv3.RateLimitResponse {
	reason := status.Convert(err).Message()
	if len(reason) > maxRejectReason {
		reason = reason[:maxRejectReason]
	}
	reason = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || r >= utf8.RuneSelf {
			return '?'
		}
		return r
	}, reason)
	n.m.rejected.WithLabelValues("envoy").Inc()
	resp := &rlsv3.RateLimitResponse{
		OverallCode:          rlsv3.RateLimitResponse_OVER_LIMIT,
		ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: RejectedHeader, Value: reason}},
	}
	if k := len(req.GetDescriptors()); k <= MaxDescriptors {
		resp.Statuses = make([]*rlsv3.RateLimitResponse_DescriptorStatus, k)
		for i := range resp.Statuses {
			resp.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OVER_LIMIT}
		}
	}
	return resp
}

// flatEntries converts the entries of descs, every descriptor's in one
// block. A descriptor with more than policy.MaxEntries entries gets empty
// ones of the same count, which Match rejects.
func flatEntries(descs []*rlcommon.RateLimitDescriptor) [][]policy.Entry {
	total := 0
	for _, d := range descs {
		total += min(len(d.GetEntries()), policy.MaxEntries)
	}
	flat := make([]policy.Entry, 0, total)
	entries := make([][]policy.Entry, len(descs))
	for i, d := range descs {
		es := d.GetEntries()
		if len(es) > policy.MaxEntries {
			entries[i] = make([]policy.Entry, len(es))
			continue
		}
		start := len(flat)
		for _, e := range es {
			flat = append(flat, policy.Entry{Key: e.GetKey(), Value: e.GetValue()})
		}
		entries[i] = flat[start:len(flat):len(flat)]
	}
	return entries
}

// overrideItem builds the bucket of a descriptor that carries its own limit
// (Envoy's per-descriptor override): a fixed window of requests_per_unit
// per unit, keyed by the domain and every entry, whatever rule matched.
// Like any policy, the override is split across regions: the bucket holds
// this region's share of requests_per_unit, the share of the matched
// rule's policy for its subject (of the override's own name when no rule
// matched: 1 standalone, the share a coordinator gives an unknown policy
// otherwise), so that the regions together admit the override's limit
// and not one limit each.
func (n *Node) overrideItem(domain string, entries []policy.Entry, o *rlcommon.RateLimitDescriptor_RateLimitOverride, m policy.DescriptorMatch, cost int64, shares *sharePin) (item, error) {
	matched := m.Policy
	if err := validOverride(o); err != nil {
		return item{}, err
	}
	unit, _ := unitDuration(o.GetUnit())
	if m := o.GetUnitMultiplier(); m != nil && m.GetValue() > 1 {
		unit *= time.Duration(m.GetValue())
	}
	var b strings.Builder
	b.WriteString(domain)
	for _, e := range entries {
		b.WriteByte(0)
		b.WriteString(e.Key)
		b.WriteByte(0)
		b.WriteString(e.Value)
	}
	subject := bucket.HashSubject(n.cfg.SubjectSalt, b.String())
	name := "override." + strings.ToLower(o.GetUnit().String())
	lim := bucket.Limits{Algorithm: bucket.FixedWindow, Capacity: int64(o.GetRequestsPerUnit()), Window: unit, IdleTTL: unit + time.Minute}
	key, err := bucket.NewKey(name, uint32(o.GetRequestsPerUnit()), subject)
	if err != nil {
		return item{}, err
	}
	var share float64
	if matched != nil {
		share = shares.share(matched.Name, m.Subject)
	} else {
		share = shares.share(name, subject)
	}
	if math.IsNaN(share) || share < 0 {
		share = 0
	}
	it := item{label: name, subject: subject, mode: policy.FailOpen, scale: 1,
		req: bucket.Request{Key: key, Limits: lim, Share: min(share, 1), Cost: cost}}
	if matched != nil {
		it.mode, it.scale = matched.FailureMode, matched.LocalScale
		if it.scale <= 0 || it.scale > 1 {
			it.scale = 1
		}
	}
	return it, nil
}

// validOverride checks a limit override's unit and requests_per_unit.
func validOverride(o *rlcommon.RateLimitDescriptor_RateLimitOverride) error {
	if _, ok := unitDuration(o.GetUnit()); !ok {
		return status.Errorf(codes.InvalidArgument, "limit override unit %v is not supported", o.GetUnit())
	}
	if o.GetRequestsPerUnit() == 0 || int64(o.GetRequestsPerUnit()) > bucket.MaxCapacity {
		return status.Errorf(codes.InvalidArgument, "limit override requests_per_unit %d outside 1..%d", o.GetRequestsPerUnit(), bucket.MaxCapacity)
	}
	return nil
}

func unitDuration(u typev3.RateLimitUnit) (time.Duration, bool) {
	switch u {
	case typev3.RateLimitUnit_SECOND:
		return time.Second, true
	case typev3.RateLimitUnit_MINUTE:
		return time.Minute, true
	case typev3.RateLimitUnit_HOUR:
		return time.Hour, true
	case typev3.RateLimitUnit_DAY:
		return 24 * time.Hour, true
	case typev3.RateLimitUnit_MONTH:
		return 30 * 24 * time.Hour, true
	case typev3.RateLimitUnit_YEAR:
		return 365 * 24 * time.Hour, true
	}
	return 0, false
}

var envoyUnits = []struct {
	d time.Duration
	u rlsv3.RateLimitResponse_RateLimit_Unit
}{
	{time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND},
	{time.Minute, rlsv3.RateLimitResponse_RateLimit_MINUTE},
	{time.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR},
	{24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_DAY},
	{7 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_WEEK},
	{30 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_MONTH},
	{365 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_YEAR},
}

// envoyLimitInto expresses an item's limit, at the region's share, as Envoy's
// requests per unit: a window algorithm whose window is one Envoy unit
// reports share × capacity per that unit; a token bucket (or any other
// window) reports its refill share × r per the shortest unit in which it is
// at least one request.
//
// It writes into out, a zero message, and returns it.
func envoyLimitInto(out *rlsv3.RateLimitResponse_RateLimit, it item) *rlsv3.RateLimitResponse_RateLimit {
	l := it.req.Limits
	out.Name = it.label
	share := it.req.Share
	if l.Algorithm != bucket.TokenBucket && l.Algorithm != "" {
		for _, u := range envoyUnits {
			if u.d == l.Window {
				out.Unit = u.u
				out.RequestsPerUnit = clampUint32(share * float64(l.Capacity))
				return out
			}
		}
		perSec := float64(l.Capacity) / l.Window.Seconds()
		return ratePerUnit(out, share*perSec)
	}
	return ratePerUnit(out, share*l.RefillPerSecond)
}

func ratePerUnit(out *rlsv3.RateLimitResponse_RateLimit, perSecond float64) *rlsv3.RateLimitResponse_RateLimit {
	for _, u := range envoyUnits {
		if v := perSecond * u.d.Seconds(); v >= 1 {
			out.Unit, out.RequestsPerUnit = u.u, clampUint32(v)
			return out
		}
	}
	out.Unit = rlsv3.RateLimitResponse_RateLimit_YEAR
	return out
}

// refund gives back the cost of Envoy descriptors with is_negative_hits,
// each on its own, skipping the store while the breaker is open. The
// result has one entry per refund, nil where nothing was learned.
func (n *Node) refund(ctx context.Context, now time.Time, items []item) []*bucket.Decision {
	out := make([]*bucket.Decision, len(items))
	for i := range items {
		it := &items[i]
		n.neg.forget(it.req.Key)
		if it.req.Cost == 0 || it.req.Share <= 0 {
			continue
		}
		if n.leases != nil {
			if d, leased := n.leases.refund(it.req.Key, it.req.Cost, now); leased {
				if d.Limit > 0 {
					out[i] = &d
				}
				continue
			}
		}
		if ok, probe := n.brk.allow(now); ok {
			rctx, cancel := context.WithTimeout(ctx, n.cfg.StoreTimeout)
			d, err := n.cfg.Store.Refund(rctx, it.req)
			cancel()
			if err == nil {
				n.brk.success(probe)
				out[i] = &d
				continue
			}
			n.brk.release(probe)
			n.m.storeErrors.WithLabelValues("refund").Inc()
		}
	}
	return out
}

// setDuration writes d into out (as durationpb.New does) and returns out.
func setDuration(out *durationpb.Duration, d time.Duration) *durationpb.Duration {
	nanos := d.Nanoseconds()
	out.Seconds = nanos / 1e9
	out.Nanos = int32(nanos % 1e9)
	return out
}

func clampUint32(f float64) uint32 {
	switch {
	case math.IsNaN(f) || f <= 0:
		return 0
	case f >= math.MaxUint32:
		return math.MaxUint32
	}
	return uint32(f)
}

// retryOrReset is the wait an over-limit descriptor reports: when its
// cost would be admitted, or the window's end when that is unknown.
func retryOrReset(d bucket.Decision) time.Duration {
	if d.RetryAfter > 0 {
		return d.RetryAfter
	}
	return d.ResetAfter
}
