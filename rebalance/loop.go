package rebalance

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/plan"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Result reports one round.
type Result struct {
	// Published lists "policy@epoch (phase)" for every allocation written.
	Published []string
	// Waiting lists "policy: why" for policies whose growth waits.
	Waiting []string
	// deferred: a full round found a policy's shrink still waiting and
	// did not plan it on the demand it read.
	deferred bool
}

// Proposal is what a round would publish for one policy.
type Proposal struct {
	Policy string
	// Current is the allocation in force (nil when none).
	Current *etcdlayout.Allocation
	// Next is the proposed split (nil when nothing can be computed).
	Next *etcdlayout.Shares
	// Demand is the smoothed demand per region.
	Demand map[string]float64
	// Note explains why nothing would be published, if so.
	Note string
	// HottestSubject maps each region to the offered rate (cost per
	// second) of the most pressured subject it reported for the policy, 0
	// when it reported none: what a prediction of overshoot for the
	// proposed split should drive.
	HottestSubject map[string]float64
	// Interval and Protocol are the loop's, for predictions.
	Interval time.Duration
	Protocol Protocol
}

type roundReq struct {
	reply chan roundReply
}

type roundReply struct {
	res Result
	err error
}

// fence is the leader's proof of leadership for a write.
type fence struct {
	key string
	rev int64
}

// Loop is the rebalance loop of one coordinator. See the package doc.
type Loop struct {
	cfg     Config
	layout  etcdlayout.Layout
	m       *metrics
	reqs    chan roundReq
	leading atomic.Bool

	mu sync.Mutex // guards ld
	// ld is the planner's state while leading (an empty one otherwise).
	ld *plan.Leader

	// campaigned is closed when the last campaign's election call ended
	// (campaign). Only the Run goroutine uses it.
	campaigned chan struct{}

	// afterRead, when a test sets it before Run, runs in doRound between
	// the read and the publishes; afterPlan with the kind of round and
	// the policies it planned.
	afterRead func()
	afterPlan func(kind roundKind, planned []string)
}

// roundKind says what a round plans.
type roundKind int

const (
	// roundAcks finishes pending shrinks and gives new regions a share
	// (a round that is not full, plan.Leader.Plan).
	roundAcks roundKind = iota
	// roundChanged is a full round over what changed (dirtySet), or over
	// every policy each Config.FullEvery of them.
	roundChanged
	// roundEvery is a full round over every policy.
	roundEvery
)

// label is the kind's label in the metrics: "acks" or "full".
func (k roundKind) label() string {
	if k == roundAcks {
		return "acks"
	}
	return "full"
}

// New validates cfg and returns a Loop; Run starts it.
func New(cfg Config) (*Loop, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(c.Registerer)
	if err != nil {
		return nil, fmt.Errorf("rebalance: register metrics: %w", err)
	}
	l := &Loop{cfg: c, layout: etcdlayout.Layout{Prefix: c.Prefix}, m: m, reqs: make(chan roundReq), campaigned: make(chan struct{})}
	close(l.campaigned)
	if l.ld, err = plan.NewLeader(c.params(), time.Time{}); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return l, nil
}

// IsLeader says whether this Loop leads now.
func (l *Loop) IsLeader() bool { return l.leading.Load() }

