package regionsync

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/quotacoord/quota/internal/clock"
	"github.com/quotacoord/quota/internal/etcdlayout"
)

// ErrNoLease reports a leased write attempted while the region holds no
// lease.
var ErrNoLease = errors.New("regionsync: no lease")

// ErrRunning reports a second call of Run.
var ErrRunning = errors.New("regionsync: already running")

// ErrNodeIDTaken reports that another process holds this node's
// registration: two processes with one node id would share its keys and
// its acknowledgements, so the second does not register until the first's
// lease ends.
var ErrNodeIDTaken = errors.New("regionsync: node id registered by another process")

// Syncer keeps one region in step with etcd. See the package doc.
type Syncer struct {
	cfg Config
	log hclog.Logger
	// mono is Config.Clock's monotonic reading, on which the lease's age
	// is measured.
	mono clock.Monotonic

	tab atomic.Pointer[table]

	// mu guards the writer's state below and serializes table publishes.
	mu     sync.Mutex
	lost   bool
	shares sharedShares
	// retired are replaced tables that checks still pin. Each holds at
	// least one pin, so there are never more than checks in flight.
	retired []*table
	// allocsRead: the allocations have been read once (history starts).
	// leased: the node has held a lease once. lostSince is when (mono)
	// the current period without a lease began; lostSpans the past ones.
	allocsRead bool
	leased     bool
	lostSince  time.Duration
	lostSpans  []span

	// lease is the current lease, 0 while there is none.
	lease atomic.Int64
	// lastOK is when (mono, nanos) the last successful keepalive or grant
	// of the current lease was sent.
	lastOK atomic.Int64
	// ttl is the TTL (nanos) of the current lease, or of the next one
	// before the first grant.
	ttl atomic.Int64
	// followTTL: Config.LeaseTTL was zero; every lease takes the TTL of
	// etcd's settings.
	followTTL bool

	// allocProgress is when (mono, nanos) the allocation watch last made
	// progress (a read, an event or a progress notification); 0 before
	// the first read. ackDeadline (nanos) is etcd's settings' deadline:
	// a watch silent for longer makes the node fall back (stale).
	allocProgress atomic.Int64
	ackDeadline   atomic.Int64
	// holdAllocWatch, set by a test, makes the allocation watch ignore
	// what it receives, as a stalled watch would.
	holdAllocWatch atomic.Bool
	// registered is the registration written last; only the session
	// goroutine uses it (establish, keepAlive's fingerprint refresh).
	registered etcdlayout.Registration
	// prevLease is the lease this node registered under last (0: none):
	// a registration still held under it is this node's own.
	prevLease atomic.Int64
	// regRev is the etcd revision at which this node's current
	// registration was created: a deletion of its key at a later revision
	// means the registration was taken away (regionNodes).
	regRev atomic.Int64
	// nodes is the region's registered node count for Nodes, 0 before
	// the first read.
	nodes atomic.Int64
	// demands follows the demand reports of the region's nodes
	// (DemandPart).
	demands       *nodeDemands
	losses        atomic.Uint64
	policiesReady atomic.Bool
	// reportEvery is the interval from etcd's settings (nanos), 0 if unset.
	reportEvery atomic.Int64

	ackCh      chan struct{}
	settingsCh chan struct{}
	resyncCh   chan chan struct{}
	reportMu   sync.Mutex
	running    atomic.Bool

	// acks is written by the ack loop only; demand under reportMu.
	acks   ShardWriter[etcdlayout.Ack]
	demand ShardWriter[etcdlayout.DemandReport]

	// afterGet, when set by a test, runs after each initial read of a
	// followed prefix and before its watch starts.
	afterGet func(key string)
}

