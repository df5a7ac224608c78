package regional

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/grants"
	"github.com/quotacoord/quota/internal/policy"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

// admission serves the project's own API.
type admission struct {
	quotav1.UnimplementedAdmissionServer
	n *Node
}

// check is a validated CheckRequest.
type check struct {
	subject     string
	items       []item
	names       []string // requested policies in order, for the reply
	unknownDeny string   // the unknown policy that denies the check (UnknownDeny)
	replayKey   string
	// fp binds replayKey to what the check asks for (policies, cost,
	// peek), so that a key reused for another request is refused.
	fp fingerprint
}

// Check implements quotav1.AdmissionServer.
// The check pins the shares at its start and releases them on return,
// whatever path it takes.
func (a *admission) Check(ctx context.Context, req *quotav1.CheckRequest) (*quotav1.CheckResponse, error) {
	shares := a.n.beginShares()
	defer shares.end()
	set := a.n.set.Load()
	if set == nil {
		return nil, status.Error(codes.Unavailable, "policies are not loaded yet")
	}
	who, perms, err := a.n.callerPerms(ctx)
	if err != nil {
		return nil, err
	}
	c, err := a.n.prepareCheck(set, req, &shares, perms)
	if err != nil {
		return nil, err
	}
	if !a.n.admitOps("admission", who, len(c.items)) {
		return a.n.busyResponse(c), nil
	}
	defer a.n.inflight.release(who, len(c.items))
	return a.n.runCheck(ctx, c)
}

// CheckBatch implements quotav1.AdmissionServer: every entry is validated
// before any is decided, so a bad entry charges nothing. A batch naming
// more than MaxBatchOps policies over its checks is InvalidArgument
// before any store call, and the batch's bucket operations count against
// its caller's in-flight bound (every check denied beyond it, see
// busyResponse). The whole batch reads its shares through
// one pin, released on return.
func (a *admission) CheckBatch(ctx context.Context, req *quotav1.CheckBatchRequest) (*quotav1.CheckBatchResponse, error) {
	shares := a.n.beginShares()
	defer shares.end()
	set := a.n.set.Load()
	if set == nil {
		return nil, status.Error(codes.Unavailable, "policies are not loaded yet")
	}
	if len(req.GetChecks()) > MaxBatch {
		return nil, status.Errorf(codes.InvalidArgument, "batch has %d checks, at most %d", len(req.GetChecks()), MaxBatch)
	}
	named := 0
	for _, cr := range req.GetChecks() {
		named += len(cr.GetPolicies())
	}
	if named > MaxBatchOps {
		a.n.m.rejected.WithLabelValues("admission").Inc()
		return nil, status.Errorf(codes.InvalidArgument, "batch names %d policies over its checks, at most %d: split it", named, MaxBatchOps)
	}
	who, perms, err := a.n.callerPerms(ctx)
	if err != nil {
		return nil, err
	}
	checks := make([]*check, len(req.GetChecks()))
	var keys map[string]int // replay key → first check of the batch with it
	for i, cr := range req.GetChecks() {
		c, err := a.n.prepareCheck(set, cr, &shares, perms)
		if err != nil {
			st := status.Convert(err)
			return nil, status.Errorf(st.Code(), "check %d: %s", i, st.Message())
		}
		if c.replayKey != "" {
			if keys == nil {
				keys = make(map[string]int)
			}
			switch j, seen := keys[c.replayKey]; {
			case !seen:
				keys[c.replayKey] = i
			case checks[j].fp != c.fp:
				return nil, status.Errorf(codes.InvalidArgument, "check %d: idempotency_key of check %d used for a different request", i, j)
			}
		}
		checks[i] = c
	}
	ops := 0
	for _, c := range checks {
		ops += len(c.items)
	}
	resp := &quotav1.CheckBatchResponse{Responses: make([]*quotav1.CheckResponse, len(checks))}
	if !a.n.admitOps("admission", who, ops) {
		for i, c := range checks {
			resp.Responses[i] = a.n.busyResponse(c)
		}
		return resp, nil
	}
	defer a.n.inflight.release(who, ops)
	for i, c := range checks {
		r, err := a.n.runCheck(ctx, c)
		if err != nil {
			st := status.Convert(err)
			return nil, status.Errorf(st.Code(), "check %d: %s", i, st.Message())
		}
		resp.Responses[i] = r
	}
	return resp, nil
}

