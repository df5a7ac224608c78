package scale

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/quotacoord/quota/internal/coordinator"
	"github.com/quotacoord/quota/internal/demand"
	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/faultproxy"
	"github.com/quotacoord/quota/internal/regionsync"
	"github.com/quotacoord/quota/rebalance"
)

// Params sizes one run.
type Params struct {
	// Policies, Regions and NodesPerRegion size the deployment.
	Policies, Regions, NodesPerRegion int
	// Pressured is the number of pressured subjects each node reports per
	// policy (at most the recorder's top-K).
	Pressured int
	// Records is how many times per report interval each node records
	// its demand. Default 40.
	Records int
	// Moving is how many policies' demand turns to the next region every
	// three rebalance intervals; the others keep theirs. 0: every policy.
	Moving int
	// Jitter, in [0, 0.5], scales what each node records of each
	// policy's offered rate by a factor drawn uniformly from
	// [1−Jitter, 1+Jitter] at every record: the noise of real reports (a
	// node rewrites a policy's report once it moved by more than its 5%
	// tolerance). 0: steady rates.
	Jitter float64
	// ReportInterval and RebalanceInterval are the protocol's intervals.
	ReportInterval, RebalanceInterval time.Duration
	// Duration is how long the run measures after every node is ready
	// and the warm-up.
	Duration time.Duration
	// Warmup is how long the run waits, once every node is ready, before
	// it measures: the first allocation of every policy and its first
	// moves are then behind. Default ten rebalance intervals.
	Warmup time.Duration
	// NodesPerClient is how many nodes share one etcd client (a client
	// per node would mostly measure gRPC connections). Default 25.
	NodesPerClient int
	// Sampled is how many policies' share changes are timed at every
	// node. Default 10.
	Sampled int
	// DataDir holds the embedded etcd. Required.
	DataDir string
	// SessionTTL is the coordinators' election session TTL: how long a
	// leader cut off keeps the lead, and how late its keep-alives may be
	// on a starved machine before it loses the lead. Default 2s, shorter
	// than a deployment's (rebalance.Config's 5s) so failovers end soon.
	SessionTTL time.Duration
	// Failover, after the measurement, cuts the leader off from etcd and
	// measures how soon a standby coordinator leads and ends its first
	// round, replaying the invariant over the whole run (Result.Failover).
	Failover bool
	// Logger receives the coordinator's log; default none.
	Logger hclog.Logger
}

// Bounds on Params, so that a typo does not exhaust the machine.
const (
	MaxPolicies = 20000
	MaxRegions  = 64
	MaxNodes    = 4096
)

func (p Params) withDefaults() (Params, error) {
	if p.NodesPerClient == 0 {
		p.NodesPerClient = 25
	}
	if p.Sampled == 0 {
		p.Sampled = 10
	}
	if p.Records == 0 {
		p.Records = 40
	}
	if p.Warmup == 0 {
		p.Warmup = 10 * p.RebalanceInterval
	}
	if p.SessionTTL == 0 {
		p.SessionTTL = DefaultSessionTTL
	}
	if p.Logger == nil {
		p.Logger = hclog.NewNullLogger()
	}
	switch {
	case p.Policies < 1 || p.Policies > MaxPolicies:
		return p, fmt.Errorf("scale: %d policies, want 1 to %d", p.Policies, MaxPolicies)
	case p.Regions < 1 || p.Regions > MaxRegions:
		return p, fmt.Errorf("scale: %d regions, want 1 to %d", p.Regions, MaxRegions)
	case p.NodesPerRegion < 1 || p.Regions*p.NodesPerRegion > MaxNodes || p.NodesPerRegion > rebalance.MaxNodesPerRegion:
		return p, fmt.Errorf("scale: %d nodes per region × %d regions, want at most %d per region and %d in all",
			p.NodesPerRegion, p.Regions, rebalance.MaxNodesPerRegion, MaxNodes)
	case p.Records < 1 || p.Records > 1000:
		return p, fmt.Errorf("scale: %d records per report interval, want 1 to 1000", p.Records)
	case p.Moving < 0 || p.Moving > p.Policies:
		return p, fmt.Errorf("scale: %d moving policies, want 0 to %d", p.Moving, p.Policies)
	case math.IsNaN(p.Jitter) || p.Jitter < 0 || p.Jitter > 0.5:
		return p, fmt.Errorf("scale: jitter %v, want 0 to 0.5", p.Jitter)
	case p.Pressured < 0 || p.Pressured > demand.MaxTopK:
		return p, fmt.Errorf("scale: %d pressured subjects, want 0 to %d", p.Pressured, demand.MaxTopK)
	case p.ReportInterval < regionsync.MinReportInterval || p.RebalanceInterval <= 0 || p.Duration <= 0:
		return p, fmt.Errorf("scale: report interval %v, rebalance interval %v, duration %v", p.ReportInterval, p.RebalanceInterval, p.Duration)
	case p.SessionTTL < time.Second || p.SessionTTL > time.Minute:
		return p, fmt.Errorf("scale: session TTL %v, want 1s to 1m", p.SessionTTL)
	case p.DataDir == "":
		return p, errors.New("scale: no data directory")
	}
	p.Sampled = min(p.Sampled, p.Policies)
	return p, nil
}