// New validates cfg and returns a Syncer at the safe shares. It starts
// nothing; call Run.
func New(cfg Config) (*Syncer, error) {
	followTTL := cfg.LeaseTTL == 0
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Syncer{
		cfg:        cfg,
		mono:       clock.MonotonicOf(cfg.Clock),
		followTTL:  followTTL,
		log:        cfg.Logger.Named("regionsync").With("region", cfg.Region, "node", cfg.Node),
		lost:       true,
		ackCh:      make(chan struct{}, 1),
		settingsCh: make(chan struct{}, 1),
		resyncCh:   make(chan chan struct{}),
	}
	s.demands = &nodeDemands{s: s}
	s.ttl.Store(int64(cfg.LeaseTTL))
	s.tab.Store(build(true, s.shares, nil))
	return s, nil
}

// Node returns this node's id within its region.
func (s *Syncer) Node() string { return s.cfg.Node }

// leaseTTL is the TTL of the current lease.
func (s *Syncer) leaseTTL() time.Duration { return time.Duration(s.ttl.Load()) }

// requestTimeout bounds one etcd call: Config.RequestTimeout, at most a
// third of the current lease TTL.
func (s *Syncer) requestTimeout() time.Duration {
	return min(s.cfg.RequestTimeout, s.leaseTTL()/3)
}

// Share returns the share f the region enforces for subject under policy.
// It is lock-free and allocation-free, except in the one call that finds
// the lease expired (see current), which takes the writer's lock to switch
// to the safe shares. A check that reads several shares,
// or that must not outlive the acknowledgement of a newer epoch, uses
// Begin instead.
func (s *Syncer) Share(policy, subject string) float64 {
	return s.shareIn(s.current(), policy, subject)
}

// current is the table a check reads. Before handing out published
// shares it checks the lease's age on the monotonic clock: a process that
// was paused (or whose loss-check ticker ran late) past the lease TTL
// switches to the safe shares here, before it decides, rather than
// deciding at shares the coordinator may have handed to other regions.
func (s *Syncer) current() *table {
	t := s.tab.Load()
	if !t.lost && s.stale() {
		s.expire()
		t = s.tab.Load()
	}
	return t
}

// Pin is one check's view of the shares: every Share through it reads the
// same table, and the epochs newer than that table are acknowledged only
// after End. The zero Pin is not usable; get one from Begin.
type Pin struct {
	s *Syncer
	t *table
}

// Begin pins the current shares for one check. Call End once the check's
// bucket calls returned: until then no epoch published after Begin is
// acknowledged, so the coordinator never grows another region's share
// while this check may still take tokens at a share the region gave up.
// Like Share, it first checks the lease's age (see current).
func (s *Syncer) Begin() Pin {
	for {
		t := s.current()
		t.inflight.Add(1)
		// A table replaced between the load and the count may already
		// have been found drained by the ack loop: pin the new one.
		if s.tab.Load() == t {
			return Pin{s: s, t: t}
		}
		t.inflight.Add(-1)
	}
}

// Share is Syncer.Share on the pinned table.
func (p Pin) Share(policy, subject string) float64 { return p.s.shareIn(p.t, policy, subject) }

// End releases the pin; call it exactly once.
func (p Pin) End() { p.t.inflight.Add(-1) }

func (s *Syncer) shareIn(t *table, policy, subject string) float64 {
	return s.shareOf(t.shares.get(policy), t.lost, policy, subject)
}

// shareOf is the share of subject under policy whose allocation for this
// region is ps (nil: none), with or without a lease.
func (s *Syncer) shareOf(ps *policyShares, lost bool, policy, subject string) float64 {
	if ps == nil {
		return s.minShare(policy)
	}
	if !lost && ps.valid {
		if v, ok := ps.override[subject]; ok {
			return v
		}
		if ps.hasDef {
			return ps.def
		}
	}
	if ps.hasSafe {
		// Falling back never raises a share: a safe share published above
		// the share the region held (an operator raised a minimum) is the
		// leader's to grant with a growth, not the node's to take.
		if ps.valid {
			if v, ok := ps.override[subject]; ok {
				return min(ps.safe, v)
			}
			if ps.hasDef {
				return min(ps.safe, ps.def)
			}
		}
		return ps.safe
	}
	return s.minShare(policy)
}

