package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/clock"
	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/policy"
	"github.com/quotacoord/quota/plan"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
	"github.com/quotacoord/quota/rebalance"
	"github.com/quotacoord/quota/sim"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// maxDocBytes bounds a policy document.
const maxDocBytes = 1 << 20

// share tolerance for the Σ checks.
const tolerance = 1e-9

// maxShownRegions bounds the regions alloc show reads.
const maxShownRegions = 1024

type operator struct {
	quotav1.UnimplementedOperatorServer
	cli      *clientv3.Client
	layout   etcdlayout.Layout
	loop     *rebalance.Loop
	clock    clock.Clock
	log      hclog.Logger
	auditMax int

	mu  sync.Mutex
	seq uint64
}

func (o *operator) policies(ctx context.Context) (*policy.Set, map[string][]byte, error) {
	resp, err := o.cli.Get(ctx, o.layout.PoliciesPrefix(), clientv3.WithPrefix())
	if err != nil {
		return nil, nil, status.Errorf(codes.Unavailable, "read policies: %v", err)
	}
	docs := make(map[string][]byte, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		docs[etcdlayout.Name(o.layout.PoliciesPrefix(), string(kv.Key))] = kv.Value
	}
	set, errs := policy.LoadStored(docs)
	for _, e := range errs {
		o.log.Warn("stored policy document skipped", "error", e)
	}
	return set, docs, nil
}

func (o *operator) policy(ctx context.Context, name string) (*policy.Policy, error) {
	set, _, err := o.policies(ctx)
	if err != nil {
		return nil, err
	}
	p, ok := set.Get(name)
	if !ok {
		return nil, status.Errorf(codes.NotFound, "unknown policy %q (quotactl policy list shows the known ones)", name)
	}
	return p, nil
}

func (o *operator) control(ctx context.Context, name string) (etcdlayout.Control, int64, error) {
	resp, err := o.cli.Get(ctx, o.layout.Control(name))
	if err != nil {
		return etcdlayout.Control{}, 0, status.Errorf(codes.Unavailable, "read control of %s: %v", name, err)
	}
	var c etcdlayout.Control
	if len(resp.Kvs) == 0 {
		return c, 0, nil
	}
	if err := json.Unmarshal(resp.Kvs[0].Value, &c); err != nil {
		return c, 0, status.Errorf(codes.Internal, "decode control of %s: %v", name, err)
	}
	return c, resp.Kvs[0].ModRevision, nil
}

// auditOp builds the put of one audit entry.
func (o *operator) auditOp(ctx context.Context, action, policyName, detail string) clientv3.Op {
	o.mu.Lock()
	o.seq++
	seq := o.seq
	o.mu.Unlock()
	now := o.clock.Now()
	e := etcdlayout.AuditEntry{At: now, Actor: actor(ctx), Action: action, Policy: policyName, Detail: detail}
	data, _ := json.Marshal(e)
	o.log.Info("operator action", "actor", e.Actor, "action", action, "policy", policyName, "detail", detail)
	return clientv3.OpPut(o.layout.Audit(now, seq), string(data))
}

// trimAudit keeps the newest auditMax entries.
func (o *operator) trimAudit(ctx context.Context) {
	resp, err := o.cli.Get(ctx, o.layout.AuditPrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count <= int64(o.auditMax) {
		return
	}
	extra := min(resp.Count-int64(o.auditMax), 128)
	old, err := o.cli.Get(ctx, o.layout.AuditPrefix(), clientv3.WithPrefix(), clientv3.WithKeysOnly(),
		clientv3.WithLimit(extra), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return
	}
	for _, kv := range old.Kvs {
		_, _ = o.cli.Delete(ctx, string(kv.Key))
	}
}

// updateControl applies fn to a policy's control under optimistic
// concurrency and records the action.
func (o *operator) updateControl(ctx context.Context, name, action string, fn func(p *policy.Policy, c *etcdlayout.Control) (string, error)) error {
	p, err := o.policy(ctx, name)
	if err != nil {
		return err
	}
	for range 5 {
		c, rev, err := o.control(ctx, name)
		if err != nil {
			return err
		}
		detail, err := fn(p, &c)
		if err != nil {
			return err
		}
		data, _ := json.Marshal(c)
		key := o.layout.Control(name)
		resp, err := o.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).
			Then(clientv3.OpPut(key, string(data)), o.auditOp(ctx, action, name, detail)).
			Commit()
		if err != nil {
			return status.Errorf(codes.Unavailable, "write control of %s: %v", name, err)
		}
		if resp.Succeeded {
			o.trimAudit(ctx)
			return nil
		}
	}
	return status.Errorf(codes.Aborted, "control of %s changed concurrently five times; retry", name)
}