// Result is what one run measured.
type Result struct {
	Params Params
	// Rounds counts the leader's full rounds while measuring;
	// RoundP50 and RoundP99 are their durations (bucket upper bounds of
	// the coordinator's round histogram).
	Rounds             int
	RoundP50, RoundP99 time.Duration
	// Epochs counts allocations published while measuring.
	Epochs int
	// BytesPerRound is etcd bytes (keys and values of every put) written
	// per full round while measuring, by kind: alloc, ack, demand,
	// registration, other.
	BytesPerRound map[string]float64
	// LargestValue is the largest value put, and LargestKey its key kind.
	LargestValue int
	LargestKind  string
	// VisibleP50 and VisibleP99 are how long after the harness saw a
	// sampled policy's new epoch in etcd each node applied it; Visible
	// counts the (node, epoch) pairs timed and Missed those not applied
	// by the end of the run.
	VisibleP50, VisibleP99 time.Duration
	Visible, Missed        int
	// HeapPerNode is the Go heap in use, after the run, per node of this
	// process (the nodes' share tables, watches and recorders; the
	// coordinator and etcd are in the same process and included).
	HeapPerNode float64
	// Planned is the mean number of policies a full round planned.
	Planned float64
	// Failover is set when Params.Failover is.
	Failover Failover
	// Wall is the whole run's time, set-up included.
	Wall time.Duration
}

