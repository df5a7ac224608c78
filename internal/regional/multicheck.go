package regional

import (
	"context"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/grants"
	"github.com/quotacoord/quota/internal/policy"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

// MaxCharges bounds the charges of one CheckAll or Refund, as MaxPolicies
// bounds the policies of one Check: both are the bucket operations one
// call may ask of the store at once.
const MaxCharges = MaxPolicies

// CheckAll implements quotav1.AdmissionServer: one request charged to
// several (policy, subject) pairs, all or nothing. The charges become the
// items of one check, decided as Check decides its policies (decide: one
// atomic store call per Redis slot, a compensating refund across slots),
// so a denial anywhere charges nothing anywhere. Every charge is
// validated and authorized before any is decided; demand is recorded per
// charge. A caller at its in-flight bound is denied (busyResponse).
func (a *admission) CheckAll(ctx context.Context, req *quotav1.CheckAllRequest) (*quotav1.CheckResponse, error) {
	return runCharges(ctx, a.n, req.GetCharges(), grants.Check, a.n.runCheck,
		func(c *check) (*quotav1.CheckResponse, error) { return a.n.busyResponse(c), nil })
}

// runCharges is what CheckAll and Refund share: it pins the shares (until
// it returns), validates and authorizes charges for action
// (prepareCharges), and runs run with the check while the caller's
// in-flight bound holds its operations; busy answers a caller at that
// bound.
func runCharges[R any](ctx context.Context, n *Node, charges []*quotav1.Charge, action grants.Action,
	run func(context.Context, *check) (R, error), busy func(*check) (R, error)) (R, error) {
	var none R
	shares := n.beginShares()
	defer shares.end()
	set := n.set.Load()
	if set == nil {
		return none, status.Error(codes.Unavailable, "policies are not loaded yet")
	}
	who, perms, err := n.callerPerms(ctx)
	if err != nil {
		return none, err
	}
	c, err := n.prepareCharges(set, charges, action, &shares, perms)
	if err != nil {
		return none, err
	}
	if !n.admitOps("admission", who, len(c.items)) {
		return busy(c)
	}
	defer n.inflight.release(who, len(c.items))
	return run(ctx, c)
}

// charge is a validated Charge: its policy, normalized subject and cost.
type charge struct {
	pol     *policy.Policy
	subject string
	cost    int64
}

// prepareCharges validates charges for action (grants.Check for CheckAll,
// grants.Refund for Refund) and builds one item per charge of a known
// policy, at the share the call's pin reads. Every charge is validated,
// and the caller's perms checked for each, before any item is built, so
// a bad or forbidden charge anywhere leaves no trace (no live subject, no
// demand). An unknown policy follows Config.UnknownPolicy for a check and
// is NotFound for a refund (there is no bucket to give back to). Errors
// are gRPC statuses naming the charge.
func (n *Node) prepareCharges(set *policy.Set, charges []*quotav1.Charge, action grants.Action, shares *sharePin, perms grants.Perms) (*check, error) {
	if len(charges) == 0 || len(charges) > MaxCharges {
		return nil, status.Errorf(codes.InvalidArgument, "request has %d charges, want 1 to %d", len(charges), MaxCharges)
	}
	c := &check{names: make([]string, 0, len(charges))}
	valid := make([]charge, 0, len(charges))
	for i, ch := range charges {
		v, known, err := n.validCharge(set, ch, action, perms)
		if err != nil {
			st := status.Convert(err)
			return nil, status.Errorf(st.Code(), "charge %d: %s", i, st.Message())
		}
		if !known {
			if n.cfg.UnknownPolicy == UnknownDeny && c.unknownDeny == "" {
				c.unknownDeny = ch.GetPolicy()
			}
			n.m.decisions.WithLabelValues("unknown", n.cfg.Region, resultUnknown).Inc()
			continue
		}
		valid = append(valid, v)
		c.names = append(c.names, v.pol.Name)
	}
	c.items = make([]item, 0, len(valid))
	subjects := make([]string, len(valid))
	now := n.cfg.Clock.Now()
	for i, v := range valid {
		it, err := n.policyItem(v.pol, v.subject, bucket.Subject{}, v.cost, shares, now)
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "charge %d, policy %q: %v", i, v.pol.Name, err)
		}
		c.items = append(c.items, it)
		subjects[i] = v.subject
	}
	// The decision log hashes the check's subject: here every charge's.
	c.subject = strings.Join(subjects, ",")
	return c, nil
}

// validCharge checks one charge's bounds, policy and grant and
// normalizes its subject. known is false for a policy not in set that
// Config.UnknownPolicy lets a check go on without (deny or allow).
func (n *Node) validCharge(set *policy.Set, ch *quotav1.Charge, action grants.Action, perms grants.Perms) (v charge, known bool, err error) {
	name, subject := ch.GetPolicy(), ch.GetSubject()
	if len(name) == 0 || len(name) > bucket.MaxPolicyNameLen {
		return v, false, status.Errorf(codes.InvalidArgument, "policy name has %d bytes, want 1 to %d", len(name), bucket.MaxPolicyNameLen)
	}
	if len(subject) == 0 || len(subject) > MaxRawSubjectLen {
		return v, false, status.Errorf(codes.InvalidArgument, "subject has %d bytes, want 1 to %d", len(subject), MaxRawSubjectLen)
	}
	cost, err := validCost(ch.GetCost())
	if err != nil {
		return v, false, err
	}
	p, ok := set.Get(name)
	if !ok {
		if action == grants.Check && (n.cfg.UnknownPolicy == UnknownDeny || n.cfg.UnknownPolicy == UnknownAllow) {
			return v, false, nil
		}
		return v, false, status.Errorf(codes.NotFound, "unknown policy %q", name)
	}
	if !perms.Allows(action, name) {
		n.forbid("admission", action)
		return v, false, status.Errorf(codes.PermissionDenied, "caller may not %s policy %q", action, name)
	}
	if cost > p.Limits.Capacity {
		return v, false, status.Errorf(codes.InvalidArgument, "cost %d exceeds the capacity %d of policy %q", cost, p.Limits.Capacity, name)
	}
	subject, err = n.normalSubject(subject, ch.GetHashSubject() || p.HashSubject, p.Subject == "ip")
	if err != nil {
		return v, false, err
	}
	return charge{pol: p, subject: subject, cost: cost}, true, nil
}

// validCost checks a requested cost and returns the cost charged: 0
// means 1. Errors are InvalidArgument.
func validCost(cost int64) (int64, error) {
	switch {
	case cost < 0:
		return 0, status.Errorf(codes.InvalidArgument, "cost %d is negative", cost)
	case cost > MaxCost:
		return 0, status.Errorf(codes.InvalidArgument, "cost %d exceeds %d", cost, int64(MaxCost))
	case cost == 0:
		return 1, nil
	}
	return cost, nil
}

// normalSubject turns a requested subject into the one buckets are keyed
// by: an IPv6 address aggregated to its prefix when the policy limits
// addresses, then hashed when asked (raw identities of any form), or else
// checked against the subject syntax. Errors are InvalidArgument.
func (n *Node) normalSubject(subject string, hash, ip bool) (string, error) {
	if ip {
		subject = ipSubject(subject, n.cfg.IPv6SubjectPrefix)
	}
	if hash {
		return bucket.HashSubject(n.cfg.SubjectSalt, subject), nil
	}
	if err := bucket.ValidateSubject(subject); err != nil {
		return "", status.Errorf(codes.InvalidArgument, "subject: %v (set hash_subject for raw identities)", err)
	}
	return subject, nil
}
