package regionsync

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/quotacoord/quota/internal/demand"
	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/etcdtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var lay etcdlayout.Layout

func putJSON(t *testing.T, c *clientv3.Client, key string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.Put(ctx, key, string(b)); err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
}

func getJSON(t *testing.T, c *clientv3.Client, key string, v any) (found bool, lease int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := c.Get(ctx, key)
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	if len(r.Kvs) == 0 {
		return false, 0
	}
	if err := json.Unmarshal(r.Kvs[0].Value, v); err != nil {
		t.Fatalf("decode %s: %v", key, err)
	}
	return true, r.Kvs[0].Lease
}

// getAck reads and merges the acknowledgement shards of node; lease is
// the first shard's.
func getAck(t *testing.T, c *clientv3.Client, region, node string, a *etcdlayout.Ack) (found bool, lease int64) {
	t.Helper()
	var merged *etcdlayout.Ack
	lease = getShards(t, c, lay.NodeAcks(region, node), func(key string, v []byte) error {
		_, _, _, sh, err := lay.DecodeAck(key, v)
		merged = etcdlayout.MergeAck(merged, sh)
		return err
	})
	if merged == nil {
		return false, 0
	}
	*a = *merged
	return true, lease
}

// getDemand reads and merges the demand shards of node; lease is the
// first shard's.
func getDemand(t *testing.T, c *clientv3.Client, region, node string, d *etcdlayout.DemandReport) (found bool, lease int64) {
	t.Helper()
	var merged *etcdlayout.DemandReport
	lease = getShards(t, c, lay.NodeDemands(region, node), func(key string, v []byte) error {
		_, _, id, sh, err := lay.DecodeDemand(key, v)
		merged = etcdlayout.MergeDemand(merged, id, sh)
		return err
	})
	if merged == nil {
		return false, 0
	}
	*d = *merged
	return true, lease
}

// getShards calls decode on every key below prefix and returns the first
// key's lease.
func getShards(t *testing.T, c *clientv3.Client, prefix string, decode func(key string, v []byte) error) (lease int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := c.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatalf("get %s: %v", prefix, err)
	}
	for _, kv := range r.Kvs {
		if err := decode(string(kv.Key), kv.Value); err != nil {
			t.Fatalf("decode %s: %v", kv.Key, err)
		}
		if lease == 0 {
			lease = kv.Lease
		}
	}
	return lease
}

// waitFor polls cond every 20 ms until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > d {
			t.Fatalf("after %v: %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start)
}

func alloc(policy string, epoch uint64, def, safe map[string]float64, over map[string]map[string]float64) etcdlayout.Allocation {
	return etcdlayout.Allocation{Policy: policy, Epoch: epoch, Phase: etcdlayout.PhaseStable, Default: def, Safe: safe, Overrides: over}
}

// testNode is the node id start gives a Syncer that names none.
const testNode = "n1"

// start runs a Syncer for region against srv until the test ends.
func start(t *testing.T, srv *etcdtest.Server, cfg Config) (*Syncer, context.CancelFunc) {
	t.Helper()
	return startOn(t, srv.Endpoints, cfg)
}

