package regional

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/clock"
	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/etcdtest"
	"github.com/quotacoord/quota/internal/regionsync"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

// The policies of the pin tests, one of each format: "pinned" and the
// Envoy rule's "pins.tenant" (domain.key), the names allocations use.
const (
	pinsOwn = `policies:
  - name: pinned
    subject: tenant
    capacity: 100
    rate: 100/minute
    failure_mode: open
`
	pinsEnvoy = `domain: pins
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 1000000}
`
)

// gateStore blocks TakeAll while armed: it signals entered, then waits for
// release or for the call's context to end (a store timeout or a caller
// that went away), whichever is first. Unarmed it costs one atomic load.
type gateStore struct {
	bucket.Store
	cur atomic.Pointer[gate]
}

type gate struct {
	entered chan struct{}
	release chan struct{}
}

func newGateStore(s bucket.Store) *gateStore { return &gateStore{Store: s} }

// arm makes the next TakeAll calls block until the returned release
// function is called.
func (g *gateStore) arm() (entered <-chan struct{}, release func()) {
	gt := &gate{entered: make(chan struct{}, 64), release: make(chan struct{})}
	g.cur.Store(gt)
	var once sync.Once
	return gt.entered, func() {
		once.Do(func() {
			g.cur.CompareAndSwap(gt, nil)
			close(gt.release)
		})
	}
}

