package reliability

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/clock"
	"github.com/quotacoord/quota/internal/coordinator/coordtest"
	"github.com/quotacoord/quota/internal/demand"
	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/etcdtest"
	"github.com/quotacoord/quota/internal/faultproxy"
	"github.com/quotacoord/quota/internal/invariant"
	"github.com/quotacoord/quota/internal/logbuf"
	"github.com/quotacoord/quota/internal/policy"
	"github.com/quotacoord/quota/internal/regional"
	"github.com/quotacoord/quota/internal/regionsync"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
	"github.com/quotacoord/quota/rebalance"
)

// The etcd suite's policy: 3 regions, each guaranteed 0.2.
const etcdPolicy = `policies:
  - name: exports
    capacity: 100
    rate: 100/second
    failure_mode: closed
    min_share:
      default: 0.2
`

const (
	regionLeaseTTL = time.Second
	safeShare      = 0.2
)

// etcdEnv is an embedded etcd, regions (regionsync + a regional node on an
// in-process store, each reaching etcd through its own proxy) and
// coordinators (rebalance loops, each through its own proxy).
type etcdEnv struct {
	srv     *etcdtest.Server
	admin   *clientv3.Client
	layout  etcdlayout.Layout
	regions map[string]*region
	coords  []*coord
	logs    *logbuf.Buffer
}

type region struct {
	name  string
	proxy *faultproxy.Proxy
	sync  *regionsync.Syncer
	rec   *demand.Recorder
	adm   quotav1.AdmissionClient
	stop  func()
}

type coord struct {
	name  string
	proxy *faultproxy.Proxy
	loop  *rebalance.Loop
	stop  func() error
}

func proxyTo(t *testing.T, endpoint string) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.Start(faultproxy.Config{Target: strings.TrimPrefix(endpoint, "http://")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func newEtcdEnv(t *testing.T, regions []string, coords int) *etcdEnv {
	t.Helper()
	e := &etcdEnv{srv: etcdtest.Start(t), regions: map[string]*region{}, logs: &logbuf.Buffer{Max: 16 << 20}}
	e.admin = e.srv.Client(t)
	ctx := context.Background()
	if err := coordtest.PutPolicy(ctx, e.admin, e.layout, "exports.yaml", []byte(etcdPolicy)); err != nil {
		t.Fatal(err)
	}
	set, err := policy.Parse("exports.yaml", []byte(etcdPolicy))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < coords; i++ {
		e.coords = append(e.coords, e.startCoord(t, fmt.Sprintf("coord-%d", i)))
	}
	for _, name := range regions {
		e.regions[name] = e.startRegion(t, name, set)
	}
	return e
}

func (e *etcdEnv) logger(name string) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: name, Output: e.logs, JSONFormat: true, Level: hclog.Info})
}

func (e *etcdEnv) startCoord(t *testing.T, name string) *coord {
	t.Helper()
	c := &coord{name: name, proxy: proxyTo(t, e.srv.Endpoints[0])}
	cli, err := regionsync.Dial([]string{"http://" + c.proxy.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	l, err := rebalance.New(rebalance.Config{Client: cli, Prefix: e.layout.Prefix, Name: name, Interval: 200 * time.Millisecond,
		ReportInterval: 100 * time.Millisecond, RegionLeaseTTL: regionLeaseTTL, SkewMargin: 300 * time.Millisecond,
		SessionTTL: time.Second, Registerer: prometheus.NewRegistry(), Logger: e.logger(name)})
	if err != nil {
		t.Fatal(err)
	}
	c.loop = l
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	var once sync.Once
	var runErr error
	c.stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case runErr = <-done:
			case <-time.After(30 * time.Second):
				runErr = fmt.Errorf("coordinator %s: Run did not return", name)
			}
			cli.Close()
		})
		return runErr
	}
	t.Cleanup(func() {
		if err := c.stop(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	})
	return c
}