func (s *Syncer) minShare(policy string) float64 {
	if s.cfg.MinShare == nil {
		return 0
	}
	if m, ok := s.cfg.MinShare(policy); ok && finite(m) && m >= 0 && m <= 1 {
		return m
	}
	return 0
}

// Ready reports whether the region enforces published shares: it holds a
// lease, read every allocation under it, and (with OnPolicies) has read
// the policy documents.
func (s *Syncer) Ready() bool {
	if s.cfg.OnPolicies != nil && !s.policiesReady.Load() {
		return false
	}
	return !s.current().lost
}

// Lost reports whether every share is the safe share because the region
// has no lease, or has not yet read the allocations under its new lease.
func (s *Syncer) Lost() bool { return s.current().lost }

// Losses counts the leases lost since New (a gauge source for operators).
func (s *Syncer) Losses() uint64 { return s.losses.Load() }

// Epoch returns the epoch of policy's allocation as applied, if any.
func (s *Syncer) Epoch(policy string) (uint64, bool) {
	e, ok := s.tab.Load().shares.epochs[etcdlayout.PolicyShard(policy)][policy]
	return e, ok
}

// Policies returns the names of the policies with an allocation.
func (s *Syncer) Policies() []string {
	t := s.tab.Load()
	out := make([]string, 0, t.shares.n)
	t.shares.each(func(p string, _ *policyShares) { out = append(out, p) })
	return out
}

func (s *Syncer) now() time.Time { return s.cfg.Clock.Now() }

// monoNow is the monotonic clock's reading.
func (s *Syncer) monoNow() time.Duration { return s.mono.Mono() }

// publish stores a new table from the state; call with mu held. The
// table it replaces is kept, while checks pin it, so that the ack loop can
// wait for them.
func (s *Syncer) publishLocked() {
	old := s.tab.Swap(build(s.lost, s.shares, s.lostSpans))
	kept := s.retired[:0]
	for _, t := range s.retired {
		if t.inflight.Load() > 0 {
			kept = append(kept, t)
		}
	}
	clear(s.retired[len(kept):])
	s.retired = kept
	if old != nil && old.inflight.Load() > 0 {
		s.retired = append(s.retired, old)
	}
	select {
	case s.ackCh <- struct{}{}:
	default:
	}
}

// Run connects the region and keeps it connected until ctx is done: the
// lease and the loss check, the allocation, policy, settings and region
// registration watches,
// acknowledgements and demand reports, each on a goroutine Run starts and
// waits for. It returns nil once ctx is done, or ErrRunning when called a
// second time. On return every share is the safe share and the lease is
// revoked (best effort, within the request timeout), which deletes this
// node's registration, acknowledgement and demand report at once: the last
// node of a region to stop gracefully frees the region's share without
// making the coordinator wait for the lease TTL, and any other node no
// longer holds back the region's acknowledgements (the coordinator still
// waits the skew margin after seeing it go). Call Flush for a last demand report before cancelling
// ctx; after Run returns there is no lease to write under.
func (s *Syncer) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	l := s.cfg.Layout
	var wg sync.WaitGroup
	goRun := func(f func()) {
		wg.Add(1)
		go func() { defer wg.Done(); f() }()
	}
	goRun(func() { s.session(ctx) })
	goRun(func() {
		s.follow(ctx, l.AllocPrefix(), true, s.resyncCh, s.applyAllocSnapshot, s.applyAllocEvents, s.allocProgressed)
	})
	goRun(func() {
		s.follow(ctx, l.Settings(), false, nil, s.applySettingsSnapshot, s.applySettingsEvents, nil)
	})
	rn := &regionNodes{s: s}
	goRun(func() { s.follow(ctx, l.RegionNodes(s.cfg.Region), true, nil, rn.snapshot, rn.events, nil) })
	goRun(func() {
		if s.demands.readable(ctx) {
			s.follow(ctx, s.demands.prefix(), true, nil, s.demands.snapshot, s.demands.events, nil)
		}
	})
	if s.cfg.OnPolicies != nil {
		p := &policyDocs{s: s, docs: map[string][]byte{}}
		goRun(func() { s.follow(ctx, l.PoliciesPrefix(), true, nil, p.snapshot, p.events, nil) })
	}
	goRun(func() { s.ackLoop(ctx) })
	if s.cfg.Recorder != nil {
		goRun(func() { s.reportLoop(ctx) })
	}
	wg.Wait()
	s.release()
	return nil
}

