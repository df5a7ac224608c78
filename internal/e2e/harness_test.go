package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/quotacoord/quota/internal/boundcheck"
	"github.com/quotacoord/quota/internal/clock"
	"github.com/quotacoord/quota/internal/coordinator"
	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/etcdtest"
	"github.com/quotacoord/quota/internal/faultproxy"
	"github.com/quotacoord/quota/internal/invariant"
	"github.com/quotacoord/quota/internal/redistest"
	"github.com/quotacoord/quota/internal/regional"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
	"github.com/quotacoord/quota/rebalance"
)

// The deployment every test runs. The policy is 600 per minute (10/s) per
// subject with a burst of 60 and a minimum share of 0.02 per region, so a
// region alone can reach 0.96 of the budget.
const (
	policyName  = "exports"
	globalRate  = 10.0 // 600 per minute
	minShare    = 0.02
	hotSubject  = "tenant-hot"
	rebalanceIv = time.Second
	reportIv    = 300 * time.Millisecond
	regionTTL   = 2 * time.Second
	skewMargin  = 500 * time.Millisecond
	sessionTTL  = 2 * time.Second
	// alpha and maxStep are the coordinator's demand smoothing and step
	// per round. With rebalance's defaults (0.5 and 0.3) a subject's
	// override that moves from one region to another passes 0.8 after
	// about 5.0 intervals, right at the bound; these reach it in about 3.
	alpha        = 0.8
	maxStep      = 0.5
	offeredRate  = 3 * globalRate // what a region with demand offers
	checkTimeout = 2 * time.Second
	maxEvents    = 4096 // share transitions kept per region
)

var policyDoc = []byte(`policies:
  - name: exports
    description: end-to-end test policy, 600 per minute per tenant
    capacity: 60
    rate: 600/minute
    failure_mode: closed
    min_share:
      default: 0.02
  - name: windowed
    description: the same budget as a fixed window of 50 per 5 seconds
    algorithm: fixed_window
    capacity: 50
    window: 5s
    failure_mode: closed
    min_share:
      default: 0.02
`)

// windowsDoc adds the other window algorithms, for the randomized runs.
var windowsDoc = []byte(`policies:
  - name: sliding
    description: the same budget as a sliding window counter of 50 per 5 seconds
    algorithm: sliding_window
    capacity: 50
    window: 5s
    failure_mode: closed
    min_share:
      default: 0.02
  - name: logged
    description: the same budget as a sliding log of 50 per 5 seconds
    algorithm: sliding_log
    capacity: 50
    window: 5s
    failure_mode: closed
    min_share:
      default: 0.02
`)

// windowedPolicy is the fixed-window policy every check also asks.
const windowedPolicy = "windowed"

// allPolicies are the policies of policyDoc and windowsDoc, one of each
// algorithm.
var allPolicies = []string{policyName, windowedPolicy, "sliding", "logged"}

var layout etcdlayout.Layout

// env is one deployment: etcd, coordinators and regions on loopback.
type env struct {
	t     *testing.T
	etcd  *etcdtest.Server
	cli   *clientv3.Client
	logs  *lineLog
	token string
	// tokenFile is the coordinators' operator token file.
	tokenFile string
	coords    []*coord
	// docs are the policy documents applied.
	docs [][]byte
	// regions in name order: the first node of each.
	regions []*region
	// drivers are every load driver started, the regions' and any other.
	drivers []*driver
	// nodeConfig, when set, edits every node's configuration.
	nodeConfig func(*regional.DaemonConfig)
	// admissions, when set, adds admitted decisions made outside the
	// drivers (Envoys deciding locally) to the bound check.
	admissions func() []boundcheck.Admission
}

// newEnv starts etcd, nCoords coordinators (waiting for a leader and its
// settings), applies policyDoc through the operator API, and starts one
// regional node per name, each on its own redis-server, waiting until every
// node is ready.
func newEnv(t *testing.T, nCoords int, names ...string) *env {
	t.Helper()
	return newEnvDocs(t, nCoords, [][]byte{policyDoc}, names...)
}

