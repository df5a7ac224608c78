package rlqs

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/boundcheck"
	"github.com/quotacoord/quota/internal/policy"
	"github.com/quotacoord/quota/internal/redistest"
)

// TestRLQSWithRedis runs the server in real time on a Redis store: three
// Envoys report every second and are offered 3× the budget between them
// for five seconds; every window stays within C + r·W.
func TestRLQSWithRedis(t *testing.T) {
	rs, err := bucket.NewRedis(bucket.RedisConfig{Client: redistest.Client(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rs.Close() })
	set, err := policy.Parse("edge.yaml", []byte(edgePolicies))
	if err != nil {
		t.Fatal(err)
	}
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