// release switches to the safe shares, then revokes the lease, in that
// order: once the registration is gone the coordinator may hand the shares
// above Safe to other regions.
func (s *Syncer) release() {
	s.mu.Lock()
	id := clientv3.LeaseID(s.lease.Swap(0))
	if !s.lost {
		s.lost = true
		s.publishLocked()
	}
	s.mu.Unlock()
	if id == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.requestTimeout())
	defer cancel()
	if _, err := s.cfg.Client.Revoke(ctx, id); err != nil && !leaseGone(err) {
		s.log.Warn("lease not revoked on shutdown; it expires by its TTL", "lease", fmt.Sprintf("%x", id), "error", err)
		return
	}
	s.log.Info("lease revoked on shutdown", "lease", fmt.Sprintf("%x", id))
}

// ---- lease ----

type kaResult struct {
	sent time.Duration // monotonic
	err  error
}

// session grants leases and keeps them alive until ctx is done.
func (s *Syncer) session(ctx context.Context) {
	bo := newBackoff(s.leaseTTL() / 4)
	for ctx.Err() == nil {
		id, err := s.establish(ctx)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("cannot get a lease; shares stay safe", "error", err)
			}
			bo.wait(ctx)
			continue
		}
		bo.reset()
		s.keepAlive(ctx, id)
	}
}

// establish grants a lease and registers under it.
func (s *Syncer) establish(ctx context.Context) (clientv3.LeaseID, error) {
	ttl := s.cfg.LeaseTTL
	if s.followTTL {
		t, err := s.publishedTTL(ctx)
		if err != nil {
			return 0, err
		}
		if t > 0 {
			ttl = t
		}
	}
	s.ttl.Store(int64(ttl))
	sent, sentMono := s.now(), s.monoNow()
	cctx, cancel := context.WithTimeout(ctx, s.requestTimeout())
	defer cancel()
	lr, err := s.cfg.Client.Grant(cctx, int64(ttl/time.Second))
	if err != nil {
		return 0, fmt.Errorf("grant lease: %w", err)
	}
	fp := s.fingerprint()
	reg, err := json.Marshal(etcdlayout.Registration{
		Region: s.cfg.Region, Node: s.cfg.Node, Addr: s.cfg.Addr,
		LeaseTTLSeconds: int64(ttl / time.Second), StartedAt: sent, Fingerprint: fp,
	})
	if err != nil {
		return 0, fmt.Errorf("encode registration: %w", err)
	}
	// Create-only: a key already there is another live process with this
	// node id (or this node's previous incarnation, whose lease has not
	// ended yet); this one waits for that lease to end.
	key := s.cfg.Layout.Node(s.cfg.Region, s.cfg.Node)
	var resp *clientv3.TxnResponse
	for attempt := 0; ; attempt++ {
		resp, err = s.cfg.Client.Txn(cctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			// Acknowledgements outlive their lease (Owner.Registration):
			// those of an earlier incarnation go with the new registration.
			Then(clientv3.OpDelete(s.cfg.Layout.NodeAcks(s.cfg.Region, s.cfg.Node), clientv3.WithPrefix()),
				clientv3.OpPut(key, string(reg), clientv3.WithLease(lr.ID))).
			Else(clientv3.OpGet(key)).
			Commit()
		if err != nil || resp.Succeeded {
			break
		}
		holder := int64(0)
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
			holder = kvs[0].Lease
		}
		if prev := s.prevLease.Load(); attempt == 0 && holder != 0 && holder == prev {
			// This node's own registration under the lease it gave up
			// (a loss it found before etcd did): end that lease, retry.
			if _, rerr := s.cfg.Client.Revoke(cctx, clientv3.LeaseID(prev)); rerr == nil || leaseGone(rerr) {
				continue
			}
		}
		err = fmt.Errorf("%w: %s/%s is held under lease %x; each process needs its own -node-id", ErrNodeIDTaken, s.cfg.Region, s.cfg.Node, holder)
		break
	}
	if err != nil {
		s.revokeQuietly(lr.ID)
		return 0, fmt.Errorf("register under lease %x: %w", lr.ID, err)
	}
	s.regRev.Store(resp.Header.Revision)
	s.prevLease.Store(int64(lr.ID))
	s.registered = etcdlayout.Registration{Region: s.cfg.Region, Node: s.cfg.Node, Addr: s.cfg.Addr,
		LeaseTTLSeconds: int64(ttl / time.Second), StartedAt: sent, Fingerprint: fp}
	s.lastOK.Store(int64(sentMono))
	s.lease.Store(int64(lr.ID))
	s.log.Info("registered", "lease", fmt.Sprintf("%x", lr.ID), "ttl", ttl)
	return lr.ID, nil
}

