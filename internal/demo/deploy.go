package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/faultproxy"
	"github.com/quotacoord/quota/internal/regional"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
	"github.com/quotacoord/quota/sim"
)

// DeployConfig says what Deploy starts. Zero durations take the defaults
// listed; zero allocator parameters take package rebalance's.
type DeployConfig struct {
	// Regions are the regions' names, one node (and redis-server) each.
	Regions []string
	// Policies is a policy document (own YAML format) stored in etcd.
	Policies []byte
	// Embedded forces the in-process store even when redis-server exists.
	Embedded bool
	// RebalanceInterval is the coordinator's (default 1s); ReportInterval
	// the regions' demand report interval (default 500ms); LeaseTTL the
	// regions' lease (default 3s); SkewMargin the coordinator's wait after
	// a lease expired (default 500ms).
	RebalanceInterval, ReportInterval, LeaseTTL, SkewMargin time.Duration
	// MaxStep, DeadBand and Alpha go to the rebalance loop.
	MaxStep, DeadBand, Alpha float64
	// StoreTimeout is the nodes' time budget of one store call; default
	// 100ms (a loaded laptop, or -race, can take longer than the
	// production 5 ms on loopback; the demo shows coordination, not the
	// failure mode).
	StoreTimeout time.Duration
	// Say receives one line per thing started; nil discards them.
	Say func(format string, a ...any)
}

func (c *DeployConfig) defaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.RebalanceInterval, time.Second)
	def(&c.ReportInterval, 500*time.Millisecond)
	def(&c.LeaseTTL, 3*time.Second)
	def(&c.SkewMargin, 500*time.Millisecond)
	def(&c.StoreTimeout, 100*time.Millisecond)
	if c.Say == nil {
		c.Say = func(string, ...any) {}
	}
}

// Deployment is a running coordinator and one regional node per region,
// all on loopback. Close stops everything Deploy started.
type Deployment struct {
	// Store is "redis-server" or "embedded".
	Store string
	// Regions, GRPC and HTTP are the regions and their nodes' addresses.
	Regions    []string
	GRPC, HTTP []string
	// Coord is the coordinator.
	Coord *Coordinator
	// LogPath is the deployment's log file (removed by Close).
	LogPath string
	// Checks sends checks to the nodes over their real gRPC API.
	Checks *GRPCChecker

	cfg     DeployConfig
	dir     string
	logf    *os.File
	log     io.Writer
	redises []*Redis
	nodes   *nodes
	// proxies stand between each node and etcd, so a region can be cut
	// off from the control plane (CrashRegion).
	proxies []*faultproxy.Proxy
}