func (e *etcdEnv) startRegion(t *testing.T, name string, set *policy.Set) *region {
	t.Helper()
	r := &region{name: name, proxy: proxyTo(t, e.srv.Endpoints[0])}
	cli, err := regionsync.Dial([]string{"http://" + r.proxy.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	if r.rec, err = demand.New(demand.Config{}); err != nil {
		t.Fatal(err)
	}
	s, err := regionsync.New(regionsync.Config{Region: name, Client: cli, Layout: e.layout, LeaseTTL: regionLeaseTTL,
		ReportInterval: 100 * time.Millisecond, Recorder: r.rec, Logger: e.logger(name),
		MinShare: func(string) (float64, bool) { return safeShare, true }})
	if err != nil {
		t.Fatal(err)
	}
	r.sync = s
	store, err := bucket.NewMemory(bucket.MemoryConfig{Clock: clock.Real{}, MaxBuckets: 10000})
	if err != nil {
		t.Fatal(err)
	}
	local, err := bucket.NewMemory(bucket.MemoryConfig{Clock: clock.Real{}, MaxBuckets: 10000})
	if err != nil {
		t.Fatal(err)
	}
	n, err := regional.New(regional.Config{Region: name, Store: store, Local: local, Shares: s, Demand: r.rec,
		Logger: e.logger(name), StoreTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	n.SetPolicies(set)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	n.Register(gs)
	go func() { _ = gs.Serve(ln) }()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	r.adm = quotav1.NewAdmissionClient(conn)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	var once sync.Once
	r.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("region %s: Run: %v", name, err)
			}
			conn.Close()
			gs.Stop()
			cli.Close()
		})
	}
	t.Cleanup(r.stop)
	return r
}

// leader returns the leading coordinator, waiting up to d.
func (e *etcdEnv) leader(t *testing.T, d time.Duration) *coord {
	t.Helper()
	var l *coord
	waitFor(t, "a coordinator leader", d, func() bool {
		for _, c := range e.coords {
			if c.loop.IsLeader() {
				l = c
				return true
			}
		}
		return false
	})
	return l
}

// alloc reads the published allocation of exports.
func (e *etcdEnv) alloc(t *testing.T) (etcdlayout.Allocation, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := e.admin.Get(ctx, e.layout.Alloc("exports"))
	if err != nil {
		t.Fatalf("read allocation: %v", err)
	}
	if len(resp.Kvs) == 0 {
		return etcdlayout.Allocation{}, false
	}
	var a etcdlayout.Allocation
	if err := json.Unmarshal(resp.Kvs[0].Value, &a); err != nil {
		t.Fatal(err)
	}
	return a, true
}

// ready waits until every region enforces published shares.
func (e *etcdEnv) ready(t *testing.T, d time.Duration) time.Duration {
	t.Helper()
	return waitFor(t, "every region to hold published shares", d, func() bool {
		for _, r := range e.regions {
			if !r.sync.Ready() {
				return false
			}
		}
		return true
	})
}

// replay checks the budget invariant over etcd's whole history.
func (e *etcdEnv) replay(t *testing.T) invariant.Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := invariant.Replay(ctx, e.admin, e.layout)
	if err != nil {
		t.Fatalf("invariant replay: %v", err)
	}
	for _, v := range rep.Violations {
		t.Errorf("invariant violated: %v", v)
	}
	if rep.Epochs == 0 {
		t.Errorf("invariant replay saw no allocation")
	}
	return rep
}

// regionLoad sends checks of exports to every region, the first region
// the hottest, and counts what the regions decide.
type regionLoad struct {
	decided, lost counter
	bad           []string
	mu            sync.Mutex
	phase         atomic.Value // string
}

// during returns the decisions made in phase "fault" by kind.
func (l *regionLoad) during() map[string]int64 {
	out := map[string]int64{}
	for k, v := range l.decided.snapshot() {
		if kind, ok := strings.CutPrefix(k, "fault/"); ok {
			out[kind] += v
		}
	}
	return out
}

func (l *regionLoad) lostTotal() int64 {
	var n int64
	for _, v := range l.lost.snapshot() {
		n += v
	}
	return n
}

// load drives every region until ctx ends; the hot region rotates every
// second so that the coordinator keeps moving shares. The returned
// function waits for the workers.
func (e *etcdEnv) load(ctx context.Context) (*regionLoad, func()) {
	l := &regionLoad{}
	l.phase.Store("before")
	var wg sync.WaitGroup
	i := 0
	for name, r := range e.regions {
		i++
		idx := i
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; ctx.Err() == nil; k++ {
				cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				p := l.phase.Load().(string)
				pause := time.Duration(1+(idx+int(time.Now().Unix()))%3) * 3 * time.Millisecond
				resp, err := r.adm.Check(cctx, &quotav1.CheckRequest{Subject: fmt.Sprintf("tenant-%d", k%4), Policies: []string{"exports"}, Cost: 1})
				cancel()
				if err != nil {
					l.lost.add(p, 1)
					l.mu.Lock()
					if len(l.bad) < 10 {
						l.bad = append(l.bad, fmt.Sprintf("%s: %v", name, err))
					}
					l.mu.Unlock()
				} else {
					kind := "normal"
					if resp.Degraded != "" {
						kind = resp.Degraded
					}
					l.decided.add(p+"/"+kind, 1)
				}
				time.Sleep(pause)
			}
		}()
	}
	return l, wg.Wait
}