// Leader returns the name of the current leader, or "" when none.
func (l *Loop) Leader(ctx context.Context) (string, error) {
	opts := append([]clientv3.OpOption{clientv3.WithPrefix()}, clientv3.WithFirstCreate()...)
	resp, err := l.cfg.Client.Get(ctx, l.layout.Election()+"/", opts...)
	if err != nil {
		return "", fmt.Errorf("rebalance: read leader: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return "", nil
	}
	return string(resp.Kvs[0].Value), nil
}

// Run campaigns for leadership and, while leading, runs a round every
// Interval, on RebalanceNow, whenever acknowledgements or registrations
// change (one round for all the changes already delivered), when a region that came back from having no registered node
// writes its first demand report, and right after the growth that ends a
// shrink a full round had to wait on. It blocks until ctx is done, then
// resigns and returns nil. It starts goroutines that end before it
// returns, but for a campaign cut off from etcd when ctx ended, which
// ends when the client is closed (campaign).
func (l *Loop) Run(ctx context.Context) error {
	log := l.cfg.Logger
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		sess, err := concurrency.NewSession(l.cfg.Client,
			concurrency.WithTTL(int(max(1, l.cfg.SessionTTL.Round(time.Second)/time.Second))),
			concurrency.WithContext(ctx))
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			log.Warn("election session failed", "error", err, "retry_in", backoff)
			sleep(ctx, backoff)
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		el := concurrency.NewElection(sess, l.layout.Election())
		if err := l.campaign(ctx, sess, el); err != nil {
			_ = sess.Close()
			if ctx.Err() == nil {
				log.Warn("campaign failed", "error", err)
				sleep(ctx, backoff)
			}
			continue
		}
		f := fence{key: el.Key(), rev: el.Rev()}
		log.Info("leading", "name", l.cfg.Name, "election_rev", f.rev)
		l.leading.Store(true)
		l.m.leader.Set(1)
		err = l.lead(ctx, sess, f)
		l.leading.Store(false)
		l.m.leader.Set(0)
		if err != nil && ctx.Err() == nil {
			log.Warn("lost leadership", "error", err)
		}
		rctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = el.Resign(rctx)
		cancel()
		_ = sess.Close()
	}
	l.mu.Lock()
	l.ld, _ = plan.NewLeader(l.cfg.params(), time.Time{}) // validated in New
	l.mu.Unlock()
	return nil
}