// Deploy starts, on loopback: a redis-server per region (when one is
// installed or installable and cfg.Embedded is false), the coordinator
// (embedded etcd and the rebalance loop), cfg.Policies in etcd, and a
// regional node per region (regional.Run in this process), and waits
// until every node is ready. On error everything started is stopped. It
// starts goroutines and processes that Close stops.
func Deploy(ctx context.Context, cfg DeployConfig) (d *Deployment, err error) {
	cfg.defaults()
	if len(cfg.Regions) == 0 || len(cfg.Regions) > sim.MaxScenarioRegions {
		return nil, fmt.Errorf("demo: %d regions, want 1 to %d", len(cfg.Regions), sim.MaxScenarioRegions)
	}
	d = &Deployment{Store: "embedded", Regions: cfg.Regions, cfg: cfg}
	defer func() {
		if err != nil {
			d.Close()
			d = nil
		}
	}()
	if d.dir, err = os.MkdirTemp("", "quota-demo-"); err != nil {
		return d, fmt.Errorf("demo: temp dir: %w", err)
	}
	if d.logf, err = os.Create(filepath.Join(d.dir, "deployment.log")); err != nil {
		return d, fmt.Errorf("demo: log file: %w", err)
	}
	d.LogPath = d.logf.Name()
	d.log = &lockedWriter{w: d.logf}
	say := cfg.Say

	if !cfg.Embedded {
		root, _ := os.Getwd()
		if bin := RedisServer(root, func(s string) { say("store: %s", s) }); bin != "" {
			for _, region := range cfg.Regions {
				rd := filepath.Join(d.dir, "redis-"+region)
				if err := os.Mkdir(rd, 0o755); err != nil {
					return d, fmt.Errorf("demo: %w", err)
				}
				r, err := StartRedis(ctx, bin, rd)
				if err != nil {
					return d, err
				}
				d.redises = append(d.redises, r)
			}
			d.Store = "redis-server"
		}
	}
	if d.Store == "redis-server" {
		var b strings.Builder
		for i, r := range d.redises {
			fmt.Fprintf(&b, " %s=%s(pid %d)", cfg.Regions[i], r.Addr, r.PID())
		}
		say("store: a real redis-server per region:%s", b.String())
	} else {
		say("store: the embedded in-process store (redis-server not available)")
	}

	// The embedded etcd listens on a port that was free a moment ago;
	// another process may take it first, so try a few.
	for attempt := 1; ; attempt++ {
		d.Coord, err = StartCoordinator(ctx, CoordinatorConfig{Dir: filepath.Join(d.dir, "etcd"+strconv.Itoa(attempt)),
			RebalanceInterval: cfg.RebalanceInterval, ReportInterval: cfg.ReportInterval, RegionLeaseTTL: cfg.LeaseTTL,
			SkewMargin: cfg.SkewMargin, MaxStep: cfg.MaxStep, DeadBand: cfg.DeadBand, Alpha: cfg.Alpha, Log: d.log})
		if err == nil {
			break
		}
		if attempt == 3 || !strings.Contains(err.Error(), "address already in use") {
			return d, err
		}
		say("coordinator: %v; trying other ports", err)
	}
	say("coordinator: operator API %s (token file %s), embedded etcd %s, metrics http://%s/metrics",
		d.Coord.GRPCAddr, d.Coord.TokenFile, d.Coord.EtcdAddr, d.Coord.HTTPAddr)
	if err := d.Coord.PutPolicy(ctx, "demo.yaml", cfg.Policies); err != nil {
		return d, err
	}
	// A node takes its lease TTL from the settings the leader publishes;
	// one started before them would take the 10 s default.
	if err := d.waitSettings(ctx); err != nil {
		return d, err
	}
	for range cfg.Regions {
		p, err := faultproxy.Start(faultproxy.Config{Target: d.Coord.EtcdAddr})
		if err != nil {
			return d, fmt.Errorf("demo: etcd proxy: %w", err)
		}
		d.proxies = append(d.proxies, p)
	}
	d.nodes, err = startNodes(ctx, d, cfg)
	if err != nil {
		return d, err
	}
	d.GRPC, d.HTTP = d.nodes.grpc, d.nodes.http
	if d.Checks, err = DialRegions(d.GRPC); err != nil {
		return d, err
	}
	return d, nil
}

