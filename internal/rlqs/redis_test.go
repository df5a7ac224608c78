package rlqs

import (
	"context"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/boundcheck"
	"github.com/quotacoord/quota/internal/policy"
	"github.com/quotacoord/quota/internal/redistest"
)

// redisAndEdge returns a Redis store (closed at cleanup) and the
// policies of edgePolicies.
func redisAndEdge(t *testing.T) (*bucket.Redis, *policy.Set) {
	t.Helper()
	rs, err := bucket.NewRedis(bucket.RedisConfig{Client: redistest.Client(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rs.Close() })
	set, err := policy.Parse("edge.yaml", []byte(edgePolicies))
	if err != nil {
		t.Fatal(err)
	}
	return rs, set
}

// TestRLQSWithRedis runs the server in real time on a Redis store: three
// Envoys report every second and are offered 3× the budget between them
// for five seconds; every window stays within C + r·W.
func TestRLQSWithRedis(t *testing.T) {
	rs, set := redisAndEdge(t)
	srv, err := New(Config{
		Policies: func() *policy.Set { return set }, Subjects: policy.EnvoySubjects{PlainKeys: []string{"tenant"}},
		Share: func(string, string) float64 { return 1 }, Store: rs, Node: "n1",
		Interval: 250 * time.Millisecond, TTL: 2 * time.Second, Margin: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	srv.Register(gs)
	go func() { _ = gs.Serve(lis) }()
	defer gs.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = srv.Run(ctx) }()
	defer func() { cancel(); wg.Wait() }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	id := map[string]string{"tenant": redistest.Unique(t)}
	var mu sync.Mutex
	var adms []boundcheck.Admission
	var offered int
	start := time.Now()
	var cwg sync.WaitGroup
	for range 3 {
		c := NewClient(ClientConfig{Domain: "edge", NoAssignment: DenyAll, Expired: DenyAll, ReportNew: true})
		if err := c.Connect(ctx, conn); err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		cwg.Add(1)
		go func() {
			defer cwg.Done()
			next := time.Now().Add(time.Second)
			for time.Since(start) < 5*time.Second {
				if time.Now().After(next) {
					_ = c.Report()
					next = next.Add(time.Second)
				}
				ok := c.Allow(id)
				at := time.Now()
				mu.Lock()
				offered++
				if ok {
					adms = append(adms, boundcheck.Admission{Policy: "p", Subject: "acme", Region: "eu", At: at, Cost: 1})
				}
				mu.Unlock()
				time.Sleep(time.Second / 30) // 30/s each: 90/s, 3× the refill
			}
		}()
	}
	cwg.Wait()
	limits := bucket.Limits{Algorithm: bucket.TokenBucket, Capacity: 60, RefillPerSecond: 30}
	rep, err := boundcheck.Check(boundcheck.Config{Limits: map[string]bucket.Limits{"p": limits},
		Windows: []time.Duration{100 * time.Millisecond, time.Second, 3 * time.Second}, Slack: 5 * time.Millisecond}, adms)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range rep.Violations {
		t.Errorf("over the bound: %v", v)
	}
	t.Logf("offered %d in 5 s, admitted %d (a full bucket then 30/s would admit at most %d); leased now %.1f tokens/s",
		offered, len(adms), 60+30*5, value(srv.m.leased))
	if len(adms) == 0 || value(srv.m.leased) == 0 {
		t.Error("nothing was leased")
	}
}

// countingLeaser counts a store's single lease calls and batches.
type countingLeaser struct {
	bucket.Leaser
	single, batches atomic.Int64
}

func (c *countingLeaser) Lease(ctx context.Context, q bucket.LeaseRequest) (bucket.Lease, error) {
	c.single.Add(1)
	return c.Leaser.Lease(ctx, q)
}

// batchingLeaser is a countingLeaser whose store takes batches.
type batchingLeaser struct {
	*countingLeaser
	b bucket.BatchLeaser
}

func (c *batchingLeaser) LeaseAll(ctx context.Context, qs []bucket.LeaseRequest) ([]bucket.Lease, []error) {
	c.batches.Add(1)
	return c.b.LeaseAll(ctx, qs)
}

// TestRoundRenewsInOneBatch: 4 streams × 250 buckets on Redis, steady
// demand. Once the assignments settle, a round renews the 1,000 leases in
// one batch (bucket.LeaseAll: a Redis round trip per 256) instead of a
// call each; the test logs the round's time both ways.
func TestRoundRenewsInOneBatch(t *testing.T) {
	rs, set := redisAndEdge(t)
	// Each run on buckets of its own: the first run's leases would
	// still hold the rate of the second's.
	round := func(store bucket.Leaser, prefix string) (time.Duration, int) {
		srv, err := New(Config{Policies: func() *policy.Set { return set }, Subjects: policy.EnvoySubjects{PlainKeys: []string{"tenant"}},
			Share: func(string, string) float64 { return 1 }, Store: store, TTL: 3 * time.Second, Margin: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		rep := &rlqsv3.RateLimitQuotaUsageReports{Domain: "edge"}
		for i := range 250 {
			rep.BucketQuotaUsages = append(rep.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
				BucketId:    &rlqsv3.BucketId{Bucket: map[string]string{"tenant": prefix + "-" + strconv.Itoa(i)}},
				TimeElapsed: durationpb.New(time.Second), NumRequestsAllowed: 5, NumRequestsDenied: 1})
		}
		var streams []*stream
		for range 4 {
			ss, err := srv.open()
			if err != nil {
				t.Fatal(err)
			}
			streams = append(streams, ss)
		}
		step := func() time.Duration {
			for _, ss := range streams {
				if err := srv.handle(ss, rep); err != nil {
					t.Fatal(err)
				}
			}
			start := time.Now()
			srv.Step(context.Background())
			took := time.Since(start)
			for _, ss := range streams {
				for len(ss.out) > 0 {
					<-ss.out
				}
			}
			return took
		}
		step()
		step()
		return step(), len(streams) * len(rep.BucketQuotaUsages)
	}
	one := &countingLeaser{Leaser: rs}
	tookOne, n := round(one, redistest.Unique(t)+"-one")
	before := one.single.Load()
	batched := &batchingLeaser{countingLeaser: &countingLeaser{Leaser: rs}, b: rs}
	tookBatch, _ := round(batched, redistest.Unique(t)+"-batch")
	t.Logf("a round of %d renewals on Redis: %v one call each, %v in one batch", n, tookOne.Round(time.Millisecond), tookBatch.Round(time.Millisecond))
	if batched.batches.Load() < 1 || batched.single.Load() > before/2 {
		t.Errorf("batched rounds: %d batches, %d single lease calls (%d without batches): the renewals were not batched",
			batched.batches.Load(), batched.single.Load(), before)
	}
}
