package loadgen

import (
	"context"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/cputime"
	"github.com/quotacoord/quota/internal/policy"
	"github.com/quotacoord/quota/internal/rlqs"
)

// startRLQS serves the Rate Limit Quota Service in this process on a
// loopback port, for domain bench (tenants: 100/s, burst 100), at share 1
// on an in-process store; it stops at the test's end.
func startRLQS(t *testing.T) string {
	t.Helper()
	set, err := policy.Parse("bench.yaml", []byte("domain: bench\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 100, burst: 100}\n"))
	if err != nil {
		t.Fatal(err)
	}
	store, err := bucket.NewMemory(bucket.MemoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := rlqs.New(rlqs.Config{Policies: func() *policy.Set { return set }, Subjects: policy.EnvoySubjects{PlainKeys: []string{"tenant"}},
		Share: func(string, string) float64 { return 1 }, Store: store, Node: "bench"})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	srv.Register(gs)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { _ = gs.Serve(lis); done <- struct{}{} }()
	go func() { _ = srv.Run(ctx); done <- struct{}{} }()
	t.Cleanup(func() {
		cancel()
		<-done // Run drained: the streams end
		gs.Stop()
		<-done
	})
	return lis.Addr().String()
}

// TestRunRLQS: 20 clients × 4 buckets over two connections hold their
// streams, report every 200 ms, get assignments and decide by them; the
// node's CPU is this process's (the node runs in it).
func TestRunRLQS(t *testing.T) {
	addr := startRLQS(t)
	cpu := func() (time.Duration, error) { return cputime.Process(), nil }
	res, err := RunRLQS(context.Background(), RLQSConfig{Addr: addr, Streams: 20, Buckets: 4, Rate: 20, ReportInterval: 200 * time.Millisecond,
		Warmup: 300 * time.Millisecond, Duration: time.Second, Conns: 2, NodeCPU: cpu})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", res)
	if res.StreamsHeld != 20 {
		t.Errorf("streams held %d, want 20", res.StreamsHeld)
	}
	// 20 streams × 4 buckets × 5 reports a second, for about a second.
	if res.Reports < 200 || res.Reports > 600 {
		t.Errorf("%d reports, want about 400", res.Reports)
	}
	if res.Assignments == 0 || res.Allowed == 0 || res.Denied == 0 {
		t.Errorf("assignments %d, allowed %d, denied %d: want assignments that admit part of 4× the budget", res.Assignments, res.Allowed, res.Denied)
	}
	if cputime.Process() > 0 && (res.NodeCPU <= 0 || res.ReportsPerNodeCPUSecond <= 0) {
		t.Errorf("node CPU %v, %v reports per CPU-second", res.NodeCPU, res.ReportsPerNodeCPUSecond)
	}
}

func TestRunRLQSConfigErrors(t *testing.T) {
	for _, c := range []RLQSConfig{
		{},
		{Addr: "x:1", Streams: MaxStreams + 1},
		{Addr: "x:1", Buckets: MaxBucketsPerStream + 1},
		{Addr: "x:1", Rate: -1},
		{Addr: "x:1", ReportInterval: time.Millisecond},
		{Addr: "x:1", Duration: -time.Second},
		{Addr: "x:1", Conns: MaxConns + 1},
	} {
		if _, err := RunRLQS(context.Background(), c); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v: error %v, want ErrInvalidConfig", c, err)
		}
	}
}

func TestParseStatCPU(t *testing.T) {
	// A command name with spaces and a parenthesis; utime 250, stime 50.
	line := "1234 (my (odd) cmd) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 4 0 100 1000000 200\n"
	got, err := parseStatCPU(line)
	if err != nil {
		t.Fatal(err)
	}
	if got != 3*time.Second {
		t.Errorf("cpu %v, want 3s", got)
	}
	for _, bad := range []string{"", "1 (x) S 1 2", "1 (x) S 1 1 1 0 -1 0 0 0 0 0 x 5 0"} {
		if _, err := parseStatCPU(bad); !errors.Is(err, ErrProcStat) {
			t.Errorf("%q: error %v, want ErrProcStat", bad, err)
		}
	}
	if cputime.Process() > 0 {
		own, err := ProcessCPU(os.Getpid())()
		if err != nil || own <= 0 {
			t.Errorf("own CPU %v, %v", own, err)
		}
	}
}