// regions lists every region the policy's shares may concern.
func (o *operator) regions(ctx context.Context, name string, c etcdlayout.Control) ([]string, error) {
	set := map[string]bool{}
	resp, err := o.cli.Get(ctx, o.layout.RegionsPrefix(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "read regions: %v", err)
	}
	for _, kv := range resp.Kvs {
		if region, _, ok := etcdlayout.NodeOf(o.layout.RegionsPrefix(), string(kv.Key)); ok {
			set[region] = true
		}
	}
	a, err := o.alloc(ctx, name)
	if err != nil {
		return nil, err
	}
	if a != nil {
		for r := range a.Default {
			set[r] = true
		}
	}
	for _, m := range []map[string]float64{c.Pins, c.Minimums} {
		for r := range m {
			set[r] = true
		}
	}
	return slices.Sorted(maps.Keys(set)), nil
}

func (o *operator) alloc(ctx context.Context, name string) (*etcdlayout.Allocation, error) {
	resp, err := o.cli.Get(ctx, o.layout.Alloc(name))
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "read allocation of %s: %v", name, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	var a etcdlayout.Allocation
	if err := json.Unmarshal(resp.Kvs[0].Value, &a); err != nil {
		return nil, status.Errorf(codes.Internal, "decode allocation of %s: %v", name, err)
	}
	return &a, nil
}

func minimum(p *policy.Policy, c *etcdlayout.Control, region string) float64 {
	if m, ok := c.Minimums[region]; ok {
		return m
	}
	return p.MinShareFor(region)
}

// checkShares validates pins and minimums against Σ ≤ 1 + ε and Σ min ≤ 1.
func checkShares(p *policy.Policy, c *etcdlayout.Control, regions []string) error {
	budget := 1 + p.Limits.Overcommit
	sumMin, sumFixed := 0.0, 0.0
	for _, r := range regions {
		m := minimum(p, c, r)
		sumMin += m
		if pin, ok := c.Pins[r]; ok {
			if pin < m-tolerance {
				return status.Errorf(codes.InvalidArgument, "region %s: pin %v is below its minimum share %v; lower the minimum first", r, pin, m)
			}
			sumFixed += pin
		} else {
			sumFixed += m
		}
	}
	if sumMin > 1+tolerance {
		return status.Errorf(codes.InvalidArgument, "minimum shares of %s would sum to %.6g over regions %v, more than 1", p.Name, sumMin, regions)
	}
	if sumFixed > budget+tolerance {
		return status.Errorf(codes.InvalidArgument, "pins of %s plus the other regions' minimums would sum to %.6g, more than 1 + ε = %.6g", p.Name, sumFixed, budget)
	}
	return nil
}

func validName(what, v string) error {
	if !etcdlayout.ValidName(v) {
		return status.Errorf(codes.InvalidArgument, "%s %q must match [A-Za-z0-9_.-]{1,64}", what, v)
	}
	return nil
}

func validNumber(what string, v, lo, hi float64) error {
	if math.IsNaN(v) || v < lo || v > hi {
		return status.Errorf(codes.InvalidArgument, "%s %v must be in [%v, %v]", what, v, lo, hi)
	}
	return nil
}