// campaign waits until this Loop leads on el, its session ends or ctx
// does. A campaign cancelled by either resigns on the client's own
// context (concurrency.Election.Campaign), which, cut off from etcd,
// waits until the client is closed, after Run returned: campaign returns
// without waiting for it, and the next campaign starts only once it
// ended (or ctx did), so that at most one lingers.
func (l *Loop) campaign(ctx context.Context, sess *concurrency.Session, el *concurrency.Election) error {
	select {
	case <-l.campaigned:
	case <-ctx.Done():
		return ctx.Err()
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ended := make(chan struct{})
	l.campaigned = ended
	done := make(chan error, 1)
	go func() {
		defer close(ended)
		done <- el.Campaign(cctx, l.cfg.Name)
	}()
	select {
	case err := <-done:
		return err
	case <-sess.Done():
		return errors.New("rebalance: election session ended while campaigning")
	case <-ctx.Done():
		return ctx.Err()
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// lead runs rounds until ctx ends, the session dies or a write is fenced
// off.
func (l *Loop) lead(ctx context.Context, sess *concurrency.Session, f fence) error {
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := l.publishSettings(lctx, f); err != nil {
		return err
	}
	l.mu.Lock()
	// No learning period: the first round observes the latest reports.
	l.ld, _ = plan.NewLeader(l.cfg.params(), l.cfg.Clock.Now()) // validated in New
	l.mu.Unlock()
	ds := newDirtySet()
	// A new leader holds growth for a skew margin (plan.Leader.ackWait).
	ds.allUntil = l.cfg.Clock.Now().Add(l.cfg.SkewMargin + l.cfg.Interval)
	// The records come from one read, then from one watch (kept).
	kept, err := l.keep(lctx)
	if err != nil {
		return err
	}
	defer kept.stop()
	tick := time.NewTicker(l.cfg.Interval)
	defer tick.Stop()
	// recheck re-runs an acknowledgement round while growth waits (a
	// skew margin runs out without any etcd event).
	recheck := time.NewTimer(time.Hour)
	recheck.Stop()
	defer recheck.Stop()
	recheckEvery := min(l.cfg.Interval, max(l.cfg.SkewMargin/4, 50*time.Millisecond))
	res, err := l.round(lctx, f, kept, ds, roundEvery)
	if errors.Is(err, ErrNotLeader) {
		return err
	}
	l.settle(roundEvery, res, err)
	for {
		if len(res.Waiting) > 0 {
			recheck.Reset(recheckEvery)
		}
		res, err = Result{}, nil
		kind := roundAcks
		select {
		case <-recheck.C:
			res, err = l.round(lctx, f, kept, ds, kind)
		case <-ctx.Done():
			return nil
		case <-sess.Done():
			return fmt.Errorf("%w: election session expired", ErrNotLeader)
		case <-tick.C:
			kind = roundChanged
			res, err = l.round(lctx, f, kept, ds, kind)
		case req := <-l.reqs:
			kind = roundEvery
			res, err = l.round(lctx, f, kept, ds, kind)
			req.reply <- roundReply{res, err}
		case <-kept.q.ready:
			// One round for every response queued: hundreds of nodes
			// acknowledging one publish, or registering at once, would
			// otherwise cost a round each.
			owed, terr := l.take(lctx, kept, ds)
			if terr != nil {
				if ctx.Err() != nil {
					return nil
				}
				return terr
			}
			if !owed {
				continue
			}
			res, err = l.round(lctx, f, kept, ds, kind)
		case <-kept.back:
			kind = roundEvery
			res, err = l.round(lctx, f, kept, ds, kind)
		}
		if l.settle(kind, res, err) {
			res, err = l.round(lctx, f, kept, ds, roundChanged)
			l.settle(roundChanged, res, err)
		}
		if errors.Is(err, ErrNotLeader) {
			return err
		}
		if err != nil {
			l.cfg.Logger.Warn("rebalance round failed", "error", err)
		}
	}
}

// watchQueue holds the responses of one watch until the lead loop takes
// them all at once: those that arrive while a round runs are read by the
// next round together, however the client paces their delivery. Each
// event is prepared as it arrives (queueWatch). At most limit bytes of
// values wait: past that the queue drops them and says so (overflowed),
// and the lead reads everything again, cheaper by then.
type watchQueue struct {
	// ready has a value when responses, or the watch's end, wait.
	ready chan struct{}
	mu    sync.Mutex
	resps []clientv3.WatchResponse
	// prepared holds what prepare made of each event of resps.
	prepared   [][]any
	bytes      int
	limit      int
	overflowed bool
	closed     bool
}

// maxQueued bounds the bytes of values the watch of the records queues.
const maxQueued = 128 << 20

// queueWatch queues ch's responses until ch closes (its context ends),
// with what prepare (nil: nothing) makes of each event, holding at most
// limit bytes of values.
func queueWatch(ch clientv3.WatchChan, prepare func(*clientv3.Event) any, limit int) *watchQueue {
	q := &watchQueue{ready: make(chan struct{}, 1), limit: limit}
	signal := func() {
		select {
		case q.ready <- struct{}{}:
		default:
		}
	}
	go func() {
		for wr := range ch {
			pre := make([]any, len(wr.Events))
			n := 0
			for i, ev := range wr.Events {
				n += len(ev.Kv.Value)
				if prepare != nil {
					pre[i] = prepare(ev)
				}
			}
			q.mu.Lock()
			if q.bytes+n > q.limit {
				q.resps, q.prepared, q.bytes, q.overflowed = nil, nil, 0, true
			} else {
				q.resps, q.prepared, q.bytes = append(q.resps, wr), append(q.prepared, pre), q.bytes+n
			}
			q.mu.Unlock()
			signal()
		}
		q.mu.Lock()
		q.closed = true
		q.mu.Unlock()
		signal()
	}()
	return q
}

// take returns and removes every queued response, what was prepared of
// their events, whether responses were dropped over the bound, and
// whether the watch closed.
func (q *watchQueue) take() (resps []clientv3.WatchResponse, prepared [][]any, overflowed, closed bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	resps, prepared, overflowed, closed = q.resps, q.prepared, q.overflowed, q.closed
	q.resps, q.prepared, q.bytes, q.overflowed = nil, nil, 0, false
	return resps, prepared, overflowed, closed
}

// watchEnded reports whether a watch of what that delivered (wr, ok) ends
// the lead, and with which error: nil when ctx ended, else the watch's
// failure.
func watchEnded(ctx context.Context, what string, wr clientv3.WatchResponse, ok bool) (bool, error) {
	if !ok {
		if ctx.Err() != nil {
			return true, nil
		}
		return true, fmt.Errorf("rebalance: watch of %s closed", what)
	}
	if err := wr.Err(); err != nil {
		return true, fmt.Errorf("rebalance: watch %s: %w", what, err)
	}
	return false, nil
}

// settle tells the planner how a round ended and reports whether a full
// round is owed at once (plan.Leader.Settle).
func (l *Loop) settle(kind roundKind, res Result, err error) bool {
	if err != nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ld.Settle(kind != roundAcks, res.deferred, len(res.Published) > 0)
}

// RebalanceNow runs a full round in the loop's goroutine and returns what
// it published. It fails with ErrNotLeader on a follower.
func (l *Loop) RebalanceNow(ctx context.Context) (Result, error) {
	if !l.IsLeader() {
		return Result{}, ErrNotLeader
	}
	req := roundReq{reply: make(chan roundReply, 1)}
	select {
	case l.reqs <- req:
	case <-ctx.Done():
		return Result{}, ctx.Err()
	}
	select {
	case r := <-req.reply:
		return r.res, r.err
	case <-ctx.Done():
		return Result{}, ctx.Err()
	}
}

// DryRun computes what a full round would propose for policy now, on any
// coordinator, without writing. It fails with ErrUnknownPolicy when no
// document defines policy.
func (l *Loop) DryRun(ctx context.Context, policyName string) (Proposal, error) {
	snap, err := l.read(ctx)
	if err != nil {
		return Proposal{}, err
	}
	p, ok := snap.policies.Get(policyName)
	if !ok {
		return Proposal{}, fmt.Errorf("%w: %q", ErrUnknownPolicy, policyName)
	}
	l.mu.Lock()
	ld := l.ld.Clone()
	l.mu.Unlock()
	now := l.cfg.Clock.Now()
	ld.Track(now, snap.view, snap.allocs)
	ld.Observe(snap.view, snap.planPolicies())
	d := ld.Plan(now, snap.view, planPolicy(p), snap.allocs[policyName], snap.controls[policyName], true)
	out := Proposal{Policy: policyName, Current: snap.allocs[policyName], Next: d.Proposal, Demand: d.Demand, Note: d.Note,
		HottestSubject: map[string]float64{}, Interval: l.cfg.Interval, Protocol: l.cfg.Protocol}
	for region, rep := range snap.view.Demand {
		hot := 0.0
		for _, sd := range rep[policyName].Pressured {
			hot = max(hot, sd.Offered)
		}
		out.HottestSubject[region] = hot
	}
	if out.Next == nil && d.Publish != nil {
		out.Next = &etcdlayout.Shares{Default: d.Publish.Default, Overrides: d.Publish.Overrides}
	}
	return out, nil
}

// round brings the records kept in k up to date (current), plans and
// publishes; ds is what changed since the last full round. Only the Run
// goroutine calls it.
func (l *Loop) round(ctx context.Context, f fence, k *kept, ds *dirtySet, kind roundKind) (Result, error) {
	start := time.Now()
	res, err := l.doRound(ctx, f, k, ds, kind)
	l.cfg.Logger.Debug("round", "kind", kind.label(), "took", time.Since(start), "published", len(res.Published), "waiting", len(res.Waiting), "error", err)
	l.m.duration.Observe(time.Since(start).Seconds())
	result := "ok"
	switch {
	case errors.Is(err, ErrTooManyRegistrations):
		result = "refused"
		l.cfg.Logger.Error("round refused to publish: registrations over the bound (fake registrations, or raise the bound)", "error", err)
	case err != nil:
		result = "error"
	}
	l.m.rounds.WithLabelValues(kind.label(), result).Inc()
	return res, err
}

func (l *Loop) doRound(ctx context.Context, f fence, k *kept, ds *dirtySet, kind roundKind) (Result, error) {
	sweep := kind == roundChanged && ds.full+1 >= l.cfg.FullEvery
	if _, err := l.current(ctx, k, ds, sweep); err != nil {
		return Result{}, err
	}
	snap, err := k.m.snapshot()
	if err != nil {
		return Result{}, err
	}
	for _, e := range snap.policyErrs {
		l.cfg.Logger.Warn("policy document skipped", "error", e)
	}
	if l.afterRead != nil {
		l.afterRead()
	}
	now := l.cfg.Clock.Now()
	pols := snap.planPolicies()
	ds.diff(now, l.cfg.SkewMargin+l.cfg.Interval, snap, pols)
	full := kind != roundAcks
	l.mu.Lock()
	var pick func(string) bool
	if kind == roundChanged {
		pick = ds.pick(now, sweep, l.ld, snap.view, snap.allocs)
	}
	plans, planned := planRound(now, snap, pols, l.ld, full, pick)
	behind := l.ld.Behind()
	l.mu.Unlock()
	if full {
		ds.planned(pick == nil)
	}
	l.m.planned.WithLabelValues(kind.label()).Observe(float64(len(planned)))
	if l.afterPlan != nil {
		names := make([]string, len(planned))
		for i, p := range planned {
			names[i] = p.Name
		}
		l.afterPlan(kind, names)
	}
	res, err := l.publishPlans(ctx, f, snap, plans, behind)
	if err != nil {
		// What was planned and not published must be planned again.
		ds.everything()
		return res, err
	}
	l.m.observe(snap)
	return res, nil
}

// publishPlans keeps the vanished nodes behind, then publishes the
// allocations of plans over snap.
func (l *Loop) publishPlans(ctx context.Context, f fence, snap *snapshot, plans []plan.Decision, behind map[string]plan.Behind) (Result, error) {
	// Before any epoch that counts on them: a new leader must read back
	// the vanished nodes this round's plans held reservations for.
	if err := l.keepBehind(ctx, f, snap.storedBehind, behind); err != nil {
		return Result{}, err
	}
	l.dropKeptAcks(ctx, f, snap.keptAcks, behind)
	var res Result
	var pubs []publication
	var pubPlans []plan.Decision
	for _, d := range plans {
		res.deferred = res.deferred || d.Deferred
		if len(d.Mismatched) > 0 {
			l.cfg.Logger.Warn("regions not counted: a node of theirs reports other policies or subject naming than most nodes",
				"policy", d.Policy, "regions", d.Mismatched)
		}
		for _, n := range d.Missed {
			region, _, _ := strings.Cut(n, "/")
			l.m.acksMissed.WithLabelValues(region).Inc()
			l.cfg.Logger.Warn("growth stopped waiting for a node's acknowledgement at the deadline; it counts at its safe share",
				"policy", d.Policy, "node", n, "deadline", l.cfg.AckDeadline)
		}
		if d.Publish == nil {
			if d.Note != "" {
				res.Waiting = append(res.Waiting, d.Policy+": "+d.Note)
			}
			continue
		}
		pubs = append(pubs, publication{alloc: d.Publish, prevRev: snap.allocRevs[d.Policy]})
		pubPlans = append(pubPlans, d)
	}
	done, err := l.publishAll(ctx, f, pubs, snap.rev)
	for i, d := range pubPlans {
		if !done[i] {
			continue
		}
		snap.allocs[d.Policy] = d.Publish
		res.Published = append(res.Published, fmt.Sprintf("%s@%d (%s)", d.Policy, d.Publish.Epoch, d.Publish.Phase))
		l.m.epochs.WithLabelValues(d.Policy, string(d.Publish.Phase)).Inc()
		l.cfg.Logger.Info("published epoch", "policy", d.Policy, "epoch", d.Publish.Epoch, "phase", d.Publish.Phase, "why", d.Publish.Reason)
	}
	return res, err
}

// publication is one allocation to publish over the one in force, which
// the round read at mod revision prevRev (0: none).
type publication struct {
	alloc   *etcdlayout.Allocation
	prevRev int64
}

// publish writes a alone, like publishAll. It reports whether a was
// written.
func (l *Loop) publish(ctx context.Context, f fence, a *etcdlayout.Allocation, prevRev, readRev int64) (bool, error) {
	done, err := l.publishAll(ctx, f, []publication{{alloc: a, prevRev: prevRev}}, readRev)
	return done[0], err
}

// publishAll writes pubs in transactions of at most etcdlayout.MaxTxnOps
// compares and MaxTxnBytes, each fenced like one publish was: by f, by
// every allocation's mod revision, and by the registrations read at
// revision readRev (no registration may have been created or rewritten
// since, because a plan that did not see a region neither reserved its
// share nor counted what it may enforce). A batch refused because some
// allocations changed under it is written again without them; one refused
// because a registration changed ends the publishing (the next round
// plans again). It reports which publications were written, and fails
// with ErrNotLeader when f no longer holds.
func (l *Loop) publishAll(ctx context.Context, f fence, pubs []publication, readRev int64) ([]bool, error) {
	done := make([]bool, len(pubs))
	data := make([][]byte, len(pubs))
	sizes := make([]int, len(pubs))
	for i, p := range pubs {
		b, err := json.Marshal(p.alloc)
		if err != nil {
			return done, fmt.Errorf("rebalance: encode allocation of %s: %w", p.alloc.Policy, err)
		}
		data[i] = b
		sizes[i] = len(l.layout.Alloc(p.alloc.Policy)) + len(b)
	}
	// Two compares of every batch are the fence and the registrations.
	start := 0
	for _, end := range etcdlayout.Batches(sizes, etcdlayout.MaxTxnOps-2, etcdlayout.MaxTxnBytes) {
		batch := make([]int, 0, end-start)
		for i := start; i < end; i++ {
			batch = append(batch, i)
		}
		start = end
		for len(batch) > 0 {
			changed, regs, err := l.publishBatch(ctx, f, pubs, data, batch, readRev)
			if err != nil {
				return done, err
			}
			if regs {
				l.cfg.Logger.Warn("registrations changed since the read; the round's remaining allocations will be planned again",
					"unpublished", len(pubs)-countTrue(done))
				return done, nil
			}
			if len(changed) == 0 {
				for _, i := range batch {
					done[i] = true
				}
				break
			}
			batch = slices.DeleteFunc(batch, func(i int) bool {
				if changed[i] {
					l.cfg.Logger.Warn("allocation changed since the read; will retry", "policy", pubs[i].alloc.Policy, "epoch", pubs[i].alloc.Epoch)
				}
				return changed[i]
			})
		}
	}
	return done, nil
}

// publishBatch writes the publications batch (indices into pubs, data
// their encodings) in one fenced transaction. When etcd refuses it, it
// returns the publications whose allocation changed since the read, or
// regs when none did (a registration changed); ErrNotLeader when f no
// longer holds.
func (l *Loop) publishBatch(ctx context.Context, f fence, pubs []publication, data [][]byte, batch []int, readRev int64) (changed map[int]bool, regs bool, err error) {
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(f.key), "=", f.rev),
		clientv3.Compare(clientv3.ModRevision(l.layout.RegionsPrefix()), "<", readRev+1).WithPrefix()}
	puts := make([]clientv3.Op, 0, len(batch))
	gets := []clientv3.Op{clientv3.OpGet(f.key)}
	for _, i := range batch {
		key := l.layout.Alloc(pubs[i].alloc.Policy)
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(key), "=", pubs[i].prevRev))
		puts = append(puts, clientv3.OpPut(key, string(data[i])))
		gets = append(gets, clientv3.OpGet(key, clientv3.WithKeysOnly()))
	}
	resp, err := l.cfg.Client.Txn(ctx).If(cmps...).Then(puts...).Else(gets...).Commit()
	first := pubs[batch[0]].alloc
	if err != nil {
		return nil, false, fmt.Errorf("rebalance: publish %d allocations from %s epoch %d: %w", len(batch), first.Policy, first.Epoch, err)
	}
	l.m.publishTxns.Inc()
	if resp.Succeeded {
		return nil, false, nil
	}
	l.m.publishErr.Inc()
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 || kvs[0].CreateRevision != f.rev {
		return nil, false, fmt.Errorf("%w: publish of %d allocations from %s epoch %d fenced off", ErrNotLeader, len(batch), first.Policy, first.Epoch)
	}
	changed = map[int]bool{}
	for j, i := range batch {
		var rev int64
		if kvs := resp.Responses[j+1].GetResponseRange().Kvs; len(kvs) > 0 {
			rev = kvs[0].ModRevision
		}
		if rev != pubs[i].prevRev {
			changed[i] = true
		}
	}
	return changed, len(changed) == 0, nil
}

