package e2e

import (
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/boundcheck"
	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/policy"
	"github.com/quotacoord/quota/internal/regional"
	"github.com/quotacoord/quota/internal/reliability"
	"github.com/quotacoord/quota/internal/rlqs"
)

// The lease runs: one subject offered 3× a budget of 60 and 30 per
// second; the demand moves to another region every leaseRegionMove and,
// inside the hot region, to another of its consumers every
// leaseConsumerMove. LEASE_SECONDS (make reliability) lengthens the run.
const (
	leaseSecondsEnv   = "LEASE_SECONDS"
	leaseSeconds      = 15
	leaseRegionMove   = 6 * time.Second
	leaseConsumerMove = 3 * time.Second
	leaseOffered      = 90.0       // 3× the refill
	leaseSubject      = hotSubject // the regions' drivers check it
)

// edgeDoc is the Envoy rule the RLQS run leases: tenants of domain edge,
// a token bucket of 60 refilled at 30 per second (edge.tenant).
var edgeDoc = []byte(`domain: edge
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 30, burst: 60}
`)

// nodeLeaseDoc is the policy the node-lease run leases: the same budget
// in the own format, hot subjects decided from node leases.
var nodeLeaseDoc = []byte(`policies:
  - name: leased
    description: end-to-end node leases, 30 per second per tenant
    capacity: 60
    rate: 30/s
    failure_mode: closed
    lease: {fraction: 1, ttl: 1s}
    min_share:
      default: 0.02
`)

// leaseRun is what both lease runs share: the seeded schedule of where
// the demand sits and the check of what was admitted.
type leaseRun struct {
	t        *testing.T
	e        *env
	policy   string
	limits   bucket.Limits
	rng      *rand.Rand
	duration time.Duration
}

func newLeaseRun(t *testing.T, e *env, policyName string, doc []byte) *leaseRun {
	t.Helper()
	set, err := policy.Parse("lease.yaml", doc)
	if err != nil {
		t.Fatal(err)
	}
	p, ok := set.Get(policyName)
	if !ok {
		t.Fatalf("no policy %s", policyName)
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(seedEnv); s != "" {
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("%s=%q: %v", seedEnv, s, err)
		}
	}
	t.Logf("seed %d (%s replays it)", seed, seedEnv)
	return &leaseRun{t: t, e: e, policy: policyName, limits: p.Limits, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		duration: time.Duration(envInt(t, leaseSecondsEnv, leaseSeconds)) * time.Second}
}

// weights returns each of n consumers' part of the demand: most of it in
// the group of perGroup consumers (a region) hot, and inside it most on
// consumer hot of the group; every other group keeps a little, spread
// over its consumers.
func weights(n, perGroup, hot, hotConsumer int) []float64 {
	w := make([]float64, n)
	for i := range w {
		w[i] = 0.03 / float64(perGroup)
		if i/perGroup == hot {
			w[i] = 0.1
		}
	}
	w[hot*perGroup+hotConsumer] = 0.6
	sum := 0.0
	for _, v := range w {
		sum += v
	}
	for i := range w {
		w[i] /= sum
	}
	return w
}

// run calls set with the demand's weights for the run's duration, moving
// the demand to another consumer of the hot region every
// leaseConsumerMove, and to another region every leaseRegionMove; then
// with no demand.
func (r *leaseRun) run(n, perGroup int, set func([]float64)) {
	other := func(k, cur int) int { return (cur + 1 + r.rng.IntN(k-1)) % k }
	hot, hotConsumer := r.rng.IntN(n/perGroup), r.rng.IntN(perGroup)
	start := time.Now()
	for step := 0; time.Since(start) < r.duration; step++ {
		switch {
		case step == 0:
		case step%int(leaseRegionMove/leaseConsumerMove) == 0:
			hot, hotConsumer = other(n/perGroup, hot), r.rng.IntN(perGroup)
		default:
			hotConsumer = other(perGroup, hotConsumer)
		}
		set(weights(n, perGroup, hot, hotConsumer))
		time.Sleep(min(leaseConsumerMove, time.Until(start.Add(r.duration))))
	}
	set(make([]float64, n))
}

