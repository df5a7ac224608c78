package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quotacoord/quota/internal/boundcheck"
	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/faultproxy"
	"github.com/quotacoord/quota/internal/reliability"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

// The randomized runs' knobs, read from the environment.
const (
	// seedEnv replays one run from the seed it printed.
	seedEnv = "E2E_SEED"
	// runsEnv and stepsEnv size the runs: how many, and how many steps
	// of stepDur each (at least one per event kind).
	runsEnv  = "E2E_RUNS"
	stepsEnv = "E2E_STEPS"
	// The short form CI runs.
	defaultRuns, defaultSteps = 3, 8
	stepDur                   = time.Second
	// moverSubject spends in one region and moves to another every step,
	// well within one refill time (6 s) and one window (5 s).
	moverSubject = "tenant-mover"
	moverRate    = 15.0
)

// TestRandomRuns is the adversarial check of issue 12 on live runs: each
// run is seeded (it logs its seed; E2E_SEED replays it) and mixes, over
// E2E_STEPS steps of 1 s, random demand for the hot subject at every
// node and a second subject that moves to another region every step,
// both asking a policy of each algorithm (token bucket, fixed window,
// sliding window counter, sliding log) so shares move in the middle of
// windows; and, each at least once at a random step, one of every event
// kind (see event). Region b runs two nodes, one of them a child process.
// Every admitted decision of every node is then checked against the bound
// (boundcheck) and etcd's history replayed (invariant). CI runs 3 short
// runs of 8 steps; make reliability runs the long form and adds a row per
// run to its table.
func TestRandomRuns(t *testing.T) {
	runs, steps := envInt(t, runsEnv, defaultRuns), envInt(t, stepsEnv, defaultSteps)
	if steps < len(eventKinds) {
		t.Fatalf("%s=%d: want at least %d steps, one per event kind", stepsEnv, steps, len(eventKinds))
	}
	var seeds []uint64
	if s := os.Getenv(seedEnv); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", seedEnv, s, err)
		}
		seeds = []uint64{v}
	} else {
		base := uint64(time.Now().UnixNano())
		for i := range runs {
			seeds = append(seeds, base+uint64(i))
		}
	}
	rec := reliability.NewRecorder(os.Getenv("RELIABILITY_REPORT"))
	var decisions, violations int
	var windows int64
	start := time.Now()
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			began := time.Now()
			var rep boundcheck.Report
			var kinds []string
			defer func() {
				decisions += rep.Decisions
				windows += rep.Windows
				violations += len(rep.Violations)
				err := rec.Record(reliability.Entry{Kind: reliability.KindBound, Name: fmt.Sprintf("e2e random run %s=%d", seedEnv, seed),
					Injected: rep.Decisions > 0, Survived: !t.Failed() && len(rep.Violations) == 0,
					BoundDecisions: int64(rep.Decisions), BoundWindows: rep.Windows, Violations: int64(len(rep.Violations)),
					Note: fmt.Sprintf("%d steps in %v, fullest window at %.0f%% of its bound: %s",
						steps, time.Since(began).Round(time.Second), 100*rep.Peak, strings.Join(kinds, ", "))})
				if err != nil {
					t.Error(err)
				}
			}()
			rep, kinds = randomRun(t, seed, steps)
		})
	}
	t.Logf("%d runs of %d steps in %v: %d admitted decisions, %d windows checked, %d violations",
		len(seeds), steps, time.Since(start).Round(time.Millisecond), decisions, windows, violations)
}

// envInt returns the positive integer in the environment variable name,
// or def when it is unset.
func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < 1 {
		t.Fatalf("%s=%q: want a positive integer", name, s)
	}
	return v
}

// event is one kind of fault or operator action a run injects.
type event int

const (
	// restart stops a random node, gracefully (its lease revoked) or as a
	// crash (SIGKILL for the child node), and starts it again.
	restart event = iota
	// flush empties a region's Redis (the nodes run with the loss guard).
	flush
	// failover kills the leading coordinator while a shrink is pending
	// (killLeaderMidShrink).
	failover
	// partition cuts a region's nodes off etcd for longer than the lease
	// plus the skew margin and changes minimums, weights and pins
	// meanwhile.
	partition
	// pause stops the child node's process (SIGSTOP) for longer than its
	// lease, then lets it run on.
	pause
	// clockStep steps an in-process node's wall clock back.
	clockStep
	// operate changes minimums, weights and pins.
	operate
	// quiet stops all demand for one refill time of the token bucket:
	// every bucket refills, and the next step's demand finds the whole
	// burst C spread over the regions, so any token a fault adds on top
	// shows as a window over C + r·W.
	quiet
)