func (g *gateStore) TakeAll(ctx context.Context, reqs []bucket.Request) ([]bucket.Decision, error) {
	if gt := g.cur.Load(); gt != nil {
		select {
		case gt.entered <- struct{}{}:
		default:
		}
		select {
		case <-gt.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return g.Store.TakeAll(ctx, reqs)
}

// pinEnv is one region ("eu") of a real regionsync against embedded etcd,
// and a node of that region served over loopback gRPC.
type pinEnv struct {
	cli   *clientv3.Client
	sync  *regionsync.Syncer
	h     *harness
	gate  *gateStore
	epoch uint64
}

// startPinEnv starts etcd, a Syncer for region eu (lease TTL 3 s, etcd
// calls bounded to 300 ms so that a postponed acknowledgement is retried
// quickly), publishes epoch 1 of both policies at share 0.5 and waits for
// its acknowledgement. storeTimeout is the node's store time budget.
func startPinEnv(t testing.TB, storeTimeout time.Duration) *pinEnv {
	t.Helper()
	srv := etcdtest.Start(t)
	e := &pinEnv{cli: srv.Client(t)}
	c, err := regionsync.Dial(srv.Endpoints)
	if err != nil {
		t.Fatal(err)
	}
	e.sync, err = regionsync.New(regionsync.Config{Region: "eu", Client: c, LeaseTTL: 3 * time.Second,
		RequestTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.sync.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("regionsync Run: %v", err)
		}
		_ = c.Close()
	})
	e.gate = newGateStore(memoryStore(t, clock.Real{}))
	e.h = startNode(t, Config{Region: "eu", Shares: e.sync, Store: e.gate, StoreTimeout: storeTimeout,
		BreakerThreshold: 1000}, map[string]string{"own.yaml": pinsOwn, "envoy.yaml": pinsEnvoy})
	if e.h.node.pins == nil {
		t.Fatal("a regionsync.Syncer is not taken as a PinnedShareSource")
	}
	for _, name := range []string{"pinned", "pins.tenant"} {
		if _, ok := e.h.node.Policies().Get(name); !ok {
			t.Fatalf("policy %q not loaded", name)
		}
	}
	e.publish(t, 0.5)
	return e
}

// publish writes the next epoch of both policies with region eu at share
// and waits until the Syncer applied it and enforces it (holds a lease and
// read the allocations under it: not at the safe shares).
func (e *pinEnv) publish(t testing.TB, share float64) uint64 {
	t.Helper()
	e.epoch++
	for _, name := range []string{"pinned", "pins.tenant"} {
		a := etcdlayout.Allocation{Policy: name, Epoch: e.epoch, Phase: etcdlayout.PhaseStable,
			Default: map[string]float64{"eu": share, "us": 1 - share}, Safe: map[string]float64{"eu": 0.1, "us": 0.1}}
		b, err := json.Marshal(a)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.cli.Put(ctxT(t), etcdlayout.Layout{}.Alloc(name), string(b)); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		a, _ := e.sync.Epoch("pinned")
		b, _ := e.sync.Epoch("pins.tenant")
		if a == e.epoch && b == e.epoch && !e.sync.Lost() {
			return e.epoch
		}
		if time.Now().After(deadline) {
			t.Fatalf("epoch %d not applied within 5s (have %d, %d)", e.epoch, a, b)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// acked reports whether a node of region eu acknowledged epoch of both
// policies (in whichever acknowledgement shards they fall).
func (e *pinEnv) acked(t testing.TB, epoch uint64) bool {
	t.Helper()
	r, err := e.cli.Get(ctxT(t), etcdlayout.Layout{}.AcksPrefix(), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	l := etcdlayout.Layout{}
	nodes := map[string]*etcdlayout.Ack{}
	for _, kv := range r.Kvs {
		region, node, _, a, err := l.DecodeAck(string(kv.Key), kv.Value)
		if err != nil {
			t.Fatalf("ack %s: %v", kv.Key, err)
		}
		if region == "eu" {
			nodes[node] = etcdlayout.MergeAck(nodes[node], a)
		}
	}
	for _, a := range nodes {
		if a.Epochs["pinned"] >= epoch && a.Epochs["pins.tenant"] >= epoch {
			return true
		}
	}
	return false
}

// waitAcked fails the test unless epoch is acknowledged within d.
func (e *pinEnv) waitAcked(t testing.TB, epoch uint64, d time.Duration, what string) time.Duration {
	t.Helper()
	start := time.Now()
	for !e.acked(t, epoch) {
		if time.Since(start) > d {
			t.Fatalf("epoch %d not acknowledged within %v: %s", epoch, d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start)
}

// TestCheckHoldsTheAckOfANewerEpoch: a check of each API that is blocked
// inside the store, with its shares read from epoch k, holds the
// acknowledgement of epoch k+1 until it returns, and decides at epoch k's
// share; the acknowledgement follows promptly once it returned.
func TestCheckHoldsTheAckOfANewerEpoch(t *testing.T) {
	e := startPinEnv(t, 30*time.Second)
	e.waitAcked(t, e.epoch, 5*time.Second, "first epoch")
	tests := []struct {
		name string
		// check runs one check and returns the share it decided at.
		check func(ctx context.Context, subject string) (float64, error)
	}{
		{"own", func(ctx context.Context, subject string) (float64, error) {
			r, err := e.h.adm.Check(ctx, &quotav1.CheckRequest{Subject: subject, Policies: []string{"pinned"}})
			if err != nil {
				return 0, err
			}
			return r.Policies[0].Share, nil
		}},
		{"batch", func(ctx context.Context, subject string) (float64, error) {
			r, err := e.h.adm.CheckBatch(ctx, &quotav1.CheckBatchRequest{Checks: []*quotav1.CheckRequest{
				{Subject: subject, Policies: []string{"pinned"}}, {Subject: subject + "-2", Policies: []string{"pinned"}}}})
			if err != nil {
				return 0, err
			}
			if r.Responses[0].Policies[0].Share != r.Responses[1].Policies[0].Share {
				return 0, status.Errorf(codes.Internal, "one batch read two tables: %v", r)
			}
			return r.Responses[1].Policies[0].Share, nil
		}},
		{"envoy", func(ctx context.Context, subject string) (float64, error) {
			r, err := e.h.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "pins",
				Descriptors: []*rlcommon.RateLimitDescriptor{desc("tenant", subject)}})
			if err != nil {
				return 0, err
			}
			// A one-second window of 10⁶ at share f reports f·10⁶ per second.
			return float64(r.Statuses[0].GetCurrentLimit().GetRequestsPerUnit()) / 1e6, nil
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			const before, share = 0.5, 0.25
			if s := e.sync.Share("pinned", "x"); s != before {
				e.waitAcked(t, e.publish(t, before), 5*time.Second, "setting the share back")
			}
			entered, release := e.gate.arm()
			defer release()
			type result struct {
				share float64
				err   error
			}
			res := make(chan result, 1)
			go func() {
				s, err := tc.check(ctxT(t), "acme-"+tc.name)
				res <- result{s, err}
			}()
			select {
			case <-entered:
			case <-time.After(5 * time.Second):
				t.Fatal("check never reached the store")
			}
			// The check read its shares at `before`; a shrink is published
			// and applied while it waits inside the store.
			epoch := e.publish(t, share)
			if got := e.sync.Share("pinned", "x"); got != share {
				t.Fatalf("syncer share %v after publish, want %v", got, share)
			}
			// The ack loop gives up waiting after one request timeout
			// (300 ms) and retries with back-off: three timeouts in, the
			// epoch must still be unacknowledged.
			time.Sleep(time.Second)
			if e.acked(t, epoch) {
				t.Fatalf("epoch %d acknowledged while a %s check still used the previous epoch's share", epoch, tc.name)
			}
			released := time.Now()
			release()
			r := <-res
			if r.err != nil {
				t.Fatalf("blocked check: %v", r.err)
			}
			if r.share != before {
				t.Fatalf("blocked check decided at share %v, want its pinned %v", r.share, before)
			}
			e.waitAcked(t, epoch, 5*time.Second, "after the blocked check returned")
			t.Logf("%s: epoch %d acknowledged %v after the blocked check was released", tc.name, epoch, time.Since(released).Round(time.Millisecond))
			// A check that starts now reads the new share.
			if s, err := tc.check(ctxT(t), "acme-"+tc.name+"-after"); err != nil || s != share {
				t.Fatalf("check after the ack: share %v, %v; want %v", s, err, share)
			}
		})
	}
}

// TestPinReleasedOnEveryPath: after a check that returns through each
// early, error or degraded path, a newer epoch is still acknowledged: no
// path leaks its pin (a leaked pin would hold every later ack forever).
func TestPinReleasedOnEveryPath(t *testing.T) {
	// A 100 ms store budget: a blocked store call times out.
	e := startPinEnv(t, 100*time.Millisecond)
	bare := startNode(t, Config{Region: "eu", Shares: e.sync}, nil) // no policies loaded
	own := func(req *quotav1.CheckRequest) func(context.Context) error {
		return func(ctx context.Context) error { _, err := e.h.adm.Check(ctx, req); return err }
	}
	tests := []struct {
		name  string
		block bool       // the store blocks (until the store budget or the caller ends it)
		code  codes.Code // the status the check answers
		run   func(ctx context.Context) error
	}{
		{"own decided", false, codes.OK, own(&quotav1.CheckRequest{Subject: "a", Policies: []string{"pinned"}})},
		{"own bad subject", false, codes.InvalidArgument, own(&quotav1.CheckRequest{Subject: "a b", Policies: []string{"pinned"}})},
		{"own no policy", false, codes.InvalidArgument, own(&quotav1.CheckRequest{Subject: "a"})},
		{"own cost over capacity", false, codes.InvalidArgument, own(&quotav1.CheckRequest{Subject: "a", Policies: []string{"pinned"}, Cost: 101})},
		{"own unknown policy", false, codes.NotFound, own(&quotav1.CheckRequest{Subject: "a", Policies: []string{"nope"}})},
		{"own store timeout (fail open)", true, codes.OK, own(&quotav1.CheckRequest{Subject: "a", Policies: []string{"pinned"}})},
		{"own idempotent first", false, codes.OK, own(&quotav1.CheckRequest{Subject: "a", Policies: []string{"pinned"}, IdempotencyKey: "k"})},
		{"own idempotent replay", false, codes.OK, own(&quotav1.CheckRequest{Subject: "a", Policies: []string{"pinned"}, IdempotencyKey: "k"})},
		{"own caller gone", true, codes.DeadlineExceeded, func(ctx context.Context) error {
			ctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
			defer cancel()
			_, err := e.h.adm.Check(ctx, &quotav1.CheckRequest{Subject: "b", Policies: []string{"pinned"}})
			return err
		}},
		{"own no policies loaded", false, codes.Unavailable, func(ctx context.Context) error {
			_, err := bare.adm.Check(ctx, &quotav1.CheckRequest{Subject: "a", Policies: []string{"pinned"}})
			return err
		}},
		{"batch bad entry", false, codes.InvalidArgument, func(ctx context.Context) error {
			_, err := e.h.adm.CheckBatch(ctx, &quotav1.CheckBatchRequest{Checks: []*quotav1.CheckRequest{
				{Subject: "a", Policies: []string{"pinned"}}, {Subject: "", Policies: []string{"pinned"}}}})
			return err
		}},
		{"batch too large", false, codes.InvalidArgument, func(ctx context.Context) error {
			req := &quotav1.CheckBatchRequest{}
			for range MaxBatch + 1 {
				req.Checks = append(req.Checks, &quotav1.CheckRequest{Subject: "a", Policies: []string{"pinned"}})
			}
			_, err := e.h.adm.CheckBatch(ctx, req)
			return err
		}},
		{"batch store timeout", true, codes.OK, func(ctx context.Context) error {
			_, err := e.h.adm.CheckBatch(ctx, &quotav1.CheckBatchRequest{Checks: []*quotav1.CheckRequest{
				{Subject: "a", Policies: []string{"pinned"}}}})
			return err
		}},
		{"envoy decided", false, codes.OK, func(ctx context.Context) error {
			_, err := e.h.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "pins",
				Descriptors: []*rlcommon.RateLimitDescriptor{desc("tenant", "a")}})
			return err
		}},
		{"envoy no descriptors (rejected as over limit)", false, codes.OK, func(ctx context.Context) error {
			_, err := e.h.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "pins"})
			return err
		}},
		{"envoy hits over max (denied)", false, codes.OK, func(ctx context.Context) error {
			d := desc("tenant", "a")
			d.HitsAddend = wrapperspb.UInt64(1 << 60)
			_, err := e.h.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "pins",
				Descriptors: []*rlcommon.RateLimitDescriptor{d}})
			return err
		}},
		{"envoy store timeout", true, codes.OK, func(ctx context.Context) error {
			_, err := e.h.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "pins",
				Descriptors: []*rlcommon.RateLimitDescriptor{desc("tenant", "c")}})
			return err
		}},
		{"envoy no policies loaded", false, codes.Unavailable, func(ctx context.Context) error {
			_, err := bare.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "pins",
				Descriptors: []*rlcommon.RateLimitDescriptor{desc("tenant", "a")}})
			return err
		}},
	}
	share := 0.5
	for _, tc := range tests {
		ok := t.Run(tc.name, func(t *testing.T) {
			if tc.block {
				_, release := e.gate.arm()
				defer release()
			}
			if err := tc.run(ctxT(t)); status.Code(err) != tc.code {
				t.Fatalf("check answered %v, want code %v", err, tc.code)
			}
			share = 0.75 - share // alternate 0.5 and 0.25
			epoch := e.publish(t, share)
			e.waitAcked(t, epoch, 5*time.Second, "a pin leaked on the path "+tc.name)
		})
		if !ok {
			// A leaked pin holds every later ack too: the cases after it
			// would only repeat this failure.
			break
		}
	}
}