// check runs the bound checker over every admission, reports the
// under-admission, fails on an admission count below minPart of an ideal
// global bucket's (a floor that a layer admitting next to nothing
// breaks, not a target: the figures move with the machine's load), and
// checks that the coordinator moved the subject's share to at least two
// regions (the demand moved; so did the shares).
func (r *leaseRun) check(offers []time.Time, minPart float64) {
	t := r.t
	rep := r.e.checkBound()
	var adms []boundcheck.Admission
	for _, d := range r.e.drivers {
		d.mu.Lock()
		for _, a := range d.admitted {
			if a.Policy == r.policy {
				adms = append(adms, a)
			}
		}
		d.mu.Unlock()
	}
	if r.e.admissions != nil {
		adms = append(adms, r.e.admissions()...)
	}
	admitted := len(adms)
	r.timeline(adms, offers)
	ideal := boundcheck.IdealAdmitted(offers, r.limits)
	note := fmt.Sprintf("offered %d in %v, admitted %d; an ideal global bucket admits %d: under-admission %.1f%%; fullest window at %.0f%% of its bound",
		len(offers), r.duration, admitted, ideal, 100*(1-float64(admitted)/float64(max(ideal, 1))), 100*rep.Peak)
	t.Log(note)
	defer func() {
		if err := reliability.NewRecorder(os.Getenv("RELIABILITY_REPORT")).Record(reliability.Entry{
			Kind: reliability.KindBound, Name: t.Name(), Injected: rep.Decisions > 0, Survived: !t.Failed() && len(rep.Violations) == 0,
			BoundDecisions: int64(rep.Decisions), BoundWindows: rep.Windows, Violations: int64(len(rep.Violations)), Note: note,
		}); err != nil {
			t.Error(err)
		}
	}()
	if float64(admitted) < minPart*float64(ideal) {
		t.Errorf("admitted %d, under %.0f%% of an ideal global bucket's %d", admitted, 100*minPart, ideal)
	}
	// The region holding the largest share of the subject, by epoch.
	hist := r.e.allocHistory(r.policy)
	led := map[string]bool{}
	for _, a := range hist {
		best, top := "", 1.0/3+0.05
		for _, reg := range r.e.regions {
			if f := subjectShare(a, leaseSubject, reg.name); f > top {
				best, top = reg.name, f
			}
		}
		if best != "" {
			led[best] = true
		}
	}
	t.Logf("%d allocations of %s published; regions that held the largest share of %s: %v", len(hist), r.policy, leaseSubject, slices.Sorted(maps.Keys(led)))
	if len(led) < 2 {
		t.Errorf("%s's largest share stayed in %d region(s): the coordinator did not move the shares with the demand", leaseSubject, len(led))
	}
	r.e.replay()
}

// timeline logs, second by second, what was offered, what each region
// admitted and the subject's shares published at the second's start.
func (r *leaseRun) timeline(adms []boundcheck.Admission, offers []time.Time) {
	if len(offers) == 0 {
		return
	}
	start := slices.MinFunc(offers, func(a, b time.Time) int { return a.Compare(b) })
	second := func(at time.Time) int { return int(at.Sub(start) / time.Second) }
	n := second(slices.MaxFunc(offers, func(a, b time.Time) int { return a.Compare(b) })) + 1
	offered := make([]int, n+1)
	for _, o := range offers {
		offered[second(o)]++
	}
	byRegion := map[string][]int{}
	for _, reg := range r.e.regions {
		byRegion[reg.name] = make([]int, n+1)
	}
	for _, a := range adms {
		if s := second(a.At); s <= n {
			byRegion[a.Region][s]++
		}
	}
	hist := r.e.allocHistory(r.policy)
	var b strings.Builder
	b.WriteString("second, offered, admitted and the subject's share by region:")
	for s := range n {
		fmt.Fprintf(&b, "\n%3ds %3d", s, offered[s])
		at := start.Add(time.Duration(s) * time.Second)
		var cur *etcdlayout.Allocation
		for i := range hist {
			if !hist[i].PublishedAt.After(at) {
				cur = &hist[i]
			}
		}
		for _, reg := range r.e.regions {
			fmt.Fprintf(&b, "  %s %3d", reg.name, byRegion[reg.name][s])
			if cur != nil {
				fmt.Fprintf(&b, " (%.2f)", subjectShare(*cur, leaseSubject, reg.name))
			}
		}
	}
	r.t.Log(b.String())
}

// envoy is one RLQS client deciding locally, offered its part of the
// demand.
type envoy struct {
	c      *rlqs.Client
	region *region
	label  string
	rate   atomic.Uint64 // requests per second, float64 bits
}