func (o *operator) ApplyPolicy(ctx context.Context, req *quotav1.ApplyPolicyRequest) (*quotav1.ApplyPolicyResponse, error) {
	if len(req.Document) > maxDocBytes {
		return nil, status.Errorf(codes.InvalidArgument, "document is %d bytes, more than %d", len(req.Document), maxDocBytes)
	}
	doc := req.Doc
	if doc == "" {
		base := filepath.Base(req.Filename)
		doc = strings.TrimSuffix(base, filepath.Ext(base))
	}
	if err := validName("document name", doc); err != nil {
		return nil, err
	}
	set, err := policy.Parse(doc, req.Document)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "%s: %v", req.Filename, err)
	}
	_, docs, err := o.policies(ctx)
	if err != nil {
		return nil, err
	}
	delete(docs, doc)
	others, _ := policy.LoadStored(docs)
	if _, err := policy.Merge(others, set); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "%v", err)
	}
	names := make([]string, 0, set.Len())
	for _, p := range set.Policies() {
		names = append(names, p.Name)
	}
	_, err = o.cli.Txn(ctx).Then(
		clientv3.OpPut(o.layout.PolicyDoc(doc), string(req.Document)),
		o.auditOp(ctx, "policy-apply", strings.Join(names, ","), fmt.Sprintf("document %s from %s (%d bytes)", doc, req.Filename, len(req.Document))),
	).Commit()
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "store policy document: %v", err)
	}
	o.trimAudit(ctx)
	return &quotav1.ApplyPolicyResponse{Doc: doc, Policies: names}, nil
}

func (o *operator) info(ctx context.Context, p *policy.Policy) *quotav1.PolicyInfo {
	c, _, _ := o.control(ctx, p.Name)
	return &quotav1.PolicyInfo{
		Name: p.Name, Doc: p.Source, Version: p.Version, Subject: p.Subject,
		Capacity: float64(p.Limits.Capacity), RefillPerSecond: p.Limits.RefillPerSecond,
		Overcommit: p.Limits.Overcommit, FailureMode: string(p.FailureMode),
		DefaultMinShare: p.DefaultMinShare, MinShare: maps.Clone(p.MinShare), Frozen: c.Frozen,
	}
}

func (o *operator) ListPolicies(ctx context.Context, _ *quotav1.ListPoliciesRequest) (*quotav1.ListPoliciesResponse, error) {
	set, _, err := o.policies(ctx)
	if err != nil {
		return nil, err
	}
	out := &quotav1.ListPoliciesResponse{}
	for _, p := range set.Policies() {
		out.Policies = append(out.Policies, o.info(ctx, p))
	}
	return out, nil
}

func (o *operator) ShowPolicy(ctx context.Context, req *quotav1.ShowPolicyRequest) (*quotav1.ShowPolicyResponse, error) {
	set, docs, err := o.policies(ctx)
	if err != nil {
		return nil, err
	}
	p, ok := set.Get(req.Name)
	if !ok {
		return nil, status.Errorf(codes.NotFound, "unknown policy %q", req.Name)
	}
	c, _, err := o.control(ctx, p.Name)
	if err != nil {
		return nil, err
	}
	return &quotav1.ShowPolicyResponse{
		Policy: o.info(ctx, p), Document: docs[p.Source],
		Control: &quotav1.Control{Frozen: c.Frozen, Pins: c.Pins, Weights: c.Weights, Minimums: c.Minimums},
	}, nil
}