// startOn is start with the syncer's client dialed to endpoints.
func startOn(t *testing.T, endpoints []string, cfg Config) (*Syncer, context.CancelFunc) {
	t.Helper()
	c, err := Dial(endpoints)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Client = c
	if cfg.Region == "" {
		cfg.Region = "eu"
	}
	if cfg.Node == "" {
		cfg.Node = testNode
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(func() {
		stop()
		_ = c.Close()
	})
	return s, stop
}

func TestConfigDefaults(t *testing.T) {
	c := &clientv3.Client{}
	tests := []struct {
		name    string
		in      Config
		check   func(Config) bool
		wantErr string
	}{
		{name: "defaults", in: Config{Region: "eu", Client: c}, check: func(c Config) bool {
			return c.LeaseTTL == 10*time.Second && c.ReportInterval == 5*time.Second && c.RequestTimeout == 2*time.Second &&
				c.MaxPolicies == DefaultMaxPolicies && c.MaxOverrides == DefaultMaxOverrides && c.Clock != nil && c.Logger != nil &&
				etcdlayout.ValidName(c.Node)
		}},
		{name: "node id kept", in: Config{Region: "eu", Client: c, Node: "eu-1.pod_7"}, check: func(c Config) bool { return c.Node == "eu-1.pod_7" }},
		{name: "bad node id", in: Config{Region: "eu", Client: c, Node: "a/b"}, wantErr: "node id"},
		{name: "node id too long", in: Config{Region: "eu", Client: c, Node: strings.Repeat("n", 65)}, wantErr: "node id"},
		{name: "ttl rounds up, timeout capped at a third", in: Config{Region: "eu", Client: c, LeaseTTL: 1500 * time.Millisecond}, check: func(c Config) bool {
			return c.LeaseTTL == 2*time.Second && c.RequestTimeout == 2*time.Second/3
		}},
		{name: "no client", in: Config{Region: "eu"}, wantErr: "no etcd client"},
		{name: "no region", in: Config{Client: c}, wantErr: "region"},
		{name: "bad region", in: Config{Client: c, Region: "eu/west"}, wantErr: "region"},
		{name: "negative ttl", in: Config{Region: "eu", Client: c, LeaseTTL: -time.Second}, wantErr: "lease TTL"},
		{name: "report too often", in: Config{Region: "eu", Client: c, ReportInterval: time.Millisecond}, wantErr: "report interval"},
		{name: "negative max", in: Config{Region: "eu", Client: c, MaxPolicies: -1}, wantErr: "MaxPolicies"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.in.withDefaults()
			if tt.wantErr != "" {
				if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want ErrInvalidConfig about %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || !tt.check(got) {
				t.Fatalf("got %+v, %v", got, err)
			}
		})
	}
}

func TestCompileShares(t *testing.T) {
	def := map[string]float64{"eu": 0.6, "us": 0.4}
	safe := map[string]float64{"eu": 0.1, "us": 0.1}
	over := map[string]map[string]float64{"hot": {"eu": 0.9, "us": 0.1}, "us-only": {"us": 1}}
	tests := []struct {
		name    string
		a       any
		lost    bool
		subject string
		want    float64
		wantErr bool
	}{
		{name: "default", a: alloc("p", 1, def, safe, over), subject: "cold", want: 0.6},
		{name: "override", a: alloc("p", 1, def, safe, over), subject: "hot", want: 0.9},
		{name: "override for another region only", a: alloc("p", 1, def, safe, over), subject: "us-only", want: 0.6},
		{name: "lost: safe even with override", a: alloc("p", 1, def, safe, over), lost: true, subject: "hot", want: 0.1},
		{name: "region missing from default: safe", a: alloc("p", 1, map[string]float64{"us": 1}, safe, nil), subject: "x", want: 0.1},
		{name: "region missing everywhere: policy minimum", a: alloc("p", 1, map[string]float64{"us": 1}, nil, nil), subject: "x", want: 0.05},
		{name: "overcommit allows above 1", a: etcdlayout.Allocation{Policy: "p", Default: map[string]float64{"eu": 1.1}, Overcommit: 0.2}, subject: "x", want: 1.1},
		{name: "above 1+ε", a: alloc("p", 1, map[string]float64{"eu": 1.01}, safe, nil), wantErr: true},
		{name: "negative override", a: alloc("p", 1, def, safe, map[string]map[string]float64{"s": {"eu": -0.1}}), wantErr: true},
		{name: "safe above 1", a: alloc("p", 1, def, map[string]float64{"eu": 2}, nil), wantErr: true},
		{name: "wrong policy name", a: alloc("q", 1, def, safe, nil), wantErr: true},
		{name: "negative overcommit", a: etcdlayout.Allocation{Policy: "p", Overcommit: -1}, wantErr: true},
		{name: "not an allocation", a: []int{1}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			raw, _ := json.Marshal(tt.a)
			ps, err := compile("eu", "p", raw, 10)
			if tt.wantErr {
				if !errors.Is(err, ErrBadAllocation) {
					t.Fatalf("err = %v, want ErrBadAllocation", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			s, err := New(Config{Region: "eu", Client: &clientv3.Client{}, MinShare: func(string) (float64, bool) { return 0.05, true }})
			if err != nil {
				t.Fatal(err)
			}
			s.tab.Store(build(tt.lost, sharesOf(map[string]*policyShares{"p": ps}), nil))
			s.lastOK.Store(int64(s.monoNow())) // a lease just renewed
			if got := s.Share("p", tt.subject); got != tt.want {
				t.Fatalf("Share = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestSafeSharesBeforeEtcd(t *testing.T) {
	mins := map[string]float64{"exports": 0.25}
	s, err := New(Config{Region: "eu", Client: &clientv3.Client{}, MinShare: func(p string) (float64, bool) {
		m, ok := mins[p]
		return m, ok
	}})
	if err != nil {
		t.Fatal(err)
	}
	if s.Ready() || !s.Lost() {
		t.Fatal("ready before any etcd read")
	}
	if got := s.Share("exports", "a"); got != 0.25 {
		t.Fatalf("share before allocation = %v, want the minimum 0.25 (never 1)", got)
	}
	if got := s.Share("unknown", "a"); got != 0 {
		t.Fatalf("share of unknown policy = %v, want 0", got)
	}
	if err := s.Flush(context.Background()); err != nil {
		t.Fatalf("flush without recorder: %v", err)
	}
}

func TestSharesAppliedAndAcked(t *testing.T) {
	srv := etcdtest.Start(t)
	c := srv.Client(t)
	def := map[string]float64{"eu": 0.6, "us": 0.4}
	safe := map[string]float64{"eu": 0.1, "us": 0.1}
	putJSON(t, c, lay.Alloc("exports"), alloc("exports", 1, def, safe, map[string]map[string]float64{"hot": {"eu": 0.8, "us": 0.2}}))

	s, _ := start(t, srv, Config{LeaseTTL: 3 * time.Second, MinShare: func(string) (float64, bool) { return 0.05, true }})
	waitFor(t, 5*time.Second, "never ready", s.Ready)
	if got := s.Share("exports", "cold"); got != 0.6 {
		t.Fatalf("default share = %v, want 0.6", got)
	}
	if got := s.Share("exports", "hot"); got != 0.8 {
		t.Fatalf("override share = %v, want 0.8", got)
	}
	if got := s.Share("other", "x"); got != 0.05 {
		t.Fatalf("share without allocation = %v, want minimum 0.05", got)
	}
	ackEpoch := func(p string) func() bool {
		return func() bool {
			var a etcdlayout.Ack
			found, _ := getAck(t, c, "eu", testNode, &a)
			return found && a.Region == "eu"
		}
	}
	waitFor(t, 3*time.Second, "no ack", ackEpoch("exports"))
	acked := func(epoch uint64) func() bool {
		return func() bool {
			var a etcdlayout.Ack
			found, _ := getAck(t, c, "eu", testNode, &a)
			return found && a.Epochs["exports"] == epoch
		}
	}
	waitFor(t, 3*time.Second, "epoch 1 not acked", acked(1))

	// A shrink: the override goes, the default shrinks; acked as epoch 2.
	shrink := alloc("exports", 2, map[string]float64{"eu": 0.3, "us": 0.4}, safe, nil)
	shrink.Phase = etcdlayout.PhaseShrink
	putJSON(t, c, lay.Alloc("exports"), shrink)
	waitFor(t, 3*time.Second, "epoch 2 not acked", acked(2))
	// The ack is written only after the table holding epoch 2 was published.
	if got := s.Share("exports", "hot"); got != 0.3 {
		t.Fatalf("after shrink share = %v, want 0.3", got)
	}
	if e, ok := s.Epoch("exports"); !ok || e != 2 {
		t.Fatalf("Epoch = %v %v", e, ok)
	}

	// A bad allocation: safe share, epoch 2 stays the acknowledged one.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.Put(ctx, lay.Alloc("exports"), `{"policy":"exports","epoch":3,"default":{"eu":7}}`); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 3*time.Second, "bad allocation not at safe share", func() bool { return s.Share("exports", "cold") == 0.1 })
	if e, _ := s.Epoch("exports"); e != 2 {
		t.Fatalf("bad allocation acked as epoch %d", e)
	}

	// Deleted: back to the policy minimum.
	if _, err := c.Delete(ctx, lay.Alloc("exports")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 3*time.Second, "deleted allocation still enforced", func() bool { return s.Share("exports", "cold") == 0.05 })
}

func TestWatchRecoversFromCompaction(t *testing.T) {
	srv := etcdtest.Start(t)
	c := srv.Client(t)
	safe := map[string]float64{"eu": 0.1}
	putJSON(t, c, lay.Alloc("p"), alloc("p", 1, map[string]float64{"eu": 0.5}, safe, nil))

	c2, err := Dial(srv.Endpoints)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	s, err := New(Config{Region: "eu", Client: c2, LeaseTTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	s.afterGet = func(key string) {
		if key != lay.AllocPrefix() {
			return
		}
		once.Do(func() {
			// Between the read and the watch: two writes and a compaction
			// past them, so the watch starts at a compacted revision.
			putJSON(t, c, lay.Alloc("p"), alloc("p", 2, map[string]float64{"eu": 0.4}, safe, nil))
			putJSON(t, c, lay.Alloc("p"), alloc("p", 3, map[string]float64{"eu": 0.3}, safe, nil))
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			r, err := c.Get(ctx, "x")
			if err != nil {
				t.Error(err)
				return
			}
			if _, err := c.Compact(ctx, r.Header.Revision); err != nil {
				t.Error(err)
			}
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitFor(t, 5*time.Second, "epoch 3 never applied after compaction", func() bool {
		e, _ := s.Epoch("p")
		return e == 3 && s.Share("p", "x") == 0.3 && s.Ready()
	})
	if err := s.Run(ctx); !errors.Is(err, ErrRunning) {
		t.Fatalf("second Run = %v, want ErrRunning", err)
	}
}

func TestDemandReportsLiveUnderTheLease(t *testing.T) {
	srv := etcdtest.Start(t)
	c := srv.Client(t)
	rec, err := demand.New(demand.Config{})
	if err != nil {
		t.Fatal(err)
	}
	s, stop := start(t, srv, Config{LeaseTTL: 2 * time.Second, ReportInterval: 100 * time.Millisecond, Recorder: rec, Addr: "127.0.0.1:8081"})
	waitFor(t, 5*time.Second, "never ready", s.Ready)

	var reg etcdlayout.Registration
	found, regLease := getJSON(t, c, lay.Node("eu", testNode), &reg)
	if !found || regLease == 0 || reg.LeaseTTLSeconds != 2 || reg.Addr != "127.0.0.1:8081" {
		t.Fatalf("registration %+v lease %x", reg, regLease)
	}
	var rep etcdlayout.DemandReport
	waitFor(t, 3*time.Second, "no report with demand", func() bool {
		rec.Record("exports", "tenant-1", 5, false, true)
		found, lease := getDemand(t, c, "eu", testNode, &rep)
		return found && lease == regLease && rep.Policies["exports"].Offered > 0
	})
	if p := rep.Policies["exports"]; rep.Region != "eu" || rep.IntervalSeconds <= 0 || len(p.Pressured) != 1 ||
		p.Pressured[0].Subject != "tenant-1" || !p.Pressured[0].Denied || p.Admitted != 0 {
		t.Fatalf("report %+v", rep)
	}

	// The region is stopping: a last flush lands under the live lease.
	rec.Record("flushed", "t", 1, true, false)
	if err := s.Flush(context.Background()); err != nil {
		t.Fatalf("flush: %v", err)
	}
	found, _ = getDemand(t, c, "eu", testNode, &rep)
	if _, ok := rep.Policies["flushed"]; !found || !ok {
		t.Fatalf("flushed report %+v", rep)
	}
	// Then Run returns and revokes the lease, which takes the report and
	// the registration with it; a flush after that has no lease.
	stop()
	for _, key := range []string{lay.DemandShard("eu", testNode, etcdlayout.PolicyDemandShard("exports")), lay.Node("eu", testNode)} {
		var v map[string]any
		if found, _ := getJSON(t, c, key, &v); found {
			t.Fatalf("%s outlived the revoked lease", key)
		}
	}
	if err := s.Flush(context.Background()); !errors.Is(err, ErrNoLease) {
		t.Fatalf("flush after Run returned: %v, want ErrNoLease", err)
	}
}

// TestFlushAtEndsTheInterval: a report flushed at an instant covers the
// time since the last one up to that instant, not up to when it is
// written, so its rates are the costs recorded over the time they were
// recorded for.
func TestFlushAtEndsTheInterval(t *testing.T) {
	srv := etcdtest.Start(t)
	c := srv.Client(t)
	rec, err := demand.New(demand.Config{})
	if err != nil {
		t.Fatal(err)
	}
	s, _ := start(t, srv, Config{LeaseTTL: 3 * time.Second, ReportInterval: MaxReportInterval, Recorder: rec})
	waitFor(t, 5*time.Second, "never ready", s.Ready)
	at := time.Now()
	if err := s.FlushAt(context.Background(), at); err != nil {
		t.Fatal(err)
	}
	rec.Record("exports", "", 50, true, false)
	time.Sleep(100 * time.Millisecond) // recording and writing take time
	if err := s.FlushAt(context.Background(), at.Add(500*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	var rep etcdlayout.DemandReport
	if found, _ := getDemand(t, c, "eu", testNode, &rep); !found || rep.IntervalSeconds != 0.5 || rep.Policies["exports"].Offered != 100 {
		t.Fatalf("report %+v: want 50 over the half second flushed, 100/s", rep)
	}
}

func TestSettingsAndPolicies(t *testing.T) {
	srv := etcdtest.Start(t)
	c := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Put(ctx, lay.PolicyDoc("a.yaml"), "policies: []"); err != nil {
		t.Fatal(err)
	}
	putJSON(t, c, lay.Settings(), etcdlayout.Settings{ReportIntervalSeconds: 0.1})
	rec, err := demand.New(demand.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []map[string][]byte
	s, _ := start(t, srv, Config{LeaseTTL: 3 * time.Second, ReportInterval: MaxReportInterval, Recorder: rec,
		OnPolicies: func(docs map[string][]byte) {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, docs)
		}})
	waitFor(t, 5*time.Second, "never ready", s.Ready)
	mu.Lock()
	if len(got) == 0 || string(got[0]["a.yaml"]) != "policies: []" {
		t.Fatalf("first policy delivery %v", got)
	}
	mu.Unlock()

	// Reports follow the interval in etcd's settings, not the config's 10 min.
	waitFor(t, 3*time.Second, "settings' report interval not used", func() bool {
		rec.Record("p", "s", 1, true, false)
		var rep etcdlayout.DemandReport
		found, _ := getDemand(t, c, "eu", testNode, &rep)
		return found && rep.Policies["p"].Offered > 0
	})

	if _, err := c.Put(ctx, lay.PolicyDoc("b.yaml"), "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Delete(ctx, lay.PolicyDoc("a.yaml")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 3*time.Second, "policy changes not delivered", func() bool {
		mu.Lock()
		defer mu.Unlock()
		last := got[len(got)-1]
		_, hasA := last["a.yaml"]
		return len(last) == 1 && !hasA && string(last["b.yaml"]) == "b"
	})
}

func TestLostLeaseFallsBackAndRecovers(t *testing.T) {
	srv := etcdtest.Start(t)
	c := srv.Client(t)
	putJSON(t, c, lay.Alloc("p"), alloc("p", 1, map[string]float64{"eu": 0.7, "us": 0.3}, map[string]float64{"eu": 0.2, "us": 0.2}, nil))
	const ttl = 2 * time.Second
	s, _ := start(t, srv, Config{LeaseTTL: ttl})
	waitFor(t, 5*time.Second, "never ready", s.Ready)
	if got := s.Share("p", "x"); got != 0.7 {
		t.Fatalf("share = %v, want 0.7", got)
	}

	t.Run("revoked lease", func(t *testing.T) {
		var reg etcdlayout.Registration
		_, lease := getJSON(t, c, lay.Node("eu", testNode), &reg)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := c.Revoke(ctx, clientv3.LeaseID(lease)); err != nil {
			t.Fatal(err)
		}
		// The next keepalive (every ttl/3) finds no lease; the region
		// re-registers under a new one and reads the shares again.
		waitFor(t, ttl, "revoked lease not noticed", func() bool { return s.Losses() == 1 })
		waitFor(t, 5*time.Second, "no recovery after revoke", func() bool {
			var r etcdlayout.Registration
			found, l := getJSON(t, c, lay.Node("eu", testNode), &r)
			return s.Ready() && found && l != lease && s.Share("p", "x") == 0.7
		})
	})

	t.Run("etcd down longer than the TTL", func(t *testing.T) {
		// Watch for the switch from before the stop: Stop itself may take
		// a while (graceful close of the gRPC streams).
		switched := make(chan time.Duration, 1)
		go func() {
			deadline := time.Now().Add(30 * time.Second)
			for s.Share("p", "x") != 0.2 && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			switched <- s.monoNow()
		}()
		stopAt := s.monoNow()
		srv.Stop()
		stopTook := s.monoNow() - stopAt
		at := <-switched
		if s.Share("p", "x") != 0.2 {
			t.Fatal("no safe share after losing etcd")
		}
		// The switch is due LeaseTTL after the last keepalive that etcd
		// answered (measured from when it was sent): never later, since
		// etcd expires the lease no earlier than that.
		lastOK := time.Duration(s.lastOK.Load())
		late := at - lastOK - ttl
		t.Logf("stop took %v; safe share %v after the last good keepalive (TTL %v)", stopTook, at-lastOK, ttl)
		if late < -lossCheck(ttl) || late > 50*time.Millisecond {
			t.Fatalf("safe share %v after the last good keepalive, want within one loss check (%v) before the TTL %v (+50ms to observe it)", at-lastOK, lossCheck(ttl), ttl)
		}
		if at-stopAt > stopTook+ttl+150*time.Millisecond {
			t.Fatalf("safe share %v after the stop began", at-stopAt)
		}
		if s.Ready() || !s.Lost() {
			t.Fatal("ready while cut off")
		}
		// Still safe well past the TTL while etcd stays down.
		time.Sleep(300 * time.Millisecond)
		if got := s.Share("p", "x"); got != 0.2 {
			t.Fatalf("share while down = %v", got)
		}
		restarted := time.Now()
		if err := srv.Restart(); err != nil {
			t.Fatal(err)
		}
		back := waitFor(t, 10*time.Second, "published share not back after restart", func() bool {
			return s.Ready() && s.Share("p", "x") == 0.7
		})
		t.Logf("published shares %v after the restart", back)
		var a etcdlayout.Ack
		waitFor(t, 3*time.Second, "no ack under the new lease", func() bool {
			found, _ := getAck(t, c, "eu", testNode, &a)
			return found && a.Epochs["p"] == 1 && a.At.After(restarted)
		})
	})
}

func TestLeaseTTLFollowsSettings(t *testing.T) {
	tests := []struct {
		name     string
		settings *etcdlayout.Settings
		raw      string
		cfgTTL   time.Duration
		wantTTL  int64
	}{
		{name: "published TTL", settings: &etcdlayout.Settings{LeaseTTLSeconds: 2}, wantTTL: 2},
		{name: "none published: default", wantTTL: 10},
		{name: "configured TTL wins", settings: &etcdlayout.Settings{LeaseTTLSeconds: 2}, cfgTTL: 3 * time.Second, wantTTL: 3},
		{name: "published TTL out of range: default", settings: &etcdlayout.Settings{LeaseTTLSeconds: 7200}, wantTTL: 10},
		{name: "unreadable settings: default", raw: "{", wantTTL: 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := etcdtest.Start(t)
			c := srv.Client(t)
			if tt.settings != nil {
				putJSON(t, c, lay.Settings(), tt.settings)
			}
			if tt.raw != "" {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				if _, err := c.Put(ctx, lay.Settings(), tt.raw); err != nil {
					t.Fatal(err)
				}
			}
			s, _ := start(t, srv, Config{LeaseTTL: tt.cfgTTL})
			waitFor(t, 5*time.Second, "never ready", s.Ready)
			var reg etcdlayout.Registration
			found, lease := getJSON(t, c, lay.Node("eu", testNode), &reg)
			if !found || reg.LeaseTTLSeconds != tt.wantTTL {
				t.Fatalf("registration %+v, want lease TTL %ds", reg, tt.wantTTL)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			ttl, err := c.TimeToLive(ctx, clientv3.LeaseID(lease))
			if err != nil {
				t.Fatal(err)
			}
			if ttl.GrantedTTL != tt.wantTTL {
				t.Fatalf("granted TTL %ds, want %ds", ttl.GrantedTTL, tt.wantTTL)
			}
			if got, want := s.requestTimeout(), min(DefaultRequestTimeout, time.Duration(tt.wantTTL)*time.Second/3); got != want {
				t.Fatalf("request timeout %v, want %v", got, want)
			}
		})
	}
}

func TestGracefulStopRevokesTheLease(t *testing.T) {
	srv := etcdtest.Start(t)
	c := srv.Client(t)
	putJSON(t, c, lay.Alloc("p"), alloc("p", 1, map[string]float64{"eu": 0.7, "us": 0.3}, map[string]float64{"eu": 0.2, "us": 0.2}, nil))
	s, stop := start(t, srv, Config{LeaseTTL: 30 * time.Second})
	waitFor(t, 5*time.Second, "never ready", s.Ready)
	waitFor(t, 3*time.Second, "no ack", func() bool {
		var a etcdlayout.Ack
		found, _ := getAck(t, c, "eu", testNode, &a)
		return found && a.Epochs["p"] == 1
	})
	var reg etcdlayout.Registration
	_, lease := getJSON(t, c, lay.Node("eu", testNode), &reg)
	stop()
	// Safe share first, then no lease: nothing of the region is left in
	// etcd although its TTL (30 s) is far from over.
	if got := s.Share("p", "x"); got != 0.2 || !s.Lost() {
		t.Fatalf("after Run returned: share %v lost %v, want the safe share 0.2", got, s.Lost())
	}
	// The acknowledgement is kept without the lease, for a leader that
	// did not see the node go (Owner.Registration).
	var v map[string]any
	if found, _ := getJSON(t, c, lay.Node("eu", testNode), &v); found {
		t.Fatalf("registration still there after a graceful stop")
	}
	if found, l := getJSON(t, c, lay.AckShard("eu", testNode, etcdlayout.PolicyShard("p")), &v); !found || l != 0 {
		t.Fatalf("acknowledgement after a graceful stop: found %v under lease %x, want kept without a lease", found, l)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ttl, err := c.TimeToLive(ctx, clientv3.LeaseID(lease))
	if err != nil {
		t.Fatal(err)
	}
	if ttl.TTL != -1 {
		t.Fatalf("lease %x still alive (TTL %ds) after a graceful stop", lease, ttl.TTL)
	}
}

func TestAckWaitsForPinnedChecks(t *testing.T) {
	srv := etcdtest.Start(t)
	c := srv.Client(t)
	safe := map[string]float64{"eu": 0.1, "us": 0.1}
	putJSON(t, c, lay.Alloc("p"), alloc("p", 1, map[string]float64{"eu": 0.7, "us": 0.3}, safe, nil))
	s, _ := start(t, srv, Config{LeaseTTL: 3 * time.Second})
	acked := func(epoch uint64) func() bool {
		return func() bool {
			var a etcdlayout.Ack
			found, _ := getAck(t, c, "eu", testNode, &a)
			return found && a.Epochs["p"] == epoch
		}
	}
	waitFor(t, 5*time.Second, "epoch 1 not acked", acked(1))

	// A check pins epoch 1; a shrink to 0.4 is published meanwhile.
	pin := s.Begin()
	shrink := alloc("p", 2, map[string]float64{"eu": 0.4, "us": 0.3}, safe, nil)
	shrink.Phase = etcdlayout.PhaseShrink
	putJSON(t, c, lay.Alloc("p"), shrink)
	waitFor(t, 3*time.Second, "epoch 2 not applied", func() bool { return s.Share("p", "x") == 0.4 })
	if got := pin.Share("p", "x"); got != 0.7 {
		t.Fatalf("pinned check sees %v, want its table's 0.7", got)
	}
	// Not acknowledged while the check may still take tokens at 0.7.
	time.Sleep(300 * time.Millisecond)
	if acked(2)() {
		t.Fatal("epoch 2 acknowledged while a check still used epoch 1")
	}
	// A check that starts now uses epoch 2 and does not hold the ack.
	later := s.Begin()
	if got := later.Share("p", "x"); got != 0.4 {
		t.Fatalf("new check sees %v, want 0.4", got)
	}
	pin.End()
	took := waitFor(t, 3*time.Second, "epoch 2 not acked after the pinned check ended", acked(2))
	later.End()
	t.Logf("epoch 2 acknowledged %v after the last check on epoch 1 ended", took)
}

func TestBeginDoesNotAllocate(t *testing.T) {
	s := syncerWithTable(t, 10)
	allocs := testing.AllocsPerRun(1000, func() {
		p := s.Begin()
		if p.Share("p", "s3") != 0.5 {
			t.Fatal("wrong share")
		}
		p.End()
	})
	if allocs != 0 {
		t.Fatalf("Begin/Share/End allocate %v times", allocs)
	}
}