// prepareCheck validates req against set, reading shares through the
// check's pin, and refuses (PermissionDenied) a check or peek of a policy
// the caller's perms do not grant. Errors are gRPC statuses.
func (n *Node) prepareCheck(set *policy.Set, req *quotav1.CheckRequest, shares *sharePin, perms grants.Perms) (*check, error) {
	if req == nil {
		return nil, status.Error(codes.InvalidArgument, "empty request")
	}
	subject := req.GetSubject()
	// The subject is hashed when the request or any named policy says so
	// (api_key, ip and email subjects by default): it is validated once the
	// policies are known, as a raw identity or as a plain subject.
	hash := req.GetHashSubject()
	if len(subject) == 0 || len(subject) > MaxRawSubjectLen {
		return nil, status.Errorf(codes.InvalidArgument, "subject has %d bytes, want 1 to %d", len(subject), MaxRawSubjectLen)
	}
	names := req.GetPolicies()
	if len(names) == 0 || len(names) > MaxPolicies {
		return nil, status.Errorf(codes.InvalidArgument, "check names %d policies, want 1 to %d", len(names), MaxPolicies)
	}
	if len(req.GetIdempotencyKey()) > MaxIdempotencyKeyLen {
		return nil, status.Errorf(codes.InvalidArgument, "idempotency_key has %d bytes, at most %d", len(req.GetIdempotencyKey()), MaxIdempotencyKeyLen)
	}
	cost, err := validCost(req.GetCost())
	if err != nil {
		return nil, err
	}
	if req.GetPeek() {
		cost = 0
	}
	c := &check{names: names}
	ip := false // a policy limits IP subjects
	pols := make([]*policy.Policy, 0, len(names))
	for i, name := range names {
		if len(name) == 0 || len(name) > bucket.MaxPolicyNameLen {
			return nil, status.Errorf(codes.InvalidArgument, "policy name %d has %d bytes, want 1 to %d", i, len(name), bucket.MaxPolicyNameLen)
		}
		for _, prev := range names[:i] {
			if prev == name {
				return nil, status.Errorf(codes.InvalidArgument, "policy %q named twice", name)
			}
		}
		p, ok := set.Get(name)
		if !ok {
			switch n.cfg.UnknownPolicy {
			case UnknownDeny:
				if c.unknownDeny == "" {
					c.unknownDeny = name
				}
			case UnknownAllow:
			default:
				return nil, status.Errorf(codes.NotFound, "unknown policy %q", name)
			}
			n.m.decisions.WithLabelValues("unknown", n.cfg.Region, resultUnknown).Inc()
			continue
		}
		action := grants.Check
		if req.GetPeek() {
			action = grants.Peek
		}
		if !perms.Allows(action, name) {
			n.forbid("admission", action)
			return nil, status.Errorf(codes.PermissionDenied, "caller may not %s policy %q", action, name)
		}
		hash = hash || p.HashSubject
		ip = ip || p.Subject == "ip"
		if cost > p.Limits.Capacity {
			return nil, status.Errorf(codes.InvalidArgument, "cost %d exceeds the capacity %d of policy %q", cost, p.Limits.Capacity, name)
		}
		pols = append(pols, p)
	}
	if subject, err = n.normalSubject(subject, hash, ip); err != nil {
		return nil, err
	}
	c.subject = subject
	c.items = make([]item, 0, len(pols))
	now := n.cfg.Clock.Now()
	for _, p := range pols {
		it, err := n.policyItem(p, subject, bucket.Subject{}, cost, shares, now)
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "policy %q: %v", p.Name, err)
		}
		c.items = append(c.items, it)
	}
	if k := req.GetIdempotencyKey(); k != "" {
		c.replayKey = subject + "\x00" + k
		c.fp = requestFingerprint(names, cost, req.GetPeek())
	}
	return c, nil
}