func (o *operator) ShowAllocation(ctx context.Context, req *quotav1.ShowAllocationRequest) (*quotav1.ShowAllocationResponse, error) {
	ly := o.layout
	prefixes := []string{ly.AllocPrefix(), ly.RegionsPrefix(), ly.AcksPrefix(), ly.DemandPrefix(), ly.ControlPrefix()}
	ops := make([]clientv3.Op, len(prefixes))
	for i, p := range prefixes {
		ops[i] = clientv3.OpGet(p, clientv3.WithPrefix())
	}
	resp, err := o.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "read allocations: %v", err)
	}
	allocs := map[string]etcdlayout.Allocation{}
	// live (each registered node's fingerprint), acks and demand are per
	// region, then per node.
	live := map[string]map[string]string{}
	acks := map[string]map[string]etcdlayout.Ack{}
	demand := map[string]map[string]etcdlayout.DemandReport{}
	controls := map[string]etcdlayout.Control{}
	for i, r := range resp.Responses {
		for _, kv := range r.GetResponseRange().Kvs {
			name := etcdlayout.Name(prefixes[i], string(kv.Key))
			region, node, nodeKey := etcdlayout.NodeOf(prefixes[i], string(kv.Key))
			switch i {
			case 0:
				var a etcdlayout.Allocation
				if json.Unmarshal(kv.Value, &a) == nil {
					allocs[name] = a
				}
			case 1:
				var reg etcdlayout.Registration
				if nodeKey && len(live) < maxShownRegions {
					_ = json.Unmarshal(kv.Value, &reg) // a record that does not parse still makes its node live
					setIn(live, region, node, reg.Fingerprint)
				}
			case 2:
				if region, node, _, a, err := ly.DecodeAck(string(kv.Key), kv.Value); err == nil && (acks[region] != nil || len(acks) < maxShownRegions) {
					cur := acks[region][node]
					setIn(acks, region, node, *etcdlayout.MergeAck(&cur, a))
				}
			case 3:
				if region, node, id, d, err := ly.DecodeDemand(string(kv.Key), kv.Value); err == nil && (demand[region] != nil || len(demand) < maxShownRegions) {
					cur := demand[region][node]
					setIn(demand, region, node, *etcdlayout.MergeDemand(&cur, id, d))
				}
			case 4:
				var c etcdlayout.Control
				if json.Unmarshal(kv.Value, &c) == nil {
					controls[name] = c
				}
			}
		}
	}
	if req.Policy != "" {
		if _, ok := allocs[req.Policy]; !ok {
			if _, err := o.policy(ctx, req.Policy); err != nil {
				return nil, err
			}
			return nil, status.Errorf(codes.NotFound, "policy %q has no allocation yet (no coordinator has led since it was applied, or no region registered)", req.Policy)
		}
	}
	out := &quotav1.ShowAllocationResponse{}
	if l, err := o.loop.Leader(ctx); err == nil {
		out.Leader = l
	}
	view := plan.View{Regions: map[string]map[string]plan.Node{}}
	for r, nodes := range live {
		view.Regions[r] = map[string]plan.Node{}
		for n, fp := range nodes {
			view.Regions[r][n] = plan.Node{Fingerprint: fp}
		}
	}
	mismatched := view.Mismatched()
	for _, name := range slices.Sorted(maps.Keys(allocs)) {
		if req.Policy != "" && name != req.Policy {
			continue
		}
		a := allocs[name]
		c := controls[name]
		info := &quotav1.AllocationInfo{
			Policy: name, Epoch: a.Epoch, Phase: string(a.Phase), PublishedAt: timestamppb.New(a.PublishedAt),
			Reason: a.Reason, Overrides: uint32(len(a.Overrides)), Overcommit: a.Overcommit, Frozen: c.Frozen,
		}
		regions := map[string]bool{}
		for r := range a.Default {
			regions[r] = true
		}
		for r := range live {
			regions[r] = true
		}
		for _, r := range slices.Sorted(maps.Keys(regions)) {
			rs := &quotav1.RegionShare{
				Region: r, Share: a.Default[r], Target: a.Default[r], Safe: a.Safe[r], Live: len(live[r]) > 0,
				AckedEpoch: regionAck(live[r], acks[r], name), ConfigMismatch: slices.Contains(mismatched, r),
			}
			if a.Target != nil {
				rs.Target = a.Target.Default[r]
			}
			for _, d := range demand[r] {
				if pd, ok := d.Policies[name]; ok {
					rs.Offered += pd.Offered
					rs.Admitted += pd.Admitted
				}
			}
			_, rs.Pinned = c.Pins[r]
			rs.Nodes = nodeAcks(live[r], acks[r], name)
			info.Regions = append(info.Regions, rs)
		}
		out.Allocations = append(out.Allocations, info)
	}
	return out, nil
}

// setIn sets m[outer][inner] = v, making the inner map when needed.
func setIn[V any](m map[string]map[string]V, outer, inner string, v V) {
	if m[outer] == nil {
		m[outer] = map[string]V{}
	}
	m[outer][inner] = v
}