// fingerprint is Config.Fingerprint's answer, "" without one.
func (s *Syncer) fingerprint() string {
	if s.cfg.Fingerprint == nil {
		return ""
	}
	return s.cfg.Fingerprint()
}

// refreshFingerprint rewrites this node's registration under lease id
// when its fingerprint changed (policies reloaded), so that the leader
// sees what the node decides with; the write requires the registration
// to be the one this node created.
func (s *Syncer) refreshFingerprint(ctx context.Context, id clientv3.LeaseID) {
	fp := s.fingerprint()
	if fp == s.registered.Fingerprint {
		return
	}
	reg := s.registered
	reg.Fingerprint = fp
	data, err := json.Marshal(reg)
	if err != nil {
		return
	}
	key := s.cfg.Layout.Node(s.cfg.Region, s.cfg.Node)
	cctx, cancel := context.WithTimeout(ctx, s.requestTimeout())
	defer cancel()
	resp, err := s.cfg.Client.Txn(cctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", s.regRev.Load())).
		Then(clientv3.OpPut(key, string(data), clientv3.WithLease(id))).
		Commit()
	if err != nil || !resp.Succeeded {
		return // retried at the next tick; a lost registration is handled by regionNodes
	}
	s.registered = reg
	s.log.Info("registration updated with a new fingerprint", "fingerprint", fp)
}

// revokeQuietly revokes lease id, which holds nothing of this node's, in
// the background; a failure leaves it to expire by its TTL.
func (s *Syncer) revokeQuietly(id clientv3.LeaseID) {
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.requestTimeout())
		defer cancel()
		_, _ = s.cfg.Client.Revoke(ctx, id)
	}()
}

// registrationGone handles the deletion of this node's registration at
// etcd revision rev: when it is the current registration (created before
// rev) and the lease is still held, someone took it away (an operator, a
// process with the same node id after this one's lease ended), and the
// coordinator may already count this node's region without it. That is a
// lost lease: safe shares at once, the lease dropped, and a new
// registration under a new one.
func (s *Syncer) registrationGone(rev int64) {
	id := clientv3.LeaseID(s.lease.Load())
	if id == 0 || rev <= s.regRev.Load() {
		return
	}
	s.markLost(id, "this node's registration was deleted")
	s.revokeQuietly(id)
}