// TestPinDoesNotAllocate: a check's pin (begin, share, end) is
// allocation-free with a real Syncer and with the standalone source.
func TestPinDoesNotAllocate(t *testing.T) {
	e := startPinEnv(t, time.Second)
	alone := startNode(t, Config{}, nil).node
	for name, n := range map[string]*Node{"pinned": e.h.node, "standalone": alone} {
		want := map[string]float64{"pinned": 0.5, "standalone": 1}[name]
		allocs := testing.AllocsPerRun(1000, func() {
			shares := n.beginShares()
			defer shares.end()
			if got := shares.share("pinned", "acme"); got != want {
				t.Fatalf("%s: share %v, want %v", name, got, want)
			}
		})
		if allocs != 0 {
			t.Errorf("%s: a pin allocates %v times per check", name, allocs)
		}
	}
}

// BenchmarkCheckShares is what one check pays for its shares: begin, one
// share read, end; with Standalone, with a real Syncer (a pin), and, for
// comparison, the Syncer's unpinned Share that checks used before pins.
func BenchmarkCheckShares(b *testing.B) {
	e := startPinEnv(b, time.Second)
	alone := startNode(b, Config{}, nil).node
	read := map[string]func() float64{
		"standalone": func() float64 { s := alone.beginShares(); defer s.end(); return s.share("pinned", "acme") },
		"pinned":     func() float64 { s := e.h.node.beginShares(); defer s.end(); return s.share("pinned", "acme") },
		"unpinned":   func() float64 { return e.sync.Share("pinned", "acme") },
	}
	for _, name := range []string{"standalone", "unpinned", "pinned"} {
		f := read[name]
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			sum := 0.0
			for b.Loop() {
				sum += f()
			}
			if sum <= 0 {
				b.Fatal("no share read")
			}
		})
	}
}