// policyItem builds the bucket request of policy p for subject at the
// share the check's pin reads; now is the node's clock reading for the
// check (read once per check, not once per policy).
func (n *Node) policyItem(p *policy.Policy, subject string, valid bucket.Subject, cost int64, shares *sharePin, now time.Time) (item, error) {
	st := n.stateOf(p)
	it := item{label: p.Name, pol: p, subject: subject, mode: p.FailureMode, scale: p.LocalScale,
		shadow: p.Shadow, unlimited: p.Unlimited, state: st}
	if it.scale <= 0 || it.scale > 1 {
		it.scale = 1
	}
	if p.Unlimited {
		return it, nil
	}
	it.live = st.live
	var verdict subjectVerdict
	verdict, it.fresh = it.live.admit(subject, now)
	switch verdict {
	case subjectOverflow:
		n.m.overflow.WithLabelValues(p.Name).Inc()
		subject, valid = OverflowSubject, bucket.Subject{}
		it.subject = subject
	case subjectRefused:
		it.refused = true
	}
	var key bucket.Key
	var err error
	if valid.IsZero() {
		key, err = bucket.NewKey(p.Name, st.version, subject)
	} else {
		key, err = bucket.NewSubjectKey(p.Name, st.version, valid)
	}
	if err != nil {
		return item{}, err
	}
	share := shares.share(p.Name, subject)
	switch {
	case math.IsNaN(share) || share < 0:
		share = 0
	case share > 1+p.Limits.Overcommit:
		share = 1 + p.Limits.Overcommit
	}
	it.req = bucket.Request{Key: key, Limits: p.Limits, Share: share, Cost: cost,
		Since: n.versions.since(p, key.Version(), now)}
	return it, nil
}

// runCheck decides a validated check, through the idempotency cache.
func (n *Node) runCheck(ctx context.Context, c *check) (*quotav1.CheckResponse, error) {
	now := n.cfg.Clock.Now()
	if c.unknownDeny != "" {
		return &quotav1.CheckResponse{Allowed: false, DecidedBy: c.unknownDeny, DecidedAt: timestamppb.New(now), DecidedIndex: -1}, nil
	}
	var entry *replayEntry
	if c.replayKey != "" {
		prev, e, err := n.replay.begin(ctx, c.replayKey, c.fp, now)
		if errors.Is(err, errKeyReused) {
			return nil, status.Error(codes.InvalidArgument, "idempotency_key was already used for a different request (other policies, cost or peek); use a new key")
		}
		if err != nil {
			return nil, status.FromContextError(err).Err()
		}
		if prev != nil {
			n.m.replays.Inc()
			r := proto.Clone(prev).(*quotav1.CheckResponse)
			r.Replayed = true
			return r, nil
		}
		entry = e
	}
	resp, err := n.checkNow(ctx, now, c)
	if entry != nil {
		n.replay.finish(entry, resp)
	}
	return resp, err
}