// publishedTTL reads the lease TTL of etcd's settings: 0 when none is
// published or it is outside [1s, 1h].
func (s *Syncer) publishedTTL(ctx context.Context) (time.Duration, error) {
	cctx, cancel := context.WithTimeout(ctx, s.requestTimeout())
	defer cancel()
	r, err := s.cfg.Client.Get(cctx, s.cfg.Layout.Settings())
	if err != nil {
		return 0, fmt.Errorf("read settings for the lease TTL: %w", err)
	}
	if len(r.Kvs) == 0 {
		return 0, nil
	}
	var st etcdlayout.Settings
	if err := json.Unmarshal(r.Kvs[0].Value, &st); err != nil {
		s.log.Warn("unreadable settings; using the default lease TTL", "error", err)
		return 0, nil
	}
	if st.LeaseTTLSeconds < 1 || st.LeaseTTLSeconds > int64(time.Hour/time.Second) {
		return 0, nil
	}
	return time.Duration(st.LeaseTTLSeconds) * time.Second, nil
}

// keepAlive keeps lease id alive until it is lost or ctx is done. It asks
// the allocation follower for a fresh read and leaves the safe shares only
// when that read completes while id is still alive.
func (s *Syncer) keepAlive(ctx context.Context, id clientv3.LeaseID) {
	ttl := s.leaseTTL()
	every := ttl / 3
	check := lossCheck(ttl)
	tick := time.NewTicker(check)
	defer tick.Stop()

	results := make(chan kaResult, 1)
	inflight := false
	defer func() {
		if inflight {
			<-results
		}
	}()
	lastTry := time.Now()
	resyncReq := s.resyncCh
	resyncDone := make(chan struct{})

	for {
		select {
		case <-ctx.Done():
			return
		case resyncReq <- resyncDone:
			resyncReq = nil
		case <-resyncDone:
			resyncDone = nil
			if s.recover(id) {
				s.log.Info("published shares in force")
			}
		case r := <-results:
			inflight = false
			if r.err == nil {
				s.lastOK.Store(int64(r.sent))
				continue
			}
			if leaseGone(r.err) {
				s.markLost(id, "lease expired in etcd")
				return
			}
			if ctx.Err() == nil {
				s.log.Warn("lease keepalive failed", "error", r.err)
			}
		case <-tick.C:
			if s.lease.Load() != int64(id) {
				return // a check found it expired (expire)
			}
			if s.stale() {
				why := "no keepalive for longer than the lease TTL"
				if s.allocWatchStalled(s.monoNow()) {
					why = "the allocation watch made no progress within the acknowledgement deadline"
				}
				s.markLost(id, why)
				return
			}
			s.refreshFingerprint(ctx, id)
			if !inflight && time.Since(lastTry) >= every {
				inflight, lastTry = true, time.Now()
				sent := s.monoNow()
				go func() {
					cctx, cancel := context.WithTimeout(ctx, every)
					defer cancel()
					_, err := s.cfg.Client.KeepAliveOnce(cctx, id)
					results <- kaResult{sent: sent, err: err}
				}()
			}
		}
	}
}

// lossCheck is how often keepAlive checks the lease age.
func lossCheck(ttl time.Duration) time.Duration { return min(ttl/20, 100*time.Millisecond) }

// stale says the lease may have expired in etcd. It holds one loss check
// before the TTL is over, so that the periodic check switches to the safe
// shares no later than the TTL after the last good keepalive was sent
// (etcd expires the lease no earlier than that). The age is measured on
// the monotonic clock: a wall clock stepped back does not make an old
// lease look young.
func (s *Syncer) stale() bool {
	ttl := s.leaseTTL()
	now := s.monoNow()
	if now-time.Duration(s.lastOK.Load()) > ttl-lossCheck(ttl) {
		return true
	}
	return s.allocWatchStalled(now)
}