var eventKinds = []event{restart, flush, failover, partition, pause, clockStep, operate, quiet}

func (ev event) String() string {
	return [...]string{"restart", "flush", "failover", "partition", "pause", "clock step", "operate", "quiet"}[ev]
}

// refillTime is the exports policy's C/r.
const refillTime = 6 * time.Second

// run is one randomized run's deployment and state.
type run struct {
	t     *testing.T
	e     *env
	rng   *rand.Rand
	nodes []*region // every node: a, b, b2 (the child), c
	child *region
	mover *driver
	// pins are the pins in place, by policy and region.
	pins map[[2]string]bool
}

// randomRun runs one seeded run of steps steps, returning the bound
// check's report and the events injected, in order.
func randomRun(t *testing.T, seed uint64, steps int) (boundcheck.Report, []string) {
	t.Logf("seed %d (%s=%d replays it)", seed, seedEnv, seed)
	rng := rand.New(rand.NewPCG(seed, 13))
	e := newEnvDocs(t, 2, [][]byte{policyDoc, windowsDoc}, "a", "b", "c")
	r := &run{t: t, e: e, rng: rng, pins: map[[2]string]bool{}}
	r.child = e.addNode(e.regions[1], true)
	r.nodes = []*region{e.regions[0], e.regions[1], r.child, e.regions[2]}
	r.mover = e.startDriver(e.regions[0], moverSubject)
	for _, d := range e.drivers {
		d.setPolicies(allPolicies...)
	}
	r.mover.setRate(moverRate)

	// Every kind once at a random step, and more at random on the rest.
	plan := make([]event, steps)
	for i := range plan {
		plan[i] = -1
	}
	for i, s := range rng.Perm(steps)[:len(eventKinds)] {
		plan[s] = eventKinds[i]
	}
	for i := range plan {
		if plan[i] < 0 && rng.Float64() < 0.3 {
			plan[i] = eventKinds[rng.IntN(len(eventKinds))]
		}
	}
	rates := []float64{0, 5, 15, 25}
	var done []string
	for step, ev := range plan {
		for _, n := range r.nodes {
			n.load.setRate(rates[rng.IntN(len(rates))])
		}
		r.mover.setRate(moverRate)
		if rng.Float64() < 0.8 {
			r.moveMover(step)
		}
		if ev < 0 {
			time.Sleep(stepDur)
			continue
		}
		// At a random instant of the step: after the new demand drained
		// some buckets, or before.
		lead := time.Duration(rng.Int64N(int64(stepDur)))
		time.Sleep(lead)
		t.Logf("step %d: %s", step, ev)
		r.inject(step, ev)
		done = append(done, ev.String())
		time.Sleep(stepDur - lead)
	}
	for _, d := range e.drivers {
		d.setRate(0)
	}
	for _, n := range r.nodes {
		s := n.load.snapshot()
		t.Logf("node %s: %d starts; exports: %d admitted, %d denied, %d degraded, %d failed checks",
			n.label, n.starts, s.allowed, s.denied, s.degraded, s.failed)
	}
	rep := e.checkBound()
	e.replay()
	return rep, done
}

// moveMover sends the moving subject's checks to a node of another
// region.
func (r *run) moveMover(step int) {
	from := r.mover.target.Load()
	var to []*region
	for _, n := range r.nodes {
		if n.name != from.name {
			to = append(to, n)
		}
	}
	n := to[r.rng.IntN(len(to))]
	r.mover.target.Store(n)
	r.t.Logf("step %d: %s moves from %s to %s", step, moverSubject, from.label, n.label)
}