func (n *Node) checkNow(ctx context.Context, now time.Time, c *check) (*quotav1.CheckResponse, error) {
	ctx, span := n.startSpan(ctx, "regional.Check")
	defer span.End()
	out, err := n.decide(ctx, now, c.items, nil)
	if err != nil {
		return nil, statusOf(err)
	}
	n.account(c.items, out)
	n.logDecision("admission", c.subject, c.items, out)
	resp := &quotav1.CheckResponse{
		Allowed:  out.allowed,
		Degraded: string(out.degraded),
		Policies: make([]*quotav1.PolicyDecision, len(c.items)),
	}
	decider := -1
	for i := range c.items {
		it := &c.items[i]
		d := out.decs[i]
		pd := &quotav1.PolicyDecision{
			Policy:     it.label,
			Allowed:    d.Allowed || it.shadow,
			Limit:      floorInt(d.Limit),
			Remaining:  floorInt(d.Remaining),
			RetryAfter: durationpb.New(d.RetryAfter),
			ResetAfter: durationpb.New(d.ResetAfter),
			Share:      it.req.Share,
			DecidedAt:  decidedAt(d, now),
		}
		resp.Policies[i] = pd
		if it.shadow || it.unlimited {
			continue
		}
		switch {
		case !out.allowed:
			if decider < 0 && out.known[i] && !d.Allowed {
				decider = i
			}
		case decider < 0 || d.Remaining < out.decs[decider].Remaining:
			decider = i
		}
	}
	if decider < 0 && len(c.items) > 0 {
		decider = 0
	}
	resp.DecidedIndex = int32(decider)
	if decider < 0 {
		resp.DecidedAt = timestamppb.New(now)
	} else {
		d := resp.Policies[decider]
		resp.DecidedAt = d.DecidedAt
		resp.DecidedBy, resp.Limit, resp.Remaining = d.Policy, d.Limit, d.Remaining
		resp.RetryAfter, resp.ResetAfter = d.RetryAfter, d.ResetAfter
		if !out.allowed {
			resp.Policies[decider].Allowed = false
		}
	}
	traceDecision(span, c.items, out, resp.DecidedBy)
	return resp, nil
}

// busyResponse denies c, uncharged, for a caller at its in-flight bound:
// a denial and not an error, because clients that fail open on an
// overloaded node (ResourceExhausted, Unavailable) would admit the very
// flood the bound refuses. It is marked degraded "closed" (decided
// without the store) and retries after one store time budget, the
// longest the caller's operations in flight take to finish.
func (n *Node) busyResponse(c *check) *quotav1.CheckResponse {
	retry := durationpb.New(n.cfg.StoreTimeout)
	at := timestamppb.New(n.cfg.Clock.Now())
	resp := &quotav1.CheckResponse{Allowed: false, Degraded: string(policy.FailClosed), RetryAfter: retry, ResetAfter: retry,
		Policies: make([]*quotav1.PolicyDecision, len(c.items)), DecidedAt: at, DecidedIndex: -1}
	for i := range c.items {
		resp.Policies[i] = &quotav1.PolicyDecision{Policy: c.items[i].label, RetryAfter: retry, ResetAfter: retry, Share: c.items[i].req.Share, DecidedAt: at}
	}
	if len(c.items) > 0 {
		resp.DecidedBy, resp.DecidedIndex = c.items[0].label, 0
	}
	return resp
}

// decidedAt is the instant of d: the store's (bucket.Decision.At), or
// now, the node's clock, for a decision no store made (a failure mode, an
// unlimited policy, a cost no bucket could hold).
func decidedAt(d bucket.Decision, now time.Time) *timestamppb.Timestamp {
	if d.At.IsZero() {
		return timestamppb.New(now)
	}
	return timestamppb.New(d.At)
}

// floorInt rounds a bucket figure down to an int64, clamping infinities
// and negatives.
func floorInt(f float64) int64 {
	switch {
	case math.IsNaN(f) || f <= 0:
		return 0
	case f >= math.MaxInt64:
		return math.MaxInt64
	}
	return int64(math.Floor(f))
}

// statusOf maps a decide error to a gRPC status.
func statusOf(err error) error {
	if _, ok := status.FromError(err); ok {
		return err
	}
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	case isInputError(err):
		return status.Error(codes.InvalidArgument, err.Error())
	}
	return status.Error(codes.Internal, fmt.Sprintf("decide: %v", err))
}