// TestLiveRLQSBound: three regions on Redis with a live coordinator, each
// node serving RLQS to four Envoy-faithful clients. One tenant is offered
// 3× its budget, the demand moving every 3 s between regions and between
// the Envoys of a region; the Envoys' usage reports are the regions'
// demand, so the coordinator moves the shares and the nodes move the
// leases under them. Every window of every length admits at most
// C + r·W (boundcheck), and the under-admission against one ideal global
// bucket is reported.
func TestLiveRLQSBound(t *testing.T) {
	e := newEnvWith(t, 1, [][]byte{policyDoc, edgeDoc}, func(c *regional.DaemonConfig) {
		c.EnvoyPlainKeys = []string{"tenant"}
		c.RLQS = regional.RLQSConfig{Enabled: true, Interval: 500 * time.Millisecond, TTL: time.Second, Margin: 300 * time.Millisecond}
	}, "a", "b", "c")
	r := newLeaseRun(t, e, "edge.tenant", edgeDoc)
	const perRegion = 4
	var envoys []*envoy
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, reg := range e.regions {
		reg.mu.Lock()
		conn := reg.conn
		reg.mu.Unlock()
		for i := range perRegion {
			c := rlqs.NewClient(rlqs.ClientConfig{Domain: "edge", NoAssignment: rlqs.DenyAll, Expired: rlqs.DenyAll, ReportNew: true})
			if err := c.Connect(ctx, conn); err != nil {
				t.Fatal(err)
			}
			envoys = append(envoys, &envoy{c: c, region: reg, label: fmt.Sprintf("%s/envoy%d", reg.name, i)})
		}
	}
	var mu sync.Mutex
	var adms []boundcheck.Admission
	var offers []time.Time
	e.admissions = func() []boundcheck.Admission {
		mu.Lock()
		defer mu.Unlock()
		return append([]boundcheck.Admission(nil), adms...)
	}
	id := map[string]string{"tenant": leaseSubject}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, v := range envoys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// The filter's report timer, at the nodes' demand report
			// interval: each of a node's demand reports then holds one
			// usage report of each Envoy (a shorter or unaligned one
			// makes the region's demand jitter from report to report).
			// Requests arrive at the Envoy's rate, decided locally.
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			nextReport := time.Now().Add(reportIv)
			last, acc := time.Now(), 0.0
			for {
				select {
				case <-stop:
					return
				case now := <-tick.C:
					acc += math.Float64frombits(v.rate.Load()) * now.Sub(last).Seconds()
					last = now
				}
				for ; acc >= 1; acc-- {
					sent := time.Now()
					ok := v.c.Allow(id)
					at := time.Now()
					mu.Lock()
					if len(offers) < maxAdmissions {
						offers = append(offers, sent)
						if ok {
							adms = append(adms, boundcheck.Admission{Policy: r.policy, Subject: leaseSubject, Region: v.region.name,
								Node: v.label, Sent: sent, At: at, Cost: 1})
						}
					}
					mu.Unlock()
				}
				if time.Now().After(nextReport) {
					_ = v.c.Report() // a stream that is down drops its usage, as the filter does
					nextReport = nextReport.Add(reportIv)
				}
			}
		}()
	}
	r.run(len(envoys), perRegion, func(w []float64) {
		for i, v := range envoys {
			v.rate.Store(math.Float64bits(leaseOffered * w[i]))
		}
	})
	close(stop)
	wg.Wait()
	for _, v := range envoys {
		v.c.Close()
	}
	var st rlqs.ClientStats
	for _, v := range envoys {
		s := v.c.Stats()
		st.Allowed, st.Denied, st.NoAssignment, st.Expired, st.Assignments = st.Allowed+s.Allowed, st.Denied+s.Denied,
			st.NoAssignment+s.NoAssignment, st.Expired+s.Expired, st.Assignments+s.Assignments
	}
	t.Logf("Envoys: %+v", st)
	mu.Lock()
	o := append([]time.Time(nil), offers...)
	mu.Unlock()
	if st.Assignments == 0 {
		t.Fatal("no Envoy received an assignment")
	}
	r.check(o, 0.1)
}

// TestLiveNodeLeaseBound: three regions on Redis with a live coordinator,
// two nodes per region sharing the region's Redis, the policy leased to
// the nodes (hot subjects decided in memory). One tenant is offered 3×
// its budget through the nodes' own API, the demand moving every 3 s
// between regions and between the nodes of a region. Every window admits
// at most C + r·W (boundcheck), the nodes did decide from leases, and the
// under-admission against one ideal global bucket is reported.
func TestLiveNodeLeaseBound(t *testing.T) {
	e := newEnvDocs(t, 1, [][]byte{policyDoc, nodeLeaseDoc}, "a", "b", "c")
	r := newLeaseRun(t, e, "leased", nodeLeaseDoc)
	var nodes []*region
	for _, reg := range append([]*region(nil), e.regions...) {
		nodes = append(nodes, reg, e.addNode(reg, false))
	}
	for _, n := range nodes {
		n.load.setPolicies(r.policy)
	}
	r.run(len(nodes), 2, func(w []float64) {
		for i, n := range nodes {
			n.load.setRate(leaseOffered * w[i])
		}
	})
	time.Sleep(100 * time.Millisecond) // the checks in flight end
	var offers []time.Time
	for _, n := range nodes {
		n.load.mu.Lock()
		offers = append(offers, n.load.offers[r.policy]...)
		n.load.mu.Unlock()
	}
	grants := 0.0
	for _, n := range nodes {
		grants += n.metric(`quota_regional_node_lease_calls_total{op="grant"}`)
	}
	t.Logf("node lease grants: %.0f", grants)
	if grants == 0 {
		t.Error("no node took a lease: the run did not test node leases")
	}
	r.check(offers, 0.35)
}

// metric returns the value of the sample named (with its labels) on the
// node's /metrics page, 0 when absent.
func (r *region) metric(sample string) float64 {
	r.e.t.Helper()
	r.mu.Lock()
	u := r.httpURL
	r.mu.Unlock()
	resp, err := http.Get(u + "/metrics")
	if err != nil {
		r.e.t.Fatalf("metrics of %s: %v", r.label, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		r.e.t.Fatalf("metrics of %s: %v", r.label, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, sample+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				r.e.t.Fatalf("metrics of %s: %q: %v", r.label, line, err)
			}
			return f
		}
	}
	return 0
}
