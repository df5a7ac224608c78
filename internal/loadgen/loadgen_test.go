package loadgen

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/quotacoord/quota/internal/redistest"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestHistBuckets(t *testing.T) {
	tests := []struct {
		v      int64
		bucket int
	}{{0, 0}, {255, 255}, {256, 256}, {257, 256}, {258, 257}, {511, 383}, {512, 384}, {1 << 40, 256 + 32*128}}
	for _, tt := range tests {
		if got := bucketOf(tt.v); got != tt.bucket {
			t.Errorf("bucketOf(%d) = %d, want %d", tt.v, got, tt.bucket)
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 100000; i++ {
		v := r.Int64N(1<<50) >> r.IntN(50)
		b := bucketOf(v)
		lo := lowerBound(b)
		if lo > v || float64(v-lo) > float64(v)/128 || (b+1 < histBuckets && lowerBound(b+1) <= v) {
			t.Fatalf("v=%d bucket %d lower bound %d next %d", v, b, lo, lowerBound(b+1))
		}
	}
}

func TestHistQuantiles(t *testing.T) {
	h := newHist()
	for i := 1; i <= 100; i++ {
		h.record(time.Duration(i) * time.Microsecond)
	}
	for _, tt := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 51 * time.Microsecond}, {0.99, 100 * time.Microsecond}, {0, time.Microsecond}} {
		got := h.quantile(tt.q)
		if got > tt.want || float64(tt.want-got) > float64(tt.want)/128 {
			t.Errorf("q%.2f = %v, want %v within 0.8%%", tt.q, got, tt.want)
		}
	}
	if h.max != 100*time.Microsecond || h.mean() != 50500*time.Nanosecond {
		t.Errorf("max %v mean %v", h.max, h.mean())
	}
}

func TestPicker(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	const n, draws = 100, 200000
	for _, s := range []float64{0, 1.1} {
		p := newPicker(n, s)
		counts := make([]int, n)
		for i := 0; i < draws; i++ {
			counts[p.pick(r)]++
		}
		if s == 0 {
			for i, c := range counts {
				if c < draws/n/2 || c > draws/n*2 {
					t.Fatalf("uniform: subject %d drawn %d times of %d", i, c, draws)
				}
			}
			continue
		}
		// Zipf: P(rank 1)/P(rank 2) = 2^s.
		ratio := float64(counts[0]) / float64(counts[1])
		if ratio < 1.9 || ratio > 2.4 || counts[0] < counts[n-1]*50 {
			t.Fatalf("zipf 1.1: first/second = %.2f, first %d last %d", ratio, counts[0], counts[n-1])
		}
	}
}

func TestConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"defaults", Config{Addr: "x:1", Requests: 1}, true},
		{"no addr", Config{Requests: 1}, false},
		{"unbounded", Config{Addr: "x:1"}, false},
		{"too many callers", Config{Addr: "x:1", Requests: 1, Concurrency: MaxConcurrency + 1}, false},
		{"bad zipf", Config{Addr: "x:1", Requests: 1, Zipf: -1}, false},
		{"too many descriptors", Config{Addr: "x:1", Requests: 1, Descriptors: MaxDescriptors + 1}, false},
		{"too many subjects", Config{Addr: "x:1", Requests: 1, Subjects: MaxSubjects + 1}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := tt.cfg.withDefaults()
			if tt.ok != (err == nil) {
				t.Fatalf("err = %v", err)
			}
			if err != nil && !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("err %v is not ErrInvalidConfig", err)
			}
			if tt.ok && (c.Concurrency != 50 || c.Subjects != 10000 || c.Descriptors != 1 || c.Domain != "bench" || c.Conns != 1) {
				t.Fatalf("defaults %+v", c)
			}
		})
	}
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestRunAgainstNoop(t *testing.T) {
	l := listen(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ServeNoop(ctx, l) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	res, err := Run(context.Background(), Config{Addr: l.Addr().String(), Concurrency: 4, Requests: 300, Descriptors: 3})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != 300 || res.OK != 300 || res.Errors != 0 || res.P50 <= 0 || res.P99 < res.P50 || res.Max < res.P99 {
		t.Fatalf("result %+v", res)
	}
	if res.DecisionsPerSecond != 3*res.RequestsPerSecond {
		t.Fatalf("decisions/s %v, requests/s %v", res.DecisionsPerSecond, res.RequestsPerSecond)
	}
}

// judge denies subject s0 and records what it was sent.
type judge struct {
	rlsv3.UnimplementedRateLimitServiceServer
	mu   sync.Mutex
	n    int
	keys map[string]bool
	bad  int
}

func (j *judge) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.n++
	v := ""
	for _, d := range req.GetDescriptors() {
		if len(d.GetEntries()) != 1 || (v != "" && d.GetEntries()[0].GetValue() != v) || req.GetDomain() != "d" || req.GetHitsAddend() != 7 {
			j.bad++
		}
		v = d.GetEntries()[0].GetValue()
		j.keys[d.GetEntries()[0].GetKey()] = true
	}
	code := rlsv3.RateLimitResponse_OK
	if v == "s0" {
		code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	return &rlsv3.RateLimitResponse{OverallCode: code}, nil
}

func TestRunCountsOverLimitAndShapesRequests(t *testing.T) {
	l := listen(t)
	j := &judge{keys: map[string]bool{}}
	s := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(s, j)
	go func() { _ = s.Serve(l) }()
	defer s.Stop()
	res, err := Run(context.Background(), Config{Addr: l.Addr().String(), Concurrency: 3, Requests: 400, Descriptors: 2,
		Subjects: 50, Zipf: 2, Domain: "d", Key: "k", HitsAddend: 7, Warmup: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != 400 || res.OK+res.OverLimit != 400 || res.OverLimit < 100 || res.OK == 0 {
		t.Fatalf("result %+v", res)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.n < 400 || j.bad != 0 || len(j.keys) != 2 || !j.keys["k0"] || !j.keys["k1"] {
		t.Fatalf("server saw %d requests, %d malformed, keys %v", j.n, j.bad, j.keys)
	}
}

func TestRunDurationBound(t *testing.T) {
	l := listen(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ServeNoop(ctx, l) }()
	defer func() { cancel(); <-done }()
	start := time.Now()
	res, err := Run(context.Background(), Config{Addr: l.Addr().String(), Concurrency: 2, Duration: 150 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 150*time.Millisecond || took > 2*time.Second || res.Requests == 0 {
		t.Fatalf("took %v, result %+v", took, res)
	}
}

func TestRunUnreachable(t *testing.T) {
	l := listen(t)
	addr := l.Addr().String()
	l.Close()
	_, err := Run(context.Background(), Config{Addr: addr, Concurrency: 2, Requests: 4, Timeout: 200 * time.Millisecond})
	if err == nil {
		t.Fatal("no error against a closed port")
	}
}

func TestServeRoundTripPingsOncePerCheck(t *testing.T) {
	srv := redistest.Start(t)
	rc := srv.Client(t)
	l := listen(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ServeRoundTrip(ctx, l, srv.Addr) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	pings := func() int64 {
		info, err := rc.Info(context.Background(), "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		for _, line := range strings.Split(info, "\r\n") {
			if rest, ok := strings.CutPrefix(line, "cmdstat_ping:calls="); ok {
				n, _ = strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
			}
		}
		return n
	}
	before := pings()
	res, err := Run(context.Background(), Config{Addr: l.Addr().String(), Concurrency: 8, Requests: 400})
	if err != nil {
		t.Fatal(err)
	}
	if res.OK != 400 || res.Errors != 0 {
		t.Fatalf("result %+v", res)
	}
	if got := pings() - before; got != 400 {
		t.Fatalf("%d PINGs for 400 checks", got)
	}

	// Without Redis no check is answered OK.
	srv.Stop()
	res, err = Run(context.Background(), Config{Addr: l.Addr().String(), Concurrency: 2, Requests: 20, Timeout: 5 * time.Second})
	if err == nil || res.OK != 0 || res.Errors != 20 || !strings.Contains(res.FirstError, "Unavailable") {
		t.Fatalf("after Redis stopped: %+v, %v", res, err)
	}
}