// regionAck is the epoch of policy a region has acknowledged: the least
// over its registered nodes (a node without an acknowledgement counts as
// 0), or, for a region without registered nodes, the least over the
// acknowledgements still stored.
func regionAck(nodes map[string]string, acks map[string]etcdlayout.Ack, policy string) uint64 {
	first := true
	var least uint64
	consider := func(e uint64) {
		if first || e < least {
			least, first = e, false
		}
	}
	if len(nodes) > 0 {
		for n := range nodes {
			consider(acks[n].Epochs[policy])
		}
		return least
	}
	for _, a := range acks {
		consider(a.Epochs[policy])
	}
	return least
}

// nodeAcks lists a region's nodes, registered or with a stored
// acknowledgement, sorted by id.
func nodeAcks(nodes map[string]string, acks map[string]etcdlayout.Ack, policy string) []*quotav1.NodeAck {
	ids := map[string]bool{}
	for n := range nodes {
		ids[n] = true
	}
	for n := range acks {
		ids[n] = true
	}
	out := make([]*quotav1.NodeAck, 0, len(ids))
	for _, n := range slices.Sorted(maps.Keys(ids)) {
		fp, live := nodes[n]
		out = append(out, &quotav1.NodeAck{Node: n, AckedEpoch: acks[n].Epochs[policy], Live: live, Fingerprint: fp})
	}
	return out
}

func (o *operator) RebalanceNow(ctx context.Context, _ *quotav1.RebalanceNowRequest) (*quotav1.RebalanceNowResponse, error) {
	res, err := o.loop.RebalanceNow(ctx)
	if errors.Is(err, rebalance.ErrNotLeader) {
		leader, _ := o.loop.Leader(ctx)
		return nil, status.Errorf(codes.FailedPrecondition, "this coordinator does not lead; the leader is %q", leader)
	}
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "rebalance: %v", err)
	}
	if _, err := o.cli.Txn(ctx).Then(o.auditOp(ctx, "rebalance-now", "", strings.Join(res.Published, ", "))).Commit(); err != nil {
		o.log.Warn("audit write failed", "error", err)
	}
	o.trimAudit(ctx)
	return &quotav1.RebalanceNowResponse{Published: res.Published, Waiting: res.Waiting}, nil
}

func (o *operator) DryRun(ctx context.Context, req *quotav1.DryRunRequest) (*quotav1.DryRunResponse, error) {
	pr, err := o.loop.DryRun(ctx, req.Policy)
	if errors.Is(err, rebalance.ErrUnknownPolicy) {
		return nil, status.Errorf(codes.NotFound, "unknown policy %q", req.Policy)
	}
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "dry run: %v", err)
	}
	out := &quotav1.DryRunResponse{Policy: req.Policy, Note: pr.Note}
	current := map[string]float64{}
	if pr.Current != nil {
		out.Epoch = pr.Current.Epoch
		current = pr.Current.Default
		if pr.Current.Target != nil {
			current = pr.Current.Target.Default
		}
	}
	proposed := map[string]float64{}
	if pr.Next != nil {
		proposed = pr.Next.Default
		out.Overrides = uint32(len(pr.Next.Overrides))
	}
	regions := map[string]bool{}
	for r := range current {
		regions[r] = true
	}
	for r := range proposed {
		regions[r] = true
	}
	names := slices.Sorted(maps.Keys(regions))
	for _, r := range names {
		out.Regions = append(out.Regions, &quotav1.ProposedShare{Region: r, Current: current[r], Proposed: proposed[r], Demand: pr.Demand[r]})
	}
	if pr.Next != nil {
		p, err := o.policy(ctx, req.Policy)
		if err != nil {
			return nil, err
		}
		out.Prediction = predict(p, names, current, proposed, pr)
	}
	return out, nil
}

// predictDuration is how much traffic a dry-run simulates.
const predictDuration = 10 * time.Minute