// inject makes ev happen.
func (r *run) inject(step int, ev event) {
	t, e := r.t, r.e
	switch ev {
	case restart:
		n := r.nodes[r.rng.IntN(len(r.nodes))]
		if r.rng.IntN(2) == 0 {
			n.stop()
			t.Logf("step %d: node %s stopped gracefully", step, n.label)
		} else {
			n.crash()
			t.Logf("step %d: node %s crashed", step, n.label)
		}
		n.start()
	case flush:
		reg := e.regions[r.rng.IntN(len(e.regions))]
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := reg.redis.Client(t).FlushAll(ctx).Err()
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("step %d: region %s's Redis flushed", step, reg.name)
	case failover:
		// A pinned exports share cannot shrink: the pins go first.
		for k := range r.pins {
			if k[0] == policyName {
				r.unpin(step, k[0], k[1])
			}
		}
		killLeaderMidShrink(t, e, r.rng)
	case partition:
		reg := e.regions[r.rng.IntN(len(e.regions))]
		cut := r.regionNodes(reg.name)
		for _, n := range cut {
			if err := n.proxy.SetMode(faultproxy.Blackhole); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("step %d: region %s cut off from etcd", step, reg.name)
		for range 1 + r.rng.IntN(3) {
			time.Sleep(time.Duration(r.rng.IntN(800)) * time.Millisecond)
			r.change(step, reg.name)
		}
		time.Sleep(regionTTL + skewMargin + rebalanceIv)
		for _, n := range cut {
			if err := n.proxy.SetMode(faultproxy.Pass); err != nil {
				t.Fatal(err)
			}
		}
		for _, n := range cut {
			n.waitReady(15 * time.Second)
		}
		t.Logf("step %d: region %s healed", step, reg.name)
	case pause:
		d := regionTTL + time.Second + time.Duration(r.rng.IntN(1000))*time.Millisecond
		r.child.pause(d)
		t.Logf("step %d: node %s paused %v (lease TTL %v)", step, r.child.label, d.Round(time.Millisecond), regionTTL)
		r.child.waitReady(15 * time.Second)
	case clockStep:
		n := r.nodes[r.rng.IntN(len(r.nodes))]
		if n.child {
			n = r.nodes[0]
		}
		d := time.Duration(2+r.rng.IntN(3600)) * time.Second
		n.clk.step(-d)
		t.Logf("step %d: node %s's clock stepped back %v", step, n.label, d)
	case operate:
		for range 1 + r.rng.IntN(3) {
			r.change(step, "")
		}
	case quiet:
		for _, d := range e.drivers {
			d.setRate(0)
		}
		time.Sleep(refillTime)
	}
}

// regionNodes returns the run's nodes of region name.
func (r *run) regionNodes(name string) []*region {
	var out []*region
	for _, n := range r.nodes {
		if n.name == name {
			out = append(out, n)
		}
	}
	return out
}

// change makes one random operator change through the operator API: a
// minimum, a weight, or a pin (or unpin), of a random policy, for region
// (a random region when empty). A change the coordinator refuses (Σ
// minimums over 1, a pin below a minimum) is logged, not a failure.
func (r *run) change(step int, region string) {
	if region == "" {
		region = r.e.regions[r.rng.IntN(len(r.e.regions))].name
	}
	pol := allPolicies[r.rng.IntN(len(allPolicies))]
	var what string
	err := r.e.operator(func(ctx context.Context, op quotav1.OperatorClient) error {
		var err error
		switch r.rng.IntN(3) {
		case 0:
			m := []float64{0, 0.02, 0.05, 0.15}[r.rng.IntN(4)]
			what = fmt.Sprintf("minimum of %s in %s set to %v", pol, region, m)
			_, err = op.SetMinimum(ctx, &quotav1.SetMinimumRequest{Policy: pol, Region: region, Minimum: m})
		case 1:
			w := []float64{0.5, 1, 2, 4}[r.rng.IntN(4)]
			what = fmt.Sprintf("weight of %s in %s set to %v", pol, region, w)
			_, err = op.SetWeight(ctx, &quotav1.SetWeightRequest{Policy: pol, Region: region, Weight: w})
		default:
			if r.pins[[2]string{pol, region}] {
				what = fmt.Sprintf("%s unpinned in %s", pol, region)
				_, err = op.Unpin(ctx, &quotav1.UnpinRequest{Policy: pol, Region: region})
				delete(r.pins, [2]string{pol, region})
				return err
			}
			s := []float64{0.1, 0.3, 0.6}[r.rng.IntN(3)]
			what = fmt.Sprintf("%s pinned at %v in %s", pol, s, region)
			if _, err = op.Pin(ctx, &quotav1.PinRequest{Policy: pol, Region: region, Share: s}); err == nil {
				r.pins[[2]string{pol, region}] = true
			}
		}
		return err
	})
	r.logChange(step, what, err)
}

// unpin removes policy's pin in region.
func (r *run) unpin(step int, policy, region string) {
	err := r.e.operator(func(ctx context.Context, op quotav1.OperatorClient) error {
		_, err := op.Unpin(ctx, &quotav1.UnpinRequest{Policy: policy, Region: region})
		return err
	})
	delete(r.pins, [2]string{policy, region})
	r.logChange(step, fmt.Sprintf("%s unpinned in %s", policy, region), err)
}

func (r *run) logChange(step int, what string, err error) {
	switch status.Code(err) {
	case codes.OK:
		r.t.Logf("step %d: %s", step, what)
	case codes.InvalidArgument, codes.NotFound:
		r.t.Logf("step %d: refused: %s: %v", step, what, err)
	default:
		r.t.Fatalf("step %d: %s: %v", step, what, err)
	}
}

// startDriver starts a load driver of subject at node r, idle until its
// rate is set; it is stopped at cleanup.
func (e *env) startDriver(r *region, subject string) *driver {
	d := newDriver(r, subject)
	e.drivers = append(e.drivers, d)
	e.t.Cleanup(d.close)
	return d
}

// killLeaderMidShrink moves the demand so the allocation must shrink,
// cuts one region off etcd so it cannot acknowledge the shrink, kills the
// leader while the shrink is pending, and checks that the standby takes
// over and completes it (after the cut-off region's lease expired plus
// the skew margin). A fresh standby replaces the killed coordinator.
func killLeaderMidShrink(t *testing.T, e *env, rng *rand.Rand) {
	t.Helper()
	old := e.leader(10 * time.Second)
	before, _ := e.alloc()
	// Demand leaves the region with the largest share for another one.
	top := e.regions[0]
	for _, r := range e.regions {
		if share(before, r.name) > share(before, top.name) {
			top = r
		}
	}
	next := e.regions[(indexOf(e.regions, top)+1+rng.IntN(len(e.regions)-1))%len(e.regions)]
	for _, d := range e.drivers {
		if d.subject == hotSubject {
			d.setRate(0)
		}
	}
	next.load.setRate(offeredRate)
	mute := e.regions[rng.IntN(len(e.regions))]
	if err := mute.proxy.SetMode(faultproxy.Blackhole); err != nil {
		t.Fatal(err)
	}
	var shrink etcdlayout.Allocation
	e.waitFor(8*rebalanceIv, "a pending shrink", func() bool {
		a, ok := e.alloc()
		if ok && a.Epoch > before.Epoch && a.Phase == etcdlayout.PhaseShrink {
			shrink = a
			return true
		}
		return false
	})
	killed := time.Now()
	old.kill(t)
	t.Logf("demand moved %s -> %s, %s cut off; leader %s killed at epoch %d (shrink pending)",
		top.name, next.name, mute.label, old.name, shrink.Epoch)
	nl := e.leader(5*sessionTTL + 5*time.Second)
	t.Logf("%s leads %v after the kill", nl.name, time.Since(killed).Round(time.Millisecond))
	e.coords = append(e.coords, e.startCoord("coord-"+strconv.Itoa(len(e.coords)), e.tokenFile))
	e.waitFor(regionTTL+skewMargin+10*rebalanceIv, "the pending shrink completed by the new leader", func() bool {
		a, ok := e.alloc()
		return ok && a.Epoch > shrink.Epoch
	})
	grown, _ := e.alloc()
	t.Logf("new leader published epoch %d (%s) %v after the kill", grown.Epoch, grown.Phase, grown.PublishedAt.Sub(killed).Round(time.Millisecond))
	if err := mute.proxy.SetMode(faultproxy.Pass); err != nil {
		t.Fatal(err)
	}
	mute.waitReady(15 * time.Second)
}

func indexOf(rs []*region, r *region) int {
	for i, x := range rs {
		if x == r {
			return i
		}
	}
	return -1
}