// countTrue counts the true values of bs.
func countTrue(bs []bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}

// keepBehind writes the vanished nodes of every region whose record in
// etcd (old) differs from the planner's (now), fenced by f, in
// transactions of at most etcdlayout.MaxTxnOps and MaxTxnBytes. It fails
// with ErrNotLeader when f no longer holds.
func (l *Loop) keepBehind(ctx context.Context, f fence, old, now map[string]plan.Behind) error {
	var ops []clientv3.Op
	var sizes []int
	for _, r := range slices.Sorted(maps.Keys(old)) {
		if _, ok := now[r]; !ok {
			ops = append(ops, clientv3.OpDelete(l.layout.Behind(r)))
			sizes = append(sizes, len(l.layout.Behind(r)))
		}
	}
	for _, r := range slices.Sorted(maps.Keys(now)) {
		data, err := json.Marshal(now[r])
		if err != nil {
			return fmt.Errorf("rebalance: encode vanished nodes of %s: %w", r, err)
		}
		if was, ok := old[r]; ok {
			if stored, _ := json.Marshal(was); bytes.Equal(stored, data) {
				continue
			}
		}
		ops = append(ops, clientv3.OpPut(l.layout.Behind(r), string(data)))
		sizes = append(sizes, len(l.layout.Behind(r))+len(data))
	}
	start := 0
	for _, end := range etcdlayout.Batches(sizes, etcdlayout.MaxTxnOps-1, etcdlayout.MaxTxnBytes) {
		resp, err := l.cfg.Client.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(f.key), "=", f.rev)).
			Then(ops[start:end]...).
			Commit()
		if err != nil {
			return fmt.Errorf("rebalance: write vanished nodes: %w", err)
		}
		if !resp.Succeeded {
			return fmt.Errorf("%w: write of vanished nodes fenced off", ErrNotLeader)
		}
		start = end
	}
	return nil
}