// predict asks the simulator what moving from current to proposed costs
// the policy's hottest reported subject (any algorithm), or returns nil
// when the policy has no limits to simulate.
func predict(p *policy.Policy, names []string, current, proposed map[string]float64, pr rebalance.Proposal) *quotav1.Prediction {
	l := p.Limits
	rate := l.RefillPerSecond
	if l.Algorithm != "" && l.Algorithm != bucket.TokenBucket && l.Window > 0 {
		rate = float64(l.Capacity) / l.Window.Seconds()
	}
	if p.Unlimited || !(rate > 0) || len(names) == 0 || len(names) > sim.MaxScenarioRegions {
		return nil
	}
	sp := sim.Proposal{
		Capacity: l.Capacity, RefillPerSecond: rate, Overcommit: l.Overcommit, Algorithm: l.Algorithm, Window: l.Window,
		RebalanceInterval: pr.Interval, Protocol: sim.TwoStep, Duration: predictDuration, Seed: 1,
	}
	if pr.Protocol == rebalance.ProtocolNaive {
		sp.Protocol = sim.Naive
	}
	out := &quotav1.Prediction{SubjectDemand: map[string]float64{}, SimulatedS: predictDuration.Seconds()}
	for _, r := range names {
		d := pr.HottestSubject[r] / rate
		sp.Current = append(sp.Current, current[r])
		sp.Proposed = append(sp.Proposed, proposed[r])
		sp.Demand = append(sp.Demand, d)
		out.SubjectDemand[r] = d
	}
	res, err := sim.PredictOvershoot(sp)
	if err != nil {
		return nil
	}
	out.Overshoot_1S, out.Overshoot_10S, out.Overshoot_60S = res.Overshoot1s, res.Overshoot10s, res.Overshoot60s
	out.OvershootWindow = res.OvershootWindow
	out.UnderAdmission, out.MaxShareSum = res.UnderAdmission, res.MaxShareSum
	return out
}

func (o *operator) Freeze(ctx context.Context, req *quotav1.FreezeRequest) (*quotav1.FreezeResponse, error) {
	err := o.updateControl(ctx, req.Policy, "freeze", func(_ *policy.Policy, c *etcdlayout.Control) (string, error) {
		c.Frozen = true
		return "frozen", nil
	})
	return &quotav1.FreezeResponse{}, err
}

func (o *operator) Unfreeze(ctx context.Context, req *quotav1.UnfreezeRequest) (*quotav1.UnfreezeResponse, error) {
	err := o.updateControl(ctx, req.Policy, "unfreeze", func(_ *policy.Policy, c *etcdlayout.Control) (string, error) {
		c.Frozen = false
		return "unfrozen", nil
	})
	return &quotav1.UnfreezeResponse{}, err
}

func (o *operator) Pin(ctx context.Context, req *quotav1.PinRequest) (*quotav1.PinResponse, error) {
	if err := validName("region", req.Region); err != nil {
		return nil, err
	}
	err := o.updateControl(ctx, req.Policy, "pin", func(p *policy.Policy, c *etcdlayout.Control) (string, error) {
		if err := validNumber("share", req.Share, 0, 1+p.Limits.Overcommit); err != nil {
			return "", err
		}
		if c.Pins == nil {
			c.Pins = map[string]float64{}
		}
		c.Pins[req.Region] = req.Share
		regions, err := o.regions(ctx, req.Policy, *c)
		if err != nil {
			return "", err
		}
		if err := checkShares(p, c, regions); err != nil {
			return "", err
		}
		return fmt.Sprintf("pin %s at %v", req.Region, req.Share), nil
	})
	return &quotav1.PinResponse{}, err
}

func (o *operator) Unpin(ctx context.Context, req *quotav1.UnpinRequest) (*quotav1.UnpinResponse, error) {
	err := o.updateControl(ctx, req.Policy, "unpin", func(_ *policy.Policy, c *etcdlayout.Control) (string, error) {
		if _, ok := c.Pins[req.Region]; !ok {
			return "", status.Errorf(codes.NotFound, "region %q is not pinned in policy %s", req.Region, req.Policy)
		}
		delete(c.Pins, req.Region)
		return "unpin " + req.Region, nil
	})
	return &quotav1.UnpinResponse{}, err
}