// allocWatchStalled says the allocation watch has made no progress for
// longer than the acknowledgement deadline (less one loss check): the
// leader may then count this node at its safe share, so the node must be
// there. A lease whose keepalives work does not keep a stalled watch's
// shares.
func (s *Syncer) allocWatchStalled(now time.Duration) bool {
	d, last := time.Duration(s.ackDeadline.Load()), s.allocProgress.Load()
	return d > 0 && last != 0 && now-time.Duration(last) > d-lossCheck(d)
}

// allocProgressed records that the allocation watch made progress.
func (s *Syncer) allocProgressed() { s.allocProgress.Store(int64(s.monoNow())) }

// expire switches every share to the safe share because a check found
// the lease stale before the loss check did, and drops the lease: the
// keepalive loop then starts a new one, and the region enforces published
// shares again only after reading them under it.
func (s *Syncer) expire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lost || !s.stale() {
		return
	}
	id := s.lease.Swap(0)
	s.losses.Add(1)
	s.log.Warn("lease older than its TTL, or the allocation watch silent past the acknowledgement deadline, when a check ran; enforcing safe shares", "lease", fmt.Sprintf("%x", id))
	s.lost, s.lostSince = true, s.monoNow()
	s.publishLocked()
}

func leaseGone(err error) bool {
	return errors.Is(err, rpctypes.ErrLeaseNotFound) || errors.Is(rpctypes.Error(err), rpctypes.ErrLeaseNotFound)
}

// markLost drops lease id (if still current) and switches every share to
// the safe share.
func (s *Syncer) markLost(id clientv3.LeaseID, why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.lease.CompareAndSwap(int64(id), 0) {
		return
	}
	s.losses.Add(1)
	s.log.Warn("lease lost; enforcing safe shares", "lease", fmt.Sprintf("%x", id), "reason", why)
	if !s.lost {
		s.lost, s.lostSince = true, s.monoNow()
		s.publishLocked()
	}
}

// recover leaves the safe shares after a fresh read under lease id.
func (s *Syncer) recover(id clientv3.LeaseID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lease.Load() != int64(id) || s.stale() || !s.lost {
		return false
	}
	s.lost = false
	s.noteLostLocked(s.monoNow())
	s.publishLocked()
	return true
}

// ---- allocations ----

func (s *Syncer) applyAllocSnapshot(kvs []*mvccpb.KeyValue) {
	prefix := s.cfg.Layout.AllocPrefix()
	s.mu.Lock()
	defer s.mu.Unlock()
	var next sharedShares
	var copied [etcdlayout.Shards]bool
	for _, kv := range kvs {
		name := etcdlayout.Name(prefix, string(kv.Key))
		if name == "" {
			continue
		}
		if next.n >= s.cfg.MaxPolicies {
			s.log.Error("too many allocations; ignoring the rest", "max", s.cfg.MaxPolicies)
			break
		}
		next.set(name, s.compileLogged(name, kv.Value, s.shares.get(name)), &copied)
	}
	s.shares = next
	s.allocsRead = true
	s.publishLocked()
}

// applyAllocEvents applies a watch's allocation events, copying only the
// shards they touch (sharedShares).
func (s *Syncer) applyAllocEvents(evs []*clientv3.Event) {
	prefix := s.cfg.Layout.AllocPrefix()
	s.mu.Lock()
	defer s.mu.Unlock()
	var copied [etcdlayout.Shards]bool
	for _, ev := range evs {
		name := etcdlayout.Name(prefix, string(ev.Kv.Key))
		if name == "" {
			continue
		}
		prev := s.shares.get(name)
		if ev.Type == clientv3.EventTypeDelete {
			s.shares.set(name, nil, &copied)
			continue
		}
		if prev == nil && s.shares.n >= s.cfg.MaxPolicies {
			s.log.Error("too many allocations; ignoring one", "policy", name, "max", s.cfg.MaxPolicies)
			continue
		}
		s.shares.set(name, s.compileLogged(name, ev.Kv.Value, prev), &copied)
	}
	s.publishLocked()
}