// keepVanished makes view.Behind the stored behind/ records plus every
// node whose acknowledgement is kept without a registration: a node that
// vanished, perhaps before any leader saw it go (a leader that failed
// between the lease's end and its own write of behind/), and that may,
// cut off, enforce the safe shares of the epochs it acknowledged. A node
// in both counts at the lower epoch of each policy.
func (snap *snapshot) keepVanished(acks map[string]map[string]map[string]uint64) {
	for r, ns := range snap.storedBehind {
		snap.view.Behind[r] = maps.Clone(ns)
	}
	for r, ns := range acks {
		for _, n := range slices.Sorted(maps.Keys(ns)) {
			if _, ok := snap.view.Regions[r][n]; ok {
				continue
			}
			snap.keptAcks[r] = append(snap.keptAcks[r], n)
			b := snap.view.Behind[r]
			if b == nil {
				b = plan.Behind{}
				snap.view.Behind[r] = b
			}
			if was, ok := b[n]; ok {
				b[n] = plan.LowerEpochs(was, ns[n])
			} else {
				b[n] = maps.Clone(ns[n])
			}
		}
	}
}

// dropKeptAcks deletes the kept acknowledgements of vanished nodes that
// behind (now written to etcd) holds, one by one or folded into their
// region's node "", fenced by f and by each node's registration being
// absent: a node that registered again deleted them itself and may have
// written new ones. A failure leaves them for the next round, which
// counts them again.
func (l *Loop) dropKeptAcks(ctx context.Context, f fence, kept map[string][]string, behind map[string]plan.Behind) {
	var nodes [][2]string
	for _, r := range slices.Sorted(maps.Keys(kept)) {
		for _, n := range kept[r] {
			_, one := behind[r][n]
			_, folded := behind[r][""]
			if one || folded {
				nodes = append(nodes, [2]string{r, n})
			}
		}
	}
	sizes := make([]int, len(nodes))
	for i, k := range nodes {
		sizes[i] = len(l.layout.NodeAcks(k[0], k[1])) + len(l.layout.Node(k[0], k[1]))
	}
	start := 0
	for _, end := range etcdlayout.Batches(sizes, etcdlayout.MaxTxnOps-1, etcdlayout.MaxTxnBytes) {
		cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(f.key), "=", f.rev)}
		var ops []clientv3.Op
		for _, k := range nodes[start:end] {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(l.layout.Node(k[0], k[1])), "=", 0))
			ops = append(ops, clientv3.OpDelete(l.layout.NodeAcks(k[0], k[1]), clientv3.WithPrefix()))
		}
		resp, err := l.cfg.Client.Txn(ctx).If(cmps...).Then(ops...).Commit()
		if err != nil || !resp.Succeeded {
			l.cfg.Logger.Debug("acknowledgements of vanished nodes left for the next round", "nodes", end-start, "error", err)
		}
		start = end
	}
}