// newEnvDocs is newEnv applying the policy documents docs.
func newEnvDocs(t *testing.T, nCoords int, docs [][]byte, names ...string) *env {
	t.Helper()
	return newEnvWith(t, nCoords, docs, nil, names...)
}

// newEnvWith is newEnvDocs with every node's configuration edited by
// nodeConfig (nil: none).
func newEnvWith(t *testing.T, nCoords int, docs [][]byte, nodeConfig func(*regional.DaemonConfig), names ...string) *env {
	t.Helper()
	e := &env{t: t, etcd: etcdtest.Start(t), docs: docs, nodeConfig: nodeConfig}
	e.cli = e.etcd.Client(t)
	e.logs = newLineLog(t)
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "operator-tokens")
	e.tokenFile = tokenFile
	e.token = "e2e-write-token-0123456789"
	if err := os.WriteFile(tokenFile, []byte("write:"+e.token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for i := range nCoords {
		e.coords = append(e.coords, e.startCoord(fmt.Sprintf("coord-%d", i), tokenFile))
	}
	e.leader(10 * time.Second)
	e.waitFor(10*time.Second, "settings with the region lease TTL", func() bool {
		var st etcdlayout.Settings
		return e.get(layout.Settings(), &st) && st.LeaseTTLSeconds == int64(regionTTL/time.Second)
	})
	for i, doc := range docs {
		e.applyPolicy(fmt.Sprintf("e2e-%d.yaml", i), doc)
	}
	for _, n := range names {
		e.regions = append(e.regions, e.startRegion(n))
	}
	for _, r := range e.regions {
		r.waitReady(15 * time.Second)
	}
	return e
}

// waitFor polls cond every 20 ms until it holds, failing the test after d.
// It returns how long it took.
func (e *env) waitFor(d time.Duration, what string, cond func() bool) time.Duration {
	e.t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > d {
			e.t.Fatalf("after %v: no %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start)
}

// get reads key as JSON into v; false when absent.
func (e *env) get(key string, v any) bool {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := e.cli.Get(ctx, key)
	if err != nil {
		e.t.Fatalf("get %s: %v", key, err)
	}
	if len(r.Kvs) == 0 {
		return false
	}
	if err := json.Unmarshal(r.Kvs[0].Value, v); err != nil {
		e.t.Fatalf("decode %s: %v", key, err)
	}
	return true
}

// alloc returns the policy's latest allocation.
func (e *env) alloc() (etcdlayout.Allocation, bool) {
	e.t.Helper()
	var a etcdlayout.Allocation
	ok := e.get(layout.Alloc(policyName), &a)
	return a, ok
}

// allocHistory returns every allocation of policy published so far,
// oldest first (etcd is never compacted in these tests).
func (e *env) allocHistory(policy string) []etcdlayout.Allocation {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []etcdlayout.Allocation
	var rev int64
	for i := 0; i < 10000; i++ {
		var opts []clientv3.OpOption
		if rev > 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		r, err := e.cli.Get(ctx, layout.Alloc(policy), opts...)
		if err != nil {
			e.t.Fatalf("allocation history: %v", err)
		}
		if len(r.Kvs) == 0 {
			break
		}
		var a etcdlayout.Allocation
		if err := json.Unmarshal(r.Kvs[0].Value, &a); err != nil {
			e.t.Fatalf("allocation at revision %d: %v", r.Kvs[0].ModRevision, err)
		}
		out = append(out, a)
		rev = r.Kvs[0].ModRevision - 1
		if rev < 1 {
			break
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Epoch < out[j].Epoch })
	return out
}

// replay checks the invariant over etcd's whole history and logs what it
// checked.
func (e *env) replay() invariant.Report {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := invariant.Replay(ctx, e.cli, layout)
	if err != nil {
		e.t.Fatalf("invariant replay: %v", err)
	}
	e.t.Logf("invariant: %d revisions, %d epochs, %d acks checked; max Σ shares %.4f (limit 1+ε)",
		rep.Revisions, rep.Epochs, rep.Acks, rep.MaxSum)
	for _, v := range rep.Violations {
		e.t.Errorf("invariant violated: %s", v)
	}
	return rep
}

// share returns the hot subject's share of region in a.
func share(a etcdlayout.Allocation, region string) float64 {
	return subjectShare(a, hotSubject, region)
}

// subjectShare returns subject's share of region in a, as regionsync
// would enforce it (override, else default, else safe, else minimum).
func subjectShare(a etcdlayout.Allocation, subject, region string) float64 {
	if o, ok := a.Overrides[subject]; ok {
		if v, ok := o[region]; ok {
			return v
		}
	}
	if v, ok := a.Default[region]; ok {
		return v
	}
	if v, ok := a.Safe[region]; ok {
		return v
	}
	return minShare
}

// ---- coordinators ----

type coord struct {
	name   string
	proxy  *faultproxy.Proxy
	c      *coordinator.Coordinator
	cancel context.CancelFunc
	once   sync.Once
	// stopped is set once the coordinator was stopped or killed.
	stopped atomic.Bool
}

func (e *env) startCoord(name, tokenFile string) *coord {
	e.t.Helper()
	proxy := e.proxyToEtcd()
	c := e.launchCoord(name, []string{"http://" + proxy.Addr()}, tokenFile, regionTTL, sessionTTL)
	c.proxy = proxy
	return c
}

// launchCoord starts a coordinator on endpoints with the harness's
// rebalance settings, the region lease TTL and the election session TTL
// given, stopped at cleanup.
func (e *env) launchCoord(name string, endpoints []string, tokenFile string, leaseTTL, session time.Duration) *coord {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := &coord{name: name, cancel: cancel}
	var err error
	c.c, err = coordinator.Start(ctx, coordinator.Config{
		EtcdEndpoints: endpoints,
		GRPCAddr:      "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", TokenFile: tokenFile,
		Rebalance: rebalance.Config{Name: name, Interval: rebalanceIv, ReportInterval: reportIv,
			RegionLeaseTTL: leaseTTL, SkewMargin: skewMargin, SessionTTL: session,
			Alpha: alpha, MaxStep: maxStep},
		Logger: e.logs.logger(name),
	})
	if err != nil {
		cancel()
		e.t.Fatalf("start %s: %v", name, err)
	}
	e.t.Cleanup(c.stop)
	return c
}

// stop stops the coordinator (idempotent).
func (c *coord) stop() {
	c.once.Do(func() {
		c.stopped.Store(true)
		c.cancel()
		_ = c.c.Wait()
	})
}

// kill cuts the coordinator off etcd with resets (it can neither publish
// nor resign), then stops it: to the others it died.
func (c *coord) kill(t *testing.T) {
	t.Helper()
	if err := c.proxy.SetMode(faultproxy.Reset); err != nil {
		t.Fatal(err)
	}
	c.stop()
}

// leader waits for a leading coordinator and returns it.
func (e *env) leader(d time.Duration) *coord {
	e.t.Helper()
	var l *coord
	e.waitFor(d, "coordinator leader", func() bool {
		for _, c := range e.coords {
			if c.c.Loop.IsLeader() {
				l = c
				return true
			}
		}
		return false
	})
	return l
}

// applyPolicy stores the policy document doc through the operator API, as
// quotactl policy apply does.
func (e *env) applyPolicy(filename string, doc []byte) {
	e.t.Helper()
	err := e.operator(func(ctx context.Context, op quotav1.OperatorClient) error {
		_, err := op.ApplyPolicy(ctx, &quotav1.ApplyPolicyRequest{Filename: filename, Document: doc})
		return err
	})
	if err != nil {
		e.t.Fatalf("apply policy through the operator API: %v", err)
	}
}

// operator calls call with the operator API of a running coordinator,
// as an operator with a write token.
func (e *env) operator(call func(context.Context, quotav1.OperatorClient) error) error {
	e.t.Helper()
	i := slices.IndexFunc(e.coords, func(c *coord) bool { return !c.stopped.Load() })
	if i < 0 {
		e.t.Fatal("no running coordinator")
	}
	conn, err := grpc.NewClient(e.coords[i].c.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		e.t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+e.token)
	return call(ctx, quotav1.NewOperatorClient(conn))
}

func (e *env) proxyToEtcd() *faultproxy.Proxy {
	e.t.Helper()
	target := strings.TrimPrefix(e.etcd.Endpoints[0], "http://")
	p, err := faultproxy.Start(faultproxy.Config{Target: target, Listen: "127.0.0.1:0"})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = p.Close() })
	return p
}

// ---- regions ----

// region is one regional node (restartable) of a region, with its
// redis-server (shared by the region's nodes), its proxy to etcd and its
// load driver. A node runs in this process through regional.Run, or, for
// a child node, in a child process (the test binary, see runChildNode)
// that can be paused with SIGSTOP.
type region struct {
	e     *env
	name  string
	label string // the node's name in reports: the region's, numbered after the first
	child bool
	clk   *stepClock // the in-process node's clock
	redis *redistest.Server
	proxy *faultproxy.Proxy
	// endpoints, when set, are the etcd endpoints the node uses instead
	// of proxy's.
	endpoints []string

	mu      sync.Mutex
	cancel  context.CancelFunc
	kill    func() // a child node: SIGKILL
	proc    *os.Process
	done    chan error
	conn    *grpc.ClientConn
	adm     quotav1.AdmissionClient
	httpURL string
	starts  int

	load *driver
}

func (e *env) startRegion(name string) *region {
	e.t.Helper()
	r := &region{e: e, name: name, label: name, clk: &stepClock{}, redis: redistest.Start(e.t), proxy: e.proxyToEtcd()}
	e.track(r)
	return r
}

// track starts r and its driver and stops both at cleanup.
func (e *env) track(r *region) {
	e.t.Helper()
	r.load = newDriver(r, hotSubject)
	e.drivers = append(e.drivers, r.load)
	r.start()
	e.t.Cleanup(func() {
		r.load.close()
		r.stop()
	})
}

// config is the node's configuration; out receives its log and
// announcements.
func (r *region) config(out io.Writer) regional.DaemonConfig {
	endpoints := r.endpoints
	if endpoints == nil {
		endpoints = []string{"http://" + r.proxy.Addr()}
	}
	c := regional.DaemonConfig{
		Region: r.name, GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		Redis: r.redis.Addr, EtcdEndpoints: endpoints,
		// A loaded machine under -race takes longer than 5 ms per Redis
		// call; these tests show coordination, not the failure mode.
		StoreTimeout: 250 * time.Millisecond, ShutdownTimeout: 3 * time.Second, ReportInterval: reportIv,
		// Redis may be flushed in the random runs: buckets lost with it
		// start spent, not full (the bound checker counts on it).
		LossGuard: true,
		Logger:    hclog.New(&hclog.LoggerOptions{Name: "regional", Output: out}), Announce: out,
	}
	if r.e.nodeConfig != nil {
		r.e.nodeConfig(&c)
	}
	return c
}

// start runs the node (it must be stopped): regional.Run in this process,
// or the test binary as a child process for a child node.
func (r *region) start() {
	t := r.e.t
	t.Helper()
	out := newAddrWriter(r.e.logs, r.label)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var kill func()
	var proc *os.Process
	if r.child {
		cmd, err := startChildNode(r.config(nil), out)
		if err != nil {
			cancel()
			t.Fatalf("node %s: %v", r.label, err)
		}
		proc = cmd.Process
		go func() {
			err := cmd.Wait()
			if ctx.Err() != nil {
				err = nil // stopped or killed by the test
			}
			done <- err
		}()
		stop := cancel
		cancel = func() {
			stop()
			_ = cmd.Process.Signal(syscall.SIGCONT) // a paused node must run to stop
			_ = cmd.Process.Signal(syscall.SIGTERM)
		}
		kill = func() {
			stop()
			_ = cmd.Process.Kill()
		}
	} else {
		node := r.config(out)
		node.Clock = r.clk
		go func() { done <- regional.Run(ctx, node) }()
	}
	var grpcAddr, httpAddr string
	select {
	case a := <-out.addrs:
		grpcAddr, httpAddr = a[0], a[1]
	case err := <-done:
		cancel()
		t.Fatalf("node %s: regional.Run: %v", r.label, err)
	case <-time.After(15 * time.Second):
		cancel()
		t.Fatalf("node %s: no listening addresses", r.label)
	}
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	r.mu.Lock()
	r.cancel, r.kill, r.proc, r.done, r.conn, r.adm = cancel, kill, proc, done, conn, quotav1.NewAdmissionClient(conn)
	r.httpURL = "http://" + httpAddr
	r.starts++
	r.mu.Unlock()
}

// stop shuts the node down gracefully (idempotent): it stops serving,
// flushes its last demand report and revokes its lease.
func (r *region) stop() { r.halt(false) }

// halt stops the node, gracefully or, for a child node with kill, by
// SIGKILL, and waits until it is gone.
func (r *region) halt(kill bool) {
	r.mu.Lock()
	cancel, killFn, done, conn := r.cancel, r.kill, r.done, r.conn
	r.cancel, r.kill, r.proc, r.done, r.conn, r.adm = nil, nil, nil, nil, nil, nil
	r.mu.Unlock()
	if cancel == nil {
		return
	}
	if kill && killFn != nil {
		killFn()
	} else {
		cancel()
	}
	select {
	case err := <-done:
		if err != nil {
			r.e.t.Errorf("node %s: regional.Run: %v", r.label, err)
		}
	case <-time.After(20 * time.Second):
		r.e.t.Errorf("node %s: regional.Run did not return", r.label)
	}
	_ = conn.Close()
}

// crash makes the node vanish as a crash would for etcd: a child node is
// killed (SIGKILL); an in-process node's connections are reset before it
// stops, so it can neither flush nor revoke its lease, which then expires
// by its TTL.
func (r *region) crash() {
	r.e.t.Helper()
	if r.child {
		r.halt(true)
		return
	}
	if err := r.proxy.SetMode(faultproxy.Reset); err != nil {
		r.e.t.Fatal(err)
	}
	r.stop()
	if err := r.proxy.SetMode(faultproxy.Pass); err != nil {
		r.e.t.Fatal(err)
	}
}

// pause stops a child node's process (SIGSTOP) for d, then lets it run
// on (SIGCONT): every goroutine of the node, its lease keepalive among
// them, stands still meanwhile.
func (r *region) pause(d time.Duration) {
	r.e.t.Helper()
	r.mu.Lock()
	proc := r.proc
	r.mu.Unlock()
	if proc == nil {
		r.e.t.Fatalf("node %s: no process to pause", r.label)
	}
	if err := proc.Signal(syscall.SIGSTOP); err != nil {
		r.e.t.Fatalf("node %s: SIGSTOP: %v", r.label, err)
	}
	time.Sleep(d)
	if err := proc.Signal(syscall.SIGCONT); err != nil {
		r.e.t.Fatalf("node %s: SIGCONT: %v", r.label, err)
	}
}

func (r *region) client() quotav1.AdmissionClient {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.adm
}

// ready reports whether /readyz answers 200 (policies and shares loaded).
func (r *region) ready() bool {
	r.mu.Lock()
	u := r.httpURL
	r.mu.Unlock()
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get(u + "/readyz")
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func (r *region) waitReady(d time.Duration) {
	r.e.t.Helper()
	r.e.waitFor(d, "readiness of node "+r.label, r.ready)
}

// leaseRemaining returns the lease of the region's (one) node registration and the seconds
// etcd says it has left (rounded down by etcd).
func (r *region) leaseRemaining() (clientv3.LeaseID, int64) {
	t := r.e.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	g, err := r.e.cli.Get(ctx, layout.RegionNodes(r.name), clientv3.WithPrefix())
	if err != nil || len(g.Kvs) == 0 {
		t.Fatalf("registration of %s: %v (found %v)", r.name, err, err == nil && len(g.Kvs) > 0)
	}
	id := clientv3.LeaseID(g.Kvs[0].Lease)
	ttl, err := r.e.cli.TimeToLive(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return id, ttl.TTL
}

// stepClock is a node's clock: the system clock with its wall reading
// offset by what the test stepped it, and the system's monotonic reading,
// which a step does not move (as NTP stepping a host's clock).
type stepClock struct{ offset atomic.Int64 }

// Now returns the system time plus the offset stepped so far.
func (c *stepClock) Now() time.Time { return time.Now().Add(time.Duration(c.offset.Load())) }

// Mono returns the system's monotonic reading.
func (c *stepClock) Mono() time.Duration { return clock.Real{}.Mono() }

// step moves the wall reading by d (negative: back).
func (c *stepClock) step(d time.Duration) { c.offset.Add(int64(d)) }

// ---- load ----

// driver sends checks of one subject to one node at a set rate, one at a
// time, asking each of its policies in a call of its own, and counts the
// decisions of the exports policy. The node it sends to can change
// (a subject moving between regions).
type driver struct {
	subject string
	target  atomic.Pointer[region]
	// policies are asked in this order on every tick.
	policies atomic.Pointer[[]string]
	rate     atomic.Uint64 // float64 bits, checks per second
	stopCh   chan struct{}
	wg       sync.WaitGroup

	allowed, denied, degraded, failed atomic.Int64

	mu        sync.Mutex
	lastShare float64
	events    []shareEvent // share transitions, at most maxEvents
	// admitted are the admitted decisions of every policy, at most
	// maxAdmissions, for the bound check.
	admitted []boundcheck.Admission
	// offers are when each check was sent, by policy, at most
	// maxAdmissions per policy: what an ideal limiter is offered.
	offers map[string][]time.Time
}

// maxAdmissions bounds the decisions a driver records.
const maxAdmissions = 200_000

// shareEvent is a decision whose share differs from the one before.
type shareEvent struct {
	at    time.Time
	share float64
}

// counts is a snapshot of a driver's counters.
type counts struct {
	at                                time.Time
	allowed, denied, degraded, failed int64
}

// newDriver starts a driver of subject at r asking the fixed-window and
// the exports policy, idle until setRate.
func newDriver(r *region, subject string) *driver {
	d := &driver{subject: subject, stopCh: make(chan struct{}), lastShare: -1, offers: map[string][]time.Time{}}
	d.target.Store(r)
	d.setPolicies(windowedPolicy, policyName)
	d.wg.Add(1)
	go d.run()
	return d
}

func (d *driver) setRate(perSecond float64) { d.rate.Store(math.Float64bits(perSecond)) }

func (d *driver) setPolicies(names ...string) { d.policies.Store(&names) }

func (d *driver) snapshot() counts {
	return counts{at: time.Now(), allowed: d.allowed.Load(), denied: d.denied.Load(),
		degraded: d.degraded.Load(), failed: d.failed.Load()}
}

// share returns the share of the last decision (-1 before any).
func (d *driver) share() float64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lastShare
}

// firstShareAfter returns when a decision after t first had a share
// satisfying ok.
func (d *driver) firstShareAfter(t time.Time, ok func(float64) bool) (time.Time, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, ev := range d.events {
		if !ev.at.Before(t) && ok(ev.share) {
			return ev.at, true
		}
	}
	return time.Time{}, false
}

func (d *driver) close() {
	select {
	case <-d.stopCh:
	default:
		close(d.stopCh)
	}
	d.wg.Wait()
}

func (d *driver) run() {
	defer d.wg.Done()
	next := time.Now()
	for {
		rate := math.Float64frombits(d.rate.Load())
		var wait time.Duration
		if rate <= 0 {
			wait, next = 20*time.Millisecond, time.Now()
		} else {
			if now := time.Now(); now.After(next) {
				d.check()
				next = next.Add(time.Duration(float64(time.Second) / rate))
				if time.Since(next) > time.Second {
					next = time.Now() // fell behind: do not burst to catch up
				}
			}
			wait = time.Until(next)
		}
		t := time.NewTimer(max(wait, time.Millisecond))
		select {
		case <-d.stopCh:
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// check asks each policy once, in a call of its own.
func (d *driver) check() {
	r := d.target.Load()
	adm := r.client()
	for _, p := range *d.policies.Load() {
		if adm == nil {
			if p == policyName {
				d.failed.Add(1)
			}
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), checkTimeout)
		sent := time.Now()
		resp, err := adm.Check(ctx, &quotav1.CheckRequest{Subject: d.subject, Policies: []string{p}})
		cancel()
		d.mu.Lock()
		if len(d.offers[p]) < maxAdmissions {
			d.offers[p] = append(d.offers[p], sent)
		}
		d.mu.Unlock()
		ok := err == nil && len(resp.Policies) == 1
		if ok {
			d.record(r, p, resp, sent)
		}
		if p != policyName {
			continue
		}
		switch {
		case !ok:
			d.failed.Add(1)
		case resp.Degraded != "":
			d.degraded.Add(1)
		case resp.Allowed:
			d.allowed.Add(1)
		default:
			d.denied.Add(1)
		}
	}
}

// record notes a decision of policy by node r, asked at sent and answered
// now: an admission for the bound check, and a share transition of the
// exports policy.
func (d *driver) record(r *region, policy string, resp *quotav1.CheckResponse, sent time.Time) {
	now, s := time.Now(), resp.Policies[0].Share
	d.mu.Lock()
	defer d.mu.Unlock()
	if resp.Allowed && len(d.admitted) < maxAdmissions {
		d.admitted = append(d.admitted, boundcheck.Admission{Policy: policy, Subject: d.subject, Region: r.name, Node: r.label,
			Sent: sent, At: now, Cost: 1, Share: s})
	}
	if policy == policyName && s != d.lastShare {
		d.lastShare = s
		if len(d.events) < maxEvents {
			d.events = append(d.events, shareEvent{at: now, share: s})
		}
	}
}

// ---- logs ----

// lineLog collects every component's log lines in one file and prints its
// tail when the test fails.
type lineLog struct {
	mu sync.Mutex
	f  *os.File
}

func newLineLog(t *testing.T) *lineLog {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "e2e.log"))
	if err != nil {
		t.Fatal(err)
	}
	l := &lineLog{f: f}
	t.Cleanup(func() {
		if t.Failed() {
			l.mu.Lock()
			b, _ := os.ReadFile(f.Name())
			l.mu.Unlock()
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			t.Logf("last log lines (of %d):\n%s", len(lines), strings.Join(lines[max(0, len(lines)-80):], "\n"))
		}
		_ = f.Close()
	})
	return l
}

func (l *lineLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.Write(p)
}

func (l *lineLog) logger(name string) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: name, Output: l, Level: hclog.Info})
}

// addrWriter is a node's stdout: it passes every line to the log and
// reports the addresses regional.Run prints when it listens.
type addrWriter struct {
	log    io.Writer
	prefix string
	mu     sync.Mutex
	buf    bytes.Buffer
	grpc   string
	sent   bool
	addrs  chan [2]string
}

func newAddrWriter(log io.Writer, name string) *addrWriter {
	return &addrWriter{log: log, prefix: name + ": ", addrs: make(chan [2]string, 1)}
}

func (w *addrWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	for {
		line, err := w.buf.ReadString('\n')
		if err != nil {
			// An unfinished line waits for the rest (bounded: a node
			// writes whole lines).
			w.buf.Reset()
			w.buf.WriteString(line)
			break
		}
		_, _ = io.WriteString(w.log, w.prefix+line)
		if a, ok := strings.CutPrefix(strings.TrimSpace(line), "grpc listening on "); ok {
			w.grpc = a
		}
		if a, ok := strings.CutPrefix(strings.TrimSpace(line), "http listening on "); ok && !w.sent {
			w.sent = true
			w.addrs <- [2]string{w.grpc, a}
		}
	}
	return len(p), nil
}