func (s *Syncer) compileLogged(name string, raw []byte, prev *policyShares) *policyShares {
	ps, err := compile(s.cfg.Region, name, raw, s.cfg.MaxOverrides)
	if err != nil {
		s.log.Error("enforcing the safe share for a bad allocation", "policy", name, "error", err)
		ps = invalid(prev)
	}
	s.carryHistory(name, ps, prev, s.monoNow())
	return ps
}

// ---- settings ----

func (s *Syncer) applySettingsSnapshot(kvs []*mvccpb.KeyValue) {
	if len(kvs) == 0 {
		s.setReportEvery(0)
		return
	}
	s.applySettings(kvs[0].Value)
}

func (s *Syncer) applySettingsEvents(evs []*clientv3.Event) {
	for _, ev := range evs {
		if ev.Type == clientv3.EventTypeDelete {
			s.setReportEvery(0)
		} else {
			s.applySettings(ev.Kv.Value)
		}
	}
}

func (s *Syncer) applySettings(raw []byte) {
	var st etcdlayout.Settings
	if err := json.Unmarshal(raw, &st); err != nil {
		s.log.Error("ignoring unreadable settings", "error", err)
		s.setReportEvery(0)
		return
	}
	var deadline time.Duration
	if f := st.AckDeadlineSeconds; finite(f) && f > 0 {
		deadline = time.Duration(min(f, time.Hour.Seconds()) * float64(time.Second))
	}
	s.ackDeadline.Store(int64(deadline))
	var iv time.Duration
	if f := st.ReportIntervalSeconds; finite(f) && f > 0 {
		iv = time.Duration(min(f, MaxReportInterval.Seconds()) * float64(time.Second))
		iv = max(iv, MinReportInterval)
	}
	s.setReportEvery(iv)
}

func (s *Syncer) setReportEvery(d time.Duration) {
	if s.reportEvery.Swap(int64(d)) != int64(d) {
		select {
		case s.settingsCh <- struct{}{}:
		default:
		}
	}
}

func (s *Syncer) reportInterval() time.Duration {
	if d := time.Duration(s.reportEvery.Load()); d > 0 {
		return d
	}
	return s.cfg.ReportInterval
}

// ---- policies ----

type policyDocs struct {
	s    *Syncer
	docs map[string][]byte
}

func (p *policyDocs) snapshot(kvs []*mvccpb.KeyValue) {
	prefix := p.s.cfg.Layout.PoliciesPrefix()
	p.docs = make(map[string][]byte, len(kvs))
	for _, kv := range kvs {
		if name := etcdlayout.Name(prefix, string(kv.Key)); name != "" {
			if len(p.docs) >= p.s.cfg.MaxPolicies {
				p.s.log.Error("too many policy documents; ignoring the rest", "max", p.s.cfg.MaxPolicies)
				break
			}
			p.docs[name] = kv.Value
		}
	}
	p.deliver()
}

func (p *policyDocs) events(evs []*clientv3.Event) {
	prefix := p.s.cfg.Layout.PoliciesPrefix()
	for _, ev := range evs {
		name := etcdlayout.Name(prefix, string(ev.Kv.Key))
		if name == "" {
			continue
		}
		if ev.Type == clientv3.EventTypeDelete {
			delete(p.docs, name)
			continue
		}
		if _, ok := p.docs[name]; !ok && len(p.docs) >= p.s.cfg.MaxPolicies {
			p.s.log.Error("too many policy documents; ignoring one", "doc", name, "max", p.s.cfg.MaxPolicies)
			continue
		}
		p.docs[name] = ev.Kv.Value
	}
	p.deliver()
}

func (p *policyDocs) deliver() {
	out := make(map[string][]byte, len(p.docs))
	for k, v := range p.docs {
		out[k] = v
	}
	p.s.cfg.OnPolicies(out)
	p.s.policiesReady.Store(true)
}