func (l *Loop) publishSettings(ctx context.Context, f fence) error {
	s := etcdlayout.Settings{
		ReportIntervalSeconds: l.cfg.ReportInterval.Seconds(),
		LeaseTTLSeconds:       int64(max(1, l.cfg.RegionLeaseTTL.Round(time.Second)/time.Second)),
		AckDeadlineSeconds:    l.cfg.AckDeadline.Seconds(),
	}
	data, _ := json.Marshal(s)
	resp, err := l.cfg.Client.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(f.key), "=", f.rev)).
		Then(clientv3.OpPut(l.layout.Settings(), string(data))).
		Commit()
	if err != nil {
		return fmt.Errorf("rebalance: publish settings: %w", err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("%w: settings write fenced off", ErrNotLeader)
	}
	return nil
}

// setIn sets m[outer][inner] = v, making the inner map when needed.
func setIn[V any](m map[string]map[string]V, outer, inner string, v V) {
	if m[outer] == nil {
		m[outer] = map[string]V{}
	}
	m[outer][inner] = v
}

// read takes a snapshot of everything a round needs at one revision.
func (l *Loop) read(ctx context.Context) (*snapshot, error) {
	m, err := l.readMirror(ctx)
	if err != nil {
		return nil, err
	}
	return m.snapshot()
}

// readMirror reads every record a round needs at one revision into a new
// mirror.
func (l *Loop) readMirror(ctx context.Context) (*mirror, error) {
	m := newMirror(l.layout, l.cfg.Logger)
	prefixes := m.prefixes()
	ops := make([]clientv3.Op, len(prefixes))
	for i, p := range prefixes {
		ops[i] = clientv3.OpGet(p, clientv3.WithPrefix())
	}
	resp, err := l.cfg.Client.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, fmt.Errorf("rebalance: read state: %w", err)
	}
	kvs := make([][]*mvccpb.KeyValue, len(resp.Responses))
	for i, r := range resp.Responses {
		kvs[i] = r.GetResponseRange().Kvs
	}
	m.load(resp.Header.Revision, kvs)
	return m, nil
}