// waitSettings waits until the coordinator published its settings.
func (d *Deployment) waitSettings(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	key := etcdlayout.Layout{}.Settings()
	for {
		resp, err := d.Coord.Client.Get(ctx, key)
		if err == nil && len(resp.Kvs) > 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("demo: the coordinator published no settings: %w", errors.Join(err, ctx.Err()))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// StopRegion stops region's node (a real failover: its lease then
// expires); false if it was not running.
func (d *Deployment) StopRegion(region string) bool {
	if d.nodes == nil {
		return false
	}
	return d.nodes.stop(region)
}

// CrashRegion cuts region's node off from etcd (its connections hang, as
// in a partition or a crash): the node keeps its shares until its lease
// TTL runs out and then falls back to its safe share; the coordinator
// hands the share over once the lease expired plus the skew margin. A
// graceful StopRegion instead revokes the lease at once.
func (d *Deployment) CrashRegion(region string) error {
	return d.setProxy(region, faultproxy.Blackhole)
}

// HealRegion reconnects region's node to etcd.
func (d *Deployment) HealRegion(region string) error {
	return d.setProxy(region, faultproxy.Pass)
}

func (d *Deployment) setProxy(region string, m faultproxy.Mode) error {
	for i, r := range d.Regions {
		if r == region && i < len(d.proxies) {
			if err := d.proxies[i].SetMode(m); err != nil {
				return fmt.Errorf("demo: region %s: %w", region, err)
			}
			return nil
		}
	}
	return fmt.Errorf("demo: no region %q", region)
}

// Running says whether region's node runs.
func (d *Deployment) Running(region string) bool {
	return d.nodes != nil && d.nodes.running(region)
}

// Close stops the nodes, the coordinator and the redis-servers, and
// removes the temporary directory. It is safe to call more than once.
func (d *Deployment) Close() {
	if d.Checks != nil {
		d.Checks.Close()
		d.Checks = nil
	}
	// Heal partitions first so that nodes stop gracefully and fast.
	for _, p := range d.proxies {
		_ = p.SetMode(faultproxy.Pass)
	}
	if d.nodes != nil {
		d.nodes.stopAll()
	}
	for _, p := range d.proxies {
		_ = p.Close()
	}
	d.proxies = nil
	if d.Coord != nil {
		d.Coord.Stop()
		d.Coord = nil
	}
	for _, r := range d.redises {
		r.Stop()
	}
	d.redises = nil
	if d.logf != nil {
		_ = d.logf.Close()
		d.logf = nil
	}
	if d.dir != "" {
		_ = os.RemoveAll(d.dir)
		d.dir = ""
	}
}

// Settle waits until policy's published allocation is stable with every
// region's default share within tol of want (one share per region, in
// Regions order), and returns the first instant after now+lead at which a
// coordinator round is due. Rounds come every RebalanceInterval after the
// last full round that published (a shrink, or the first epoch; a growth
// after acknowledgements is published off the round), so a replay that
// starts there sees rounds at the simulator's offsets, k·RebalanceInterval.
func (d *Deployment) Settle(ctx context.Context, policy string, want []float64, tol float64, lead time.Duration) (time.Time, error) {
	if len(want) != len(d.Regions) {
		return time.Time{}, fmt.Errorf("demo: %d shares for %d regions", len(want), len(d.Regions))
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var ref time.Time
	var last etcdlayout.Allocation
	// A fresh etcd keeps the key's whole history: watch it from the start.
	for wr := range d.Coord.Client.Watch(ctx, etcdlayout.Layout{}.Alloc(policy), clientv3.WithRev(1)) {
		if err := wr.Err(); err != nil {
			return time.Time{}, fmt.Errorf("demo: watch allocation of %s: %w", policy, err)
		}
		for _, ev := range wr.Events {
			var a etcdlayout.Allocation
			if ev.Kv == nil || json.Unmarshal(ev.Kv.Value, &a) != nil {
				continue
			}
			if a.Phase == etcdlayout.PhaseShrink || a.Epoch == 1 {
				ref = a.PublishedAt
			}
			last = a
		}
		if ref.IsZero() || last.Phase != etcdlayout.PhaseStable {
			continue
		}
		settled := true
		for i, r := range d.Regions {
			if v, ok := last.Default[r]; !ok || math.Abs(v-want[i]) > tol {
				settled = false
			}
		}
		if !settled {
			continue
		}
		iv := d.cfg.RebalanceInterval
		t := ref
		if earliest := time.Now().Add(lead); t.Before(earliest) {
			t = t.Add(iv * ((earliest.Sub(t) + iv - 1) / iv))
		}
		return t, nil
	}
	return time.Time{}, fmt.Errorf("demo: allocation of %s did not settle at %v ± %v: %w (last %v)", policy, want, tol, context.Cause(ctx), last.Default)
}

// WatchShares calls fn with the share each region enforces for subject
// under policy (its override, else the default; 0 for a region the
// allocation does not list) every time the coordinator publishes, until
// ctx is done. It runs in the caller's goroutine.
func (d *Deployment) WatchShares(ctx context.Context, policy, subject string, fn func([]float64)) {
	for wr := range d.Coord.Client.Watch(ctx, etcdlayout.Layout{}.Alloc(policy), clientv3.WithRev(1)) {
		for _, ev := range wr.Events {
			var a etcdlayout.Allocation
			if ev.Kv == nil || json.Unmarshal(ev.Kv.Value, &a) != nil {
				continue
			}
			out := make([]float64, len(d.Regions))
			for i, r := range d.Regions {
				out[i] = a.Default[r]
				if v, ok := a.Overrides[subject][r]; ok {
					out[i] = v
				}
			}
			fn(out)
		}
	}
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// nodes are the regional nodes, run in this process by regional.Run.
type nodes struct {
	mu      sync.Mutex
	names   []string
	grpc    []string
	http    []string
	cancels []context.CancelFunc
	done    []chan error
}

func startNodes(ctx context.Context, d *Deployment, cfg DeployConfig) (*nodes, error) {
	n := &nodes{names: cfg.Regions}
	for i, region := range cfg.Regions {
		gp, err := FreePort()
		if err != nil {
			n.stopAll()
			return nil, err
		}
		hp, err := FreePort()
		if err != nil {
			n.stopAll()
			return nil, err
		}
		g, h := "127.0.0.1:"+strconv.Itoa(gp), "127.0.0.1:"+strconv.Itoa(hp)
		node := regional.DaemonConfig{Region: region, GRPCAddr: g, HTTPAddr: h,
			EtcdEndpoints: []string{"http://" + d.proxies[i].Addr()}, ReportInterval: cfg.ReportInterval, StoreTimeout: cfg.StoreTimeout,
			Logger: hclog.New(&hclog.LoggerOptions{Name: "regional", Output: d.log}), Announce: d.log}
		if len(d.redises) > i {
			node.Redis = d.redises[i].Addr
		}
		nctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- regional.Run(nctx, node) }()
		n.grpc, n.http = append(n.grpc, g), append(n.http, h)
		n.cancels, n.done = append(n.cancels, cancel), append(n.done, done)
	}
	deadline := time.Now().Add(30 * time.Second)
	for i, h := range n.http {
		for {
			select {
			case err := <-n.done[i]:
				n.done[i] <- err
				n.stopAll()
				return nil, fmt.Errorf("demo: region %s's node exited at start: %v", cfg.Regions[i], err)
			default:
			}
			resp, err := http.Get("http://" + h + "/readyz")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				n.stopAll()
				return nil, fmt.Errorf("demo: region %s's node not ready on http://%s/readyz: %v", cfg.Regions[i], h, errors.Join(err, ctx.Err()))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return n, nil
}

// stop stops region's node and waits for it; false if it was not running.
func (n *nodes) stop(region string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	for i, r := range n.names {
		if r == region && i < len(n.cancels) && n.cancels[i] != nil {
			n.cancels[i]()
			<-n.done[i]
			n.cancels[i] = nil
			return true
		}
	}
	return false
}

func (n *nodes) running(region string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	for i, r := range n.names {
		if r == region {
			return i < len(n.cancels) && n.cancels[i] != nil
		}
	}
	return false
}

func (n *nodes) stopAll() {
	for _, r := range n.names {
		n.stop(r)
	}
}

// GRPCChecker sends checks over the regions' real gRPC Admission API. It
// is safe for concurrent use.
type GRPCChecker struct {
	conns    []*grpc.ClientConn
	clients  []quotav1.AdmissionClient
	degraded atomic.Int64
}

// DialRegions connects to the nodes at addrs, one per region index.
func DialRegions(addrs []string) (*GRPCChecker, error) {
	c := &GRPCChecker{}
	for _, a := range addrs {
		conn, err := grpc.NewClient(a, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("demo: dial %s: %w", a, err)
		}
		c.conns = append(c.conns, conn)
		c.clients = append(c.clients, quotav1.NewAdmissionClient(conn))
	}
	return c, nil
}

// Check implements Checker.
func (c *GRPCChecker) Check(ctx context.Context, region int, policy, subject string, cost int64) (bool, float64, error) {
	if region < 0 || region >= len(c.clients) {
		return false, 0, fmt.Errorf("demo: region %d of %d", region, len(c.clients))
	}
	resp, err := c.clients[region].Check(ctx, &quotav1.CheckRequest{Subject: subject, Policies: []string{policy}, Cost: cost})
	if err != nil {
		return false, 0, err
	}
	if resp.Degraded != "" {
		c.degraded.Add(1)
	}
	share := 0.0
	if len(resp.Policies) > 0 {
		share = resp.Policies[0].Share
	}
	return resp.Allowed, share, nil
}

// Degraded counts decisions a node's failure mode made instead of its
// store.
func (c *GRPCChecker) Degraded() int64 { return c.degraded.Load() }

// Close closes the connections.
func (c *GRPCChecker) Close() {
	for _, conn := range c.conns {
		_ = conn.Close()
	}
	c.conns, c.clients = nil, nil
}
