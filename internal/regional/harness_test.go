package regional

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/clock"
	"github.com/quotacoord/quota/internal/daemon"
	"github.com/quotacoord/quota/internal/grants"
	"github.com/quotacoord/quota/internal/policy"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

func TestMain(m *testing.M) {
	// Benchmarks measure the node as cmd/regional runs it, with the
	// runtime's monitor thread kept awake: daemon.StayAwake re-executes
	// this binary once, with the same arguments, to set it.
	flag.Parse()
	if f := flag.Lookup("test.bench"); f != nil && f.Value.String() != "" {
		if err := daemon.StayAwake(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
	goleak.VerifyTestMain(m,
		// go-redis and the OTLP exporter are not started by these tests;
		// the shared redistest server is a process, not a goroutine.
		goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).reaper"),
	)
}

// harness is a node served over real gRPC on loopback.
type harness struct {
	node  *Node
	adm   quotav1.AdmissionClient
	rls   rlsv3.RateLimitServiceClient
	reg   *prometheus.Registry
	dir   string
	store *countingStore
}

// maxSeenKeys bounds the keys a countingStore records (tests look at a
// few; benchmarks make millions of calls).
const maxSeenKeys = 10_000

// countingStore counts the primary store's calls and records the keys of
// the first maxSeenKeys buckets they name.
type countingStore struct {
	bucket.Store
	calls atomic.Int64
	mu    sync.Mutex
	keys  []bucket.Key
}

func (c *countingStore) TakeAll(ctx context.Context, reqs []bucket.Request) ([]bucket.Decision, error) {
	c.calls.Add(1)
	c.mu.Lock()
	for _, r := range reqs {
		if len(c.keys) < maxSeenKeys {
			c.keys = append(c.keys, r.Key)
		}
	}
	c.mu.Unlock()
	return c.Store.TakeAll(ctx, reqs)
}

func (c *countingStore) seen() []bucket.Key {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]bucket.Key(nil), c.keys...)
}

func memoryStore(t testing.TB, clk clock.Clock) *bucket.Memory {
	t.Helper()
	m, err := bucket.NewMemory(bucket.MemoryConfig{Clock: clk, MaxBuckets: 10000})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// writePolicies writes files (name → YAML) into a fresh directory.
func writePolicies(t testing.TB, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// startNode serves a node built from cfg (Store and Local default to
// in-process stores) with the policies in files.
func startNode(t testing.TB, cfg Config, files map[string]string) *harness {
	t.Helper()
	if cfg.Region == "" {
		cfg.Region = "test"
	}
	if cfg.Local == nil {
		cfg.Local = memoryStore(t, clock.Real{})
	}
	if cfg.Store == nil {
		cfg.Store = memoryStore(t, clock.Real{})
	}
	cs := &countingStore{Store: cfg.Store}
	cfg.Store = cs
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{node: n, reg: reg, store: cs}
	if files != nil {
		h.dir = writePolicies(t, files)
		s, err := policy.Load(h.dir)
		if err != nil {
			t.Fatal(err)
		}
		n.SetPolicies(s)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	n.Register(gs)
	go func() { _ = gs.Serve(l) }()
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		gs.Stop()
	})
	h.adm = quotav1.NewAdmissionClient(conn)
	h.rls = rlsv3.NewRateLimitServiceClient(conn)
	return h
}

// trusting grants every action on every policy to every caller, as a
// node had before callers were told apart.
func trusting(t testing.TB) *grants.Grants {
	t.Helper()
	g, err := grants.Parse("trusting", []byte("default: [{actions: [check, peek, refund, override], policies: ['*']}]"))
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// desc builds an Envoy descriptor from key, value pairs.
func desc(kv ...string) *rlcommon.RateLimitDescriptor {
	d := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func writeFile(dir, name, body string) error {
	return os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644)
}

// counterValue sums every series of the counter called name.
func counterValue(t testing.TB, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}