func (o *operator) SetWeight(ctx context.Context, req *quotav1.SetWeightRequest) (*quotav1.SetWeightResponse, error) {
	if err := validName("region", req.Region); err != nil {
		return nil, err
	}
	if err := validNumber("weight", req.Weight, 1e-6, 1000); err != nil {
		return nil, err
	}
	err := o.updateControl(ctx, req.Policy, "weight", func(_ *policy.Policy, c *etcdlayout.Control) (string, error) {
		if c.Weights == nil {
			c.Weights = map[string]float64{}
		}
		c.Weights[req.Region] = req.Weight
		return fmt.Sprintf("weight of %s = %v", req.Region, req.Weight), nil
	})
	return &quotav1.SetWeightResponse{}, err
}

func (o *operator) SetMinimum(ctx context.Context, req *quotav1.SetMinimumRequest) (*quotav1.SetMinimumResponse, error) {
	if err := validName("region", req.Region); err != nil {
		return nil, err
	}
	if err := validNumber("minimum", req.Minimum, 0, 1); err != nil {
		return nil, err
	}
	err := o.updateControl(ctx, req.Policy, "minimum", func(p *policy.Policy, c *etcdlayout.Control) (string, error) {
		if c.Minimums == nil {
			c.Minimums = map[string]float64{}
		}
		c.Minimums[req.Region] = req.Minimum
		regions, err := o.regions(ctx, req.Policy, *c)
		if err != nil {
			return "", err
		}
		if err := checkShares(p, c, regions); err != nil {
			return "", err
		}
		return fmt.Sprintf("minimum of %s = %v", req.Region, req.Minimum), nil
	})
	return &quotav1.SetMinimumResponse{}, err
}

func (o *operator) ListAudit(ctx context.Context, req *quotav1.ListAuditRequest) (*quotav1.ListAuditResponse, error) {
	limit := int64(req.Limit)
	if limit == 0 {
		limit = 50
	}
	limit = min(limit, 1000)
	resp, err := o.cli.Get(ctx, o.layout.AuditPrefix(), clientv3.WithPrefix(), clientv3.WithLimit(limit),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend))
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "read audit log: %v", err)
	}
	out := &quotav1.ListAuditResponse{}
	for _, kv := range resp.Kvs {
		var e etcdlayout.AuditEntry
		if json.Unmarshal(kv.Value, &e) != nil {
			continue
		}
		out.Entries = append(out.Entries, &quotav1.AuditEntry{At: timestamppb.New(e.At), Actor: e.Actor, Action: e.Action, Policy: e.Policy, Detail: e.Detail})
	}
	return out, nil
}

// RetireRegion records that region is retired, when it has no registered
// node (checked again in the write, so a node registering meanwhile
// makes it fail), with an audit entry. Rounds leave it out of every
// allocation while it stays without a node.
func (o *operator) RetireRegion(ctx context.Context, req *quotav1.RetireRegionRequest) (*quotav1.RetireRegionResponse, error) {
	if err := validName("region", req.Region); err != nil {
		return nil, err
	}
	nodes := o.layout.RegionNodes(req.Region)
	resp, err := o.cli.Get(ctx, nodes, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "read registrations of %s: %v", req.Region, err)
	}
	if resp.Count > 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "region %s has %d registered nodes; stop them before retiring it", req.Region, resp.Count)
	}
	data, _ := json.Marshal(etcdlayout.RetiredRegion{At: o.clock.Now(), Actor: actor(ctx)})
	txn, err := o.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(nodes), "<", resp.Header.Revision+1).WithPrefix()).
		Then(clientv3.OpPut(o.layout.Retired(req.Region), string(data)), o.auditOp(ctx, "retire-region", "", "region "+req.Region)).
		Commit()
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "retire %s: %v", req.Region, err)
	}
	if !txn.Succeeded {
		return nil, status.Errorf(codes.FailedPrecondition, "region %s registered a node meanwhile; not retired", req.Region)
	}
	o.trimAudit(ctx)
	return &quotav1.RetireRegionResponse{}, nil
}