// Run starts the deployment, waits for every node to be ready, measures
// for p.Duration and stops everything it started.
func Run(ctx context.Context, p Params, log io.Writer) (Result, error) {
	start := time.Now()
	p, err := p.withDefaults()
	if err != nil {
		return Result{}, err
	}
	res := Result{Params: p, BytesPerRound: map[string]float64{}}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	etcdAddr, err := freeAddr()
	if err != nil {
		return res, err
	}
	// The etcd host is a coordinator with the embedded etcd whose own
	// loop leads an empty prefix: the coordinators measured connect to
	// its etcd like to an external one, so that the leader can be killed
	// (cut off behind a proxy) while etcd lives on.
	host, err := coordinator.Start(ctx, coordinator.Config{
		DataDir: p.DataDir, EmbeddedEtcdAddr: etcdAddr, GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		Logger: hclog.NewNullLogger(), Rebalance: rebalance.Config{Prefix: "/scale-etcd-host/", Interval: time.Hour},
	})
	if err != nil {
		return res, fmt.Errorf("scale: start etcd: %w", err)
	}
	var coords []*coordinator.Coordinator
	defer func() {
		cancel()
		for _, c := range coords {
			_ = c.Wait()
		}
		_ = host.Wait()
	}()
	start1 := func(name string, endpoints []string) (*coordinator.Coordinator, error) {
		c, err := coordinator.Start(ctx, coordinator.Config{
			EtcdEndpoints: endpoints, DataDir: p.DataDir + "/" + name, TokenFile: p.DataDir + "/" + name + "-tokens",
			GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Logger: p.Logger.Named(name),
			Rebalance: rebalance.Config{Name: name, Interval: p.RebalanceInterval, ReportInterval: time.Hour,
				SessionTTL: p.SessionTTL, RegionLeaseTTL: 10 * time.Second},
		})
		if err != nil {
			return nil, fmt.Errorf("scale: start coordinator %s: %w", name, err)
		}
		coords = append(coords, c)
		return c, nil
	}
	endpoints := host.EtcdEndpoints
	var proxy *faultproxy.Proxy
	if p.Failover {
		if proxy, err = faultproxy.Start(faultproxy.Config{Target: etcdAddr}); err != nil {
			return res, fmt.Errorf("scale: %w", err)
		}
		defer proxy.Close()
		endpoints = []string{"http://" + proxy.Addr()}
	}
	coord, err := start1("leader", endpoints)
	if err != nil {
		return res, err
	}
	for !coord.Loop.IsLeader() {
		if ctx.Err() != nil || time.Since(start) > time.Minute {
			return res, errors.New("scale: the coordinator did not lead within a minute")
		}
		time.Sleep(10 * time.Millisecond)
	}
	var standby *coordinator.Coordinator
	if p.Failover {
		if standby, err = start1("standby", host.EtcdEndpoints); err != nil {
			return res, err
		}
	}
	clients := make([]*clientv3.Client, 0, p.Regions*p.NodesPerRegion/p.NodesPerClient+1)
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	dial := func() (*clientv3.Client, error) {
		c, err := regionsync.Dial(host.EtcdEndpoints)
		if err == nil {
			clients = append(clients, c)
		}
		return c, err
	}
	admin, err := dial()
	if err != nil {
		return res, err
	}
	layout := etcdlayout.Layout{}
	if err := putPolicies(ctx, admin, layout, p.Policies); err != nil {
		return res, err
	}
	fmt.Fprintf(log, "scale: %d policies stored; starting %d nodes in %d regions\n", p.Policies, p.Regions*p.NodesPerRegion, p.Regions)

	var nodes []*node
	var cli *clientv3.Client
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	for r := 0; r < p.Regions; r++ {
		for n := 0; n < p.NodesPerRegion; n++ {
			if len(nodes)%p.NodesPerClient == 0 {
				if cli, err = dial(); err != nil {
					return res, err
				}
			}
			nd, err := newNode(cli, layout, r, n, p)
			if err != nil {
				return res, err
			}
			nodes = append(nodes, nd)
			wg.Add(1)
			go func() { defer wg.Done(); _ = nd.sync.Run(ctx) }()
		}
	}
	// Demand: Records times a report interval each node records, for
	// each policy, a rate that favours one region, the favoured region of
	// the moving policies turning every three rebalance intervals so that
	// their shares keep moving. The harness drives the reports itself
	// (the coordinator publishes an interval of an hour, which keeps the
	// nodes' own timers quiet): right after each report interval's last
	// record every node writes its report, so that a report holds the
	// rates recorded up to the instant it is taken, and a steady policy's
	// report stays within the nodes' 5% tolerance (unwritten, unplanned).
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(p.ReportInterval / time.Duration(p.Records))
		defer t.Stop()
		for tick := 1; ; tick++ {
			phase := int(time.Since(start) / (3 * p.RebalanceInterval))
			if tick%p.Records == 0 {
				report(ctx, nodes, phase, p)
			} else {
				for _, nd := range nodes {
					nd.record(phase, p, time.Now())
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	ready := time.Now()
	for _, nd := range nodes {
		for !nd.sync.Ready() {
			if ctx.Err() != nil || time.Since(ready) > 2*time.Minute {
				return res, fmt.Errorf("scale: node %s/%s not ready after %v", nd.region, nd.sync.Node(), time.Since(ready).Round(time.Second))
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	fmt.Fprintf(log, "scale: every node ready after %v; warming up for %v, then measuring for %v\n", time.Since(ready).Round(time.Millisecond), p.Warmup, p.Duration)
	select {
	case <-ctx.Done():
		return res, ctx.Err()
	case <-time.After(p.Warmup):
	}

	before, err := scrape(coord.HTTPAddr)
	if err != nil {
		return res, err
	}
	w := newWatcher(admin, layout, nodes, p.Sampled)
	mctx, mcancel := context.WithTimeout(ctx, p.Duration)
	defer mcancel()
	if err := w.run(mctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return res, err
	}
	after, err := scrape(coord.HTTPAddr)
	if err != nil {
		return res, err
	}
	res.Rounds = int(after.counter("quota_coordinator_rebalance_rounds_total", "kind", "full") - before.counter("quota_coordinator_rebalance_rounds_total", "kind", "full"))
	res.Epochs = int(after.counter("quota_coordinator_epochs_published_total", "", "") - before.counter("quota_coordinator_epochs_published_total", "", ""))
	res.RoundP50 = after.quantile(before, "quota_coordinator_rebalance_round_seconds", 0.5)
	res.RoundP99 = after.quantile(before, "quota_coordinator_rebalance_round_seconds", 0.99)
	for k, b := range w.bytes {
		res.BytesPerRound[k] = float64(b) / float64(max(1, res.Rounds))
	}
	res.LargestValue, res.LargestKind = w.largest, w.largestKind
	res.VisibleP50, res.VisibleP99 = percentile(w.delays, 0.5), percentile(w.delays, 0.99)
	res.Visible, res.Missed = len(w.delays), w.missed()
	if n := after.histCount("quota_coordinator_round_policies_planned", "full") - before.histCount("quota_coordinator_round_policies_planned", "full"); n > 0 {
		res.Planned = (after.histSum("quota_coordinator_round_policies_planned", "full") - before.histSum("quota_coordinator_round_policies_planned", "full")) / n
	}
	if p.Failover {
		fo, err := kill(ctx, admin, layout, proxy, standby)
		if err != nil {
			fo.Err = err.Error()
		}
		// Let the new leader publish and the nodes acknowledge before the
		// replay's end.
		time.Sleep(2 * p.RebalanceInterval)
		if fo.Invariant, err = replayInvariant(ctx, admin, layout, w.sampled); err != nil {
			return res, err
		}
		res.Failover = fo
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	res.HeapPerNode = float64(ms.HeapInuse) / float64(len(nodes))
	res.Wall = time.Since(start)
	return res, nil
}

// report records every node's demand up to now and at once writes its
// report, p.NodesPerClient nodes at a time; it returns when all are
// written (or failed: a node without a lease drops its report, as its own
// timer would).
func report(ctx context.Context, nodes []*node, phase int, p Params) {
	var wg sync.WaitGroup
	next := make(chan *node)
	for range p.NodesPerClient {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for nd := range next {
				// The report ends where the recording did, so its rates
				// are the recorded ones, however long recording took.
				now := time.Now()
				nd.record(phase, p, now)
				_ = nd.sync.FlushAt(ctx, now)
			}
		}()
	}
	for _, nd := range nodes {
		next <- nd
	}
	close(next)
	wg.Wait()
}

// putPolicies stores n token-bucket policies, 200 to a document.
func putPolicies(ctx context.Context, cli *clientv3.Client, l etcdlayout.Layout, n int) error {
	const perDoc = 200
	for d := 0; d*perDoc < n; d++ {
		var b bytes.Buffer
		b.WriteString("policies:\n")
		for i := d * perDoc; i < min(n, (d+1)*perDoc); i++ {
			fmt.Fprintf(&b, "  - name: %s\n    subject: tenant\n    capacity: %d\n    rate: %d/second\n", policyName(i), policyRate, policyRate)
		}
		if _, err := cli.Put(ctx, l.PolicyDoc("scale-"+strconv.Itoa(d)), b.String()); err != nil {
			return fmt.Errorf("scale: store policies: %w", err)
		}
	}
	return nil
}

func policyName(i int) string { return "p" + strconv.Itoa(i) }

// node is one simulated regional node: the real Syncer and recorder.
type node struct {
	region string
	index  int
	rec    *demand.Recorder
	sync   *regionsync.Syncer
	// last is when record last ran; favoured, other and subjectCarry the
	// fractions of cost it owes.
	last                          time.Time
	favoured, other, subjectCarry float64
	// jitter draws the factor of Params.Jitter.
	jitter *rand.Rand
}

func newNode(cli *clientv3.Client, l etcdlayout.Layout, region, n int, p Params) (*node, error) {
	rec, err := demand.New(demand.Config{MaxPolicies: p.Policies + 1, TopK: max(1, p.Pressured)})
	if err != nil {
		return nil, err
	}
	name := "r" + strconv.Itoa(region)
	s, err := regionsync.New(regionsync.Config{
		Region: name, Node: "n" + strconv.Itoa(n), Client: cli, Layout: l, Recorder: rec,
		ReportInterval: p.ReportInterval, MaxPolicies: p.Policies + 1, RequestTimeout: 3 * time.Second,
	})
	if err != nil {
		return nil, err
	}
	return &node{region: name, index: region, rec: rec, sync: s, jitter: rand.New(rand.NewPCG(uint64(region), uint64(n)))}, nil
}

// Demand rates, in cost per second, against a policy rate of 10,000/s
// (policyRate): the favoured region offers favouredRate, the others
// otherRate, each pressured subject is denied subjectRate. Rates are large
// enough that a report interval's integer costs carry them within 1%.
const (
	policyRate   = 10000
	favouredRate = 10000
	otherRate    = 1000
	subjectRate  = 200
)

// record adds the demand since the node's last record at now: favouredRate
// for every policy in its favoured region, otherRate elsewhere, and the
// pressured subjects' denials, each policy's offered cost scaled by a
// factor of Params.Jitter.
// The first p.Moving policies (all when 0) favour region phase modulo
// regions, the others always the same region (their index modulo
// regions): their demand stays put. Costs follow the time passed, so a
// report holds the same rates however the ticks fall.
func (nd *node) record(phase int, p Params, now time.Time) {
	if nd.last.IsZero() {
		nd.last = now
		return
	}
	dt := now.Sub(nd.last).Seconds()
	nd.last = now
	nd.favoured += favouredRate * dt
	nd.other += otherRate * dt
	nd.subjectCarry += subjectRate * dt
	favoured, other, denied := int64(nd.favoured), int64(nd.other), int64(nd.subjectCarry)
	nd.favoured -= float64(favoured)
	nd.other -= float64(other)
	nd.subjectCarry -= float64(denied)
	moving := p.Moving
	if moving == 0 {
		moving = p.Policies
	}
	for i := 0; i < p.Policies; i++ {
		pol := policyName(i)
		cost, turn := other, i
		if i < moving {
			turn = phase
		}
		if nd.index == turn%p.Regions {
			cost = favoured
		}
		if p.Jitter > 0 {
			cost = int64(float64(cost) * (1 + p.Jitter*(2*nd.jitter.Float64()-1)))
		}
		if cost > 0 {
			nd.rec.Record(pol, "", cost, true, false)
		}
		for s := 0; s < p.Pressured && denied > 0; s++ {
			nd.rec.Record(pol, "t"+strconv.Itoa(s), denied, false, true)
		}
	}
}

// watcher sums what is written to etcd and times how long each node takes
// to apply the sampled policies' new epochs.
type watcher struct {
	cli     *clientv3.Client
	layout  etcdlayout.Layout
	nodes   []*node
	sampled map[string]bool

	bytes       map[string]int64
	largest     int
	largestKind string
	delays      []time.Duration
	// pending are the epochs seen in etcd and not yet applied by every
	// node: policy → epoch → seen at, nodes still to apply it.
	mu      sync.Mutex
	pending []pendingEpoch
}

type pendingEpoch struct {
	policy string
	epoch  uint64
	seen   time.Time
	left   []*node
}

func newWatcher(cli *clientv3.Client, l etcdlayout.Layout, nodes []*node, sampled int) *watcher {
	w := &watcher{cli: cli, layout: l, nodes: nodes, sampled: map[string]bool{}, bytes: map[string]int64{}}
	for i := 0; i < sampled; i++ {
		w.sampled[policyName(i)] = true
	}
	return w
}

func (w *watcher) kind(key string) string {
	for _, k := range []struct{ prefix, kind string }{
		{w.layout.AllocPrefix(), "alloc"}, {w.layout.AcksPrefix(), "ack"}, {w.layout.DemandPrefix(), "demand"}, {w.layout.RegionsPrefix(), "registration"},
	} {
		if strings.HasPrefix(key, k.prefix) {
			return k.kind
		}
	}
	return "other"
}

func (w *watcher) run(ctx context.Context) error {
	var polls sync.WaitGroup
	polls.Add(1)
	go func() { defer polls.Done(); w.poll(ctx) }()
	defer polls.Wait()
	for wr := range w.cli.Watch(clientv3.WithRequireLeader(ctx), w.layout.Root(), clientv3.WithPrefix()) {
		if err := wr.Err(); err != nil {
			return err
		}
		now := time.Now()
		for _, ev := range wr.Events {
			if ev.Type != clientv3.EventTypePut {
				continue
			}
			key := string(ev.Kv.Key)
			k := w.kind(key)
			w.bytes[k] += int64(len(ev.Kv.Key) + len(ev.Kv.Value))
			if len(ev.Kv.Value) > w.largest {
				w.largest, w.largestKind = len(ev.Kv.Value), k
			}
			if k != "alloc" {
				continue
			}
			policy := etcdlayout.Name(w.layout.AllocPrefix(), key)
			if !w.sampled[policy] {
				continue
			}
			var a etcdlayout.Allocation
			if err := json.Unmarshal(ev.Kv.Value, &a); err != nil {
				continue
			}
			w.mu.Lock()
			w.pending = append(w.pending, pendingEpoch{policy: policy, epoch: a.Epoch, seen: now, left: slices.Clone(w.nodes)})
			w.mu.Unlock()
		}
	}
	return ctx.Err()
}

// poll checks every 5 ms which nodes applied the pending epochs.
func (w *watcher) poll(ctx context.Context) {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		w.mu.Lock()
		keep := w.pending[:0]
		for _, pe := range w.pending {
			left := pe.left[:0]
			for _, nd := range pe.left {
				if e, ok := nd.sync.Epoch(pe.policy); ok && e >= pe.epoch {
					w.delays = append(w.delays, now.Sub(pe.seen))
				} else {
					left = append(left, nd)
				}
			}
			if pe.left = left; len(left) > 0 {
				keep = append(keep, pe)
			}
		}
		w.pending = keep
		w.mu.Unlock()
	}
}

func (w *watcher) missed() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, pe := range w.pending {
		n += len(pe.left)
	}
	return n
}

func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(math.Ceil(q*float64(len(s))))-1)]
}

// metrics is one scrape of the coordinator's /metrics.
type metrics map[string]*dto.MetricFamily

func scrape(addr string) (metrics, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, fmt.Errorf("scale: scrape coordinator: %w", err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	m, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scale: parse coordinator metrics: %w", err)
	}
	return m, nil
}

// counter sums the family's counters whose label name has value (every
// counter when name is empty).
func (m metrics) counter(family, name, value string) float64 {
	var sum float64
	f := m[family]
	if f == nil {
		return 0
	}
	for _, c := range f.Metric {
		if name == "" || slices.ContainsFunc(c.Label, func(l *dto.LabelPair) bool { return l.GetName() == name && l.GetValue() == value }) {
			sum += c.GetCounter().GetValue()
		}
	}
	return sum
}

// quantile is the q-quantile of the histogram's observations since
// before, as the upper bound of the bucket it falls in.
func (m metrics) quantile(before metrics, family string, q float64) time.Duration {
	h := histogram(m, family)
	if h == nil {
		return 0
	}
	b := histogram(before, family)
	total := float64(h.GetSampleCount())
	if b != nil {
		total -= float64(b.GetSampleCount())
	}
	if total <= 0 {
		return 0
	}
	for i, bk := range h.Bucket {
		n := float64(bk.GetCumulativeCount())
		if b != nil {
			n -= float64(b.Bucket[i].GetCumulativeCount())
		}
		if n >= q*total {
			if math.IsInf(bk.GetUpperBound(), 1) {
				return Overflow
			}
			return time.Duration(bk.GetUpperBound() * float64(time.Second))
		}
	}
	return Overflow
}

// Overflow stands for a quantile above the histogram's largest bucket
// (16.4 s): the round took longer than the histogram can tell.
const Overflow = time.Duration(math.MaxInt64)

// histCount and histSum are the count and sum of the family's histogram
// whose label kind is kind.
func (m metrics) histCount(family, kind string) float64 {
	if h := m.labelled(family, kind); h != nil {
		return float64(h.GetSampleCount())
	}
	return 0
}

func (m metrics) histSum(family, kind string) float64 {
	if h := m.labelled(family, kind); h != nil {
		return h.GetSampleSum()
	}
	return 0
}

func (m metrics) labelled(family, kind string) *dto.Histogram {
	if m == nil || m[family] == nil {
		return nil
	}
	for _, c := range m[family].Metric {
		if slices.ContainsFunc(c.Label, func(l *dto.LabelPair) bool { return l.GetName() == "kind" && l.GetValue() == kind }) {
			return c.GetHistogram()
		}
	}
	return nil
}

func histogram(m metrics, family string) *dto.Histogram {
	if m == nil || m[family] == nil || len(m[family].Metric) == 0 {
		return nil
	}
	return m[family].Metric[0].GetHistogram()
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("scale: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// TableHeader is the markdown header of TableRow.
const TableHeader = "| policies | regions | nodes | rounds | planned/round | round p50 | round p99 | epochs | etcd bytes/round (alloc, ack, demand, other) | largest value | share visible p50 | p99 | missed | heap/node | command |\n" +
	"|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"

// TableRow is one run as a markdown row, with the command that made it.
func TableRow(r Result, command string) string {
	b := r.BytesPerRound
	return fmt.Sprintf("| %d | %d | %d | %d | %.0f | %v | %v | %d | %s (%s, %s, %s, %s) | %s (%s) | %v | %v | %d of %d | %s | `%s` |",
		r.Params.Policies, r.Params.Regions, r.Params.Regions*r.Params.NodesPerRegion, r.Rounds, r.Planned, roundTime(r.RoundP50), roundTime(r.RoundP99), r.Epochs,
		size(b["alloc"]+b["ack"]+b["demand"]+b["registration"]+b["other"]), size(b["alloc"]), size(b["ack"]), size(b["demand"]), size(b["registration"]+b["other"]),
		size(float64(r.LargestValue)), r.LargestKind, r.VisibleP50.Round(time.Millisecond), r.VisibleP99.Round(time.Millisecond),
		r.Missed, r.Visible+r.Missed, size(r.HeapPerNode), command)
}

// roundTime formats a round quantile.
func roundTime(d time.Duration) string {
	if d == Overflow {
		return "> 16s"
	}
	return d.String()
}

// size formats a byte count.
func size(b float64) string {
	switch {
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", b/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f KiB", b/(1<<10))
	}
	return fmt.Sprintf("%.0f B", b)
}
