package e2e

import (
	"context"
	"encoding/json"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/etcdtest"
	"github.com/quotacoord/quota/internal/faultproxy"
	"github.com/quotacoord/quota/internal/redistest"
	"github.com/quotacoord/quota/plan"
)

// ackDelay is the latency each way on region c's links to etcd while
// demand moves: c acknowledges a shrink only after a few hundred
// milliseconds, so the two-step publish is in progress when the test
// kills the etcd leader right after the shrink.
const ackDelay = 250 * time.Millisecond

// clusterLeaseTTL is the regions' lease TTL and the coordinator's session
// TTL against the cluster: long enough to outlast an etcd leader election
// (one election timeout, 1 s, and the clients' reconnection), so that the
// kill costs no lease. regionTTL (2 s) does not: a node whose keepalives go
// unanswered for its TTL gives its lease up.
const clusterLeaseTTL = 5 * time.Second

// newClusterEnv starts a three-member etcd cluster, one coordinator and a
// regional node per name, every one of them configured with all three
// members' endpoints: slow names regions that reach each member through
// a proxy of their own (whose latency the test sets). It applies the
// policy and waits until every node is ready.
func newClusterEnv(t *testing.T, cl *etcdtest.Cluster, slow map[string][]*faultproxy.Proxy, names ...string) *env {
	t.Helper()
	e := &env{t: t, cli: cl.Client(t), logs: newLineLog(t), token: "e2e-write-token-0123456789"}
	e.tokenFile = filepath.Join(t.TempDir(), "operator-tokens")
	if err := os.WriteFile(e.tokenFile, []byte("write:"+e.token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e.coords = append(e.coords, e.launchCoord("coord-0", cl.Endpoints, e.tokenFile, clusterLeaseTTL, clusterLeaseTTL))
	e.leader(10 * time.Second)
	e.waitFor(10*time.Second, "settings with the region lease TTL", func() bool {
		var st etcdlayout.Settings
		return e.get(layout.Settings(), &st) && st.LeaseTTLSeconds == int64(clusterLeaseTTL/time.Second)
	})
	e.docs = [][]byte{policyDoc}
	e.applyPolicy("e2e-0.yaml", policyDoc)
	for _, n := range names {
		endpoints := cl.Endpoints
		if ps, ok := slow[n]; ok {
			endpoints = nil
			for _, p := range ps {
				endpoints = append(endpoints, "http://"+p.Addr())
			}
		}
		e.regions = append(e.regions, e.startRegionOn(n, endpoints))
	}
	for _, r := range e.regions {
		r.waitReady(15 * time.Second)
	}
	return e
}

// startRegionOn starts region name's node on endpoints, on a redis-server
// of its own, with the settings of startRegion and a load driver.
func (e *env) startRegionOn(name string, endpoints []string) *region {
	e.t.Helper()
	r := &region{e: e, name: name, label: name, clk: &stepClock{}, redis: redistest.Start(e.t), endpoints: endpoints}
	e.track(r)
	return r
}

// memberProxies starts one proxy per member of cl, closed at cleanup.
func memberProxies(t *testing.T, cl *etcdtest.Cluster) []*faultproxy.Proxy {
	t.Helper()
	var ps []*faultproxy.Proxy
	for _, ep := range cl.Endpoints {
		u, err := url.Parse(ep)
		if err != nil {
			t.Fatal(err)
		}
		p, err := faultproxy.Start(faultproxy.Config{Target: u.Host})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		ps = append(ps, p)
	}
	return ps
}

// allocSeen is an allocation the test's watch saw, and when.
type allocSeen struct {
	epoch uint64
	phase plan.Phase
	at    time.Time
}

// watchAlloc sends every allocation of the policy written after rev to the
// returned channel (buffered; the watch resumes on another member when
// its member dies) until ctx ends.
func (e *env) watchAlloc(ctx context.Context, rev int64) <-chan allocSeen {
	ch := make(chan allocSeen, 256)
	wch := e.cli.Watch(ctx, layout.Alloc(policyName), clientv3.WithRev(rev+1))
	go func() {
		for wr := range wch {
			for _, ev := range wr.Events {
				var a etcdlayout.Allocation
				if ev.Type != clientv3.EventTypePut || json.Unmarshal(ev.Kv.Value, &a) != nil {
					continue
				}
				select {
				case ch <- allocSeen{epoch: a.Epoch, phase: a.Phase, at: time.Now()}:
				default: // the test reads only the first few
				}
			}
		}
	}()
	return ch
}

// ackedBy reports whether every node of every region has acknowledged
// epoch of the policy.
func (e *env) ackedBy(epoch uint64) bool {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := e.cli.Get(ctx, layout.AcksPrefix(), clientv3.WithPrefix())
	if err != nil {
		e.t.Fatalf("acks: %v", err)
	}
	acked := map[string]bool{}
	for _, kv := range r.Kvs {
		var a etcdlayout.Ack
		if err := json.Unmarshal(kv.Value, &a); err != nil {
			e.t.Fatalf("ack %s: %v", kv.Key, err)
		}
		// A node writes its acknowledgement in shards by policy
		// (etcdlayout.PolicyShard): another policy's shard says nothing.
		got, ok := a.Epochs[policyName]
		if !ok {
			continue
		}
		if got < epoch {
			return false
		}
		acked[a.Region] = true
	}
	for _, reg := range e.regions {
		if !acked[reg.name] {
			return false
		}
	}
	return true
}

// leases returns the lease of every node registration, by key.
func (e *env) leases() map[string]int64 {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := e.cli.Get(ctx, layout.RegionsPrefix(), clientv3.WithPrefix())
	if err != nil {
		e.t.Fatalf("registrations: %v", err)
	}
	out := map[string]int64{}
	for _, kv := range r.Kvs {
		out[string(kv.Key)] = kv.Lease
	}
	return out
}

// TestEtcdLeaderKilledMidRebalance runs the coordinator and regions a, b
// and c against a three-member etcd cluster, every component configured
// with all three endpoints. Demand moves from a to b; as soon as the
// coordinator publishes the shrink of the first two-step, the etcd leader
// member is killed (c's acknowledgement of the shrink is still on its
// way). Afterwards:
//
//   - no decision was lost: every check of every region was answered, none
//     degraded (the nodes decide from Redis and the shares they hold while
//     etcd elects a leader);
//   - the invariant held: the replayed etcd history never has Σ shares
//     above 1 + ε, and the admitted decisions stay within the bound;
//   - rebalancing resumed: the growth that completes the two-step, and a
//     later epoch, are published after the kill and acknowledged by every
//     region; every node is still registered under the lease it held
//     before the kill (the new etcd leader keeps the leases).
func TestEtcdLeaderKilledMidRebalance(t *testing.T) {
	cl := etcdtest.StartCluster(t)
	slowC := memberProxies(t, cl)
	e := newClusterEnv(t, cl, map[string][]*faultproxy.Proxy{"c": slowC}, "a", "b", "c")
	a, b, c := e.regions[0], e.regions[1], e.regions[2]
	const background = 1.0 // checks per second in the regions without demand
	b.load.setRate(background)
	c.load.setRate(background)
	a.load.setRate(offeredRate)
	e.waitFor(15*rebalanceIv, "share above 0.7 in a", func() bool { return a.load.share() > 0.7 })

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g, err := e.cli.Get(ctx, layout.Alloc(policyName))
	if err != nil {
		t.Fatal(err)
	}
	seen := e.watchAlloc(ctx, g.Header.Revision)
	held := e.leases()
	lead, err := cl.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range slowC {
		if err := p.SetLatency(ackDelay); err != nil {
			t.Fatal(err)
		}
	}
	a.load.setRate(background)
	b.load.setRate(offeredRate)
	var shrink allocSeen
	for shrink.phase != plan.PhaseShrink {
		select {
		case shrink = <-seen:
		case <-time.After(10 * rebalanceIv):
			t.Fatal("no shrink published after demand moved to b")
		}
	}
	if !cl.Leads(lead) { // leadership moved since: find the new leader
		if lead, err = cl.Leader(ctx); err != nil {
			t.Fatal(err)
		}
	}
	killed := time.Now()
	cl.Kill(lead)
	t.Logf("shrink epoch %d published; etcd leader member-%d killed %v later", shrink.epoch, lead, killed.Sub(shrink.at).Round(time.Microsecond))
	next, err := cl.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("member-%d leads %v after the kill", next, time.Since(killed).Round(time.Millisecond))

	var growth, later allocSeen
	for later.epoch == 0 {
		select {
		case s := <-seen:
			switch {
			case s.epoch == shrink.epoch+1:
				growth = s
			case s.epoch > shrink.epoch+1:
				later = s
			}
		case <-ctx.Done():
			t.Fatalf("after the kill: growth %+v, no later epoch", growth)
		}
	}
	if growth.phase != plan.PhaseStable || growth.at.Before(killed) {
		t.Fatalf("epoch %d after the shrink: %s seen %v after the kill; want the stable growth, published after the kill",
			growth.epoch, growth.phase, growth.at.Sub(killed))
	}
	for _, p := range slowC {
		if err := p.SetLatency(0); err != nil {
			t.Fatal(err)
		}
	}
	e.waitFor(10*time.Second, "every region's acknowledgement of the later epoch", func() bool { return e.ackedBy(later.epoch) })
	t.Logf("rebalancing resumed: growth epoch %d %v after the kill, epoch %d %v after, acknowledged by every region",
		growth.epoch, growth.at.Sub(killed).Round(time.Millisecond), later.epoch, later.at.Sub(killed).Round(time.Millisecond))
	if now := e.leases(); len(now) != len(e.regions) || !maps.Equal(now, held) {
		t.Errorf("registrations before the kill %v, after %v: want every node still under its lease", held, now)
	}
	e.waitFor(15*rebalanceIv, "share above 0.7 in b", func() bool { return b.load.share() > 0.7 })

	for _, r := range e.regions {
		r.load.close()
		s := r.load.snapshot()
		t.Logf("region %s: %d admitted, %d denied, %d degraded, %d failed checks", r.name, s.allowed, s.denied, s.degraded, s.failed)
		if s.failed != 0 || s.degraded != 0 {
			t.Errorf("region %s: %d checks unanswered and %d degraded, want none", r.name, s.failed, s.degraded)
		}
		if s.allowed+s.denied == 0 {
			t.Errorf("region %s answered no check", r.name)
		}
	}
	rep := e.replay()
	if rep.Epochs < 3 || rep.Acks < 3 {
		t.Errorf("replay saw %d epochs and %d acks, want the two-step and after", rep.Epochs, rep.Acks)
	}
	e.checkBound()
}
