package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"runtime"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Bounds on a Config.
const (
	MaxConcurrency = 10000
	MaxSubjects    = 10_000_000
	MaxDescriptors = 64
	MaxConns       = 64
)

// ErrInvalidConfig reports a Config that Run cannot use.
var ErrInvalidConfig = errors.New("loadgen: invalid config")

// Config shapes one run.
type Config struct {
	// Addr is the rate limit service, host:port.
	Addr string
	// Concurrency is the number of callers. Default 50.
	Concurrency int
	// Requests stops the run after this many requests; 0 means no count.
	Requests int64
	// Duration stops the run after this long (plus Warmup); 0 means no
	// time limit. At least one of Requests and Duration is required.
	Duration time.Duration
	// Warmup runs the load this long before measuring. It counts against
	// neither Requests nor Duration.
	Warmup time.Duration
	// Subjects is how many distinct subjects are drawn. Default 10000.
	Subjects int
	// Zipf, when > 0, skews subjects: rank k has weight 1/k^Zipf.
	Zipf float64
	// Descriptors per request. Default 1.
	Descriptors int
	// Domain of every request. Default "bench".
	Domain string
	// Key is the descriptor entry key. Default "tenant".
	Key string
	// HitsAddend of every request; 0 leaves it unset (Envoy: 1).
	HitsAddend uint32
	// Timeout bounds one request. Default 5 s.
	Timeout time.Duration
	// Conns is the number of gRPC connections the callers share. Default 1.
	Conns int
}

func (c Config) withDefaults() (Config, error) {
	if c.Concurrency == 0 {
		c.Concurrency = 50
	}
	if c.Subjects == 0 {
		c.Subjects = 10000
	}
	if c.Descriptors == 0 {
		c.Descriptors = 1
	}
	if c.Domain == "" {
		c.Domain = "bench"
	}
	if c.Key == "" {
		c.Key = "tenant"
	}
	if c.Timeout == 0 {
		c.Timeout = 5 * time.Second
	}
	if c.Conns == 0 {
		c.Conns = 1
	}
	switch {
	case c.Addr == "":
		return c, fmt.Errorf("%w: no address", ErrInvalidConfig)
	case c.Concurrency < 1 || c.Concurrency > MaxConcurrency:
		return c, fmt.Errorf("%w: concurrency %d, want 1 to %d", ErrInvalidConfig, c.Concurrency, MaxConcurrency)
	case c.Requests < 0 || c.Duration < 0 || c.Warmup < 0:
		return c, fmt.Errorf("%w: negative request count or duration", ErrInvalidConfig)
	case c.Requests == 0 && c.Duration == 0:
		return c, fmt.Errorf("%w: give a request count or a duration", ErrInvalidConfig)
	case c.Subjects < 1 || c.Subjects > MaxSubjects:
		return c, fmt.Errorf("%w: %d subjects, want 1 to %d", ErrInvalidConfig, c.Subjects, MaxSubjects)
	case math.IsNaN(c.Zipf) || math.IsInf(c.Zipf, 0) || c.Zipf < 0 || c.Zipf > 10:
		return c, fmt.Errorf("%w: zipf exponent %v, want 0 (uniform) to 10", ErrInvalidConfig, c.Zipf)
	case c.Descriptors < 1 || c.Descriptors > MaxDescriptors:
		return c, fmt.Errorf("%w: %d descriptors, want 1 to %d", ErrInvalidConfig, c.Descriptors, MaxDescriptors)
	case c.Timeout < 0:
		return c, fmt.Errorf("%w: negative timeout", ErrInvalidConfig)
	case c.Conns < 1 || c.Conns > MaxConns:
		return c, fmt.Errorf("%w: %d connections, want 1 to %d", ErrInvalidConfig, c.Conns, MaxConns)
	}
	return c, nil
}

// Result is what one run measured (the warmup excluded).
type Result struct {
	Addr        string        `json:"addr"`
	Concurrency int           `json:"concurrency"`
	Subjects    int           `json:"subjects"`
	Zipf        float64       `json:"zipf"`
	Descriptors int           `json:"descriptors"`
	Requests    uint64        `json:"requests"`
	OK          uint64        `json:"ok"`
	OverLimit   uint64        `json:"over_limit"`
	Errors      uint64        `json:"errors"`
	FirstError  string        `json:"first_error,omitempty"`
	Elapsed     time.Duration `json:"elapsed_ns"`
	// RequestsPerSecond counts answered requests (errors excluded).
	RequestsPerSecond float64 `json:"requests_per_s"`
	// DecisionsPerSecond counts descriptor decisions: requests/s times
	// descriptors per request.
	DecisionsPerSecond float64       `json:"decisions_per_s"`
	P50                time.Duration `json:"p50_ns"`
	P90                time.Duration `json:"p90_ns"`
	P99                time.Duration `json:"p99_ns"`
	Max                time.Duration `json:"max_ns"`
	Mean               time.Duration `json:"mean_ns"`
}

// Print writes r as one human-readable block.
func (r Result) Print(w io.Writer) error {
	_, err := fmt.Fprintf(w, "addr %s  c=%d  subjects=%d zipf=%g  descriptors=%d\n"+
		"requests %d (ok %d, over_limit %d, errors %d) in %v\n"+
		"%.0f decisions/s  %.0f requests/s\n"+
		"latency p50 %v  p90 %v  p99 %v  max %v  mean %v\n",
		r.Addr, r.Concurrency, r.Subjects, r.Zipf, r.Descriptors,
		r.Requests, r.OK, r.OverLimit, r.Errors, r.Elapsed.Round(time.Millisecond),
		r.DecisionsPerSecond, r.RequestsPerSecond,
		r.P50, r.P90, r.P99, r.Max, r.Mean)
	if err == nil && r.FirstError != "" {
		_, err = fmt.Fprintf(w, "first error: %s\n", r.FirstError)
	}
	return err
}

// picker draws subject indexes.
type picker struct {
	n   int
	cdf []float64 // nil: uniform
}

func newPicker(n int, s float64) *picker {
	p := &picker{n: n}
	if s > 0 {
		p.cdf = make([]float64, n)
		sum := 0.0
		for k := 1; k <= n; k++ {
			sum += math.Pow(float64(k), -s)
			p.cdf[k-1] = sum
		}
		for i := range p.cdf {
			p.cdf[i] /= sum
		}
	}
	return p
}

func (p *picker) pick(r *rand.Rand) int {
	if p.cdf == nil {
		return r.IntN(p.n)
	}
	i := sort.SearchFloat64s(p.cdf, r.Float64())
	if i >= p.n {
		i = p.n - 1
	}
	return i
}

type worker struct {
	h                        *hist
	requests, ok, over, errs uint64
	firstErr                 error
}

// dial opens n gRPC connections to addr, with fixed flow-control windows
// as Envoy's HTTP/2 client keeps (no bandwidth-delay PING rides along);
// closeAll closes them.
func dial(addr string, n int) (conns []*grpc.ClientConn, closeAll func(), err error) {
	closeAll = func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}
	for range n {
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithInitialWindowSize(1<<20), grpc.WithInitialConnWindowSize(1<<20))
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("loadgen: dial %s: %w", addr, err)
		}
		conns = append(conns, c)
	}
	return conns, closeAll, nil
}

// Run drives the load described by cfg until it is done or ctx is. It
// returns an error for a bad Config, a failed dial, or when no request
// at all was answered.
func Run(ctx context.Context, cfg Config) (Result, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return Result{}, err
	}
	conns, closeConns, err := dial(cfg.Addr, cfg.Conns)
	if err != nil {
		return Result{}, err
	}
	defer closeConns()
	subjects := make([]string, cfg.Subjects)
	for i := range subjects {
		subjects[i] = "s" + strconv.Itoa(i)
	}
	keys := make([]string, cfg.Descriptors)
	for i := range keys {
		keys[i] = cfg.Key
		if cfg.Descriptors > 1 {
			keys[i] = cfg.Key + strconv.Itoa(i)
		}
	}
	pk := newPicker(cfg.Subjects, cfg.Zipf)

	var issued atomic.Int64
	var measuring atomic.Bool
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	measureFrom := start.Add(cfg.Warmup)
	var deadline time.Time
	if cfg.Duration > 0 {
		deadline = measureFrom.Add(cfg.Duration)
	}
	if cfg.Warmup == 0 {
		measuring.Store(true)
	}

	workers := make([]*worker, cfg.Concurrency)
	var wg sync.WaitGroup
	for w := range workers {
		wk := &worker{h: newHist()}
		workers[w] = wk
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			client := rlsv3.NewRateLimitServiceClient(conns[w%len(conns)])
			rng := rand.New(rand.NewPCG(uint64(w)+1, 0x9e3779b97f4a7c15))
			req := &rlsv3.RateLimitRequest{Domain: cfg.Domain, HitsAddend: cfg.HitsAddend}
			entries := make([]*rlcommon.RateLimitDescriptor_Entry, cfg.Descriptors)
			for i := range entries {
				entries[i] = &rlcommon.RateLimitDescriptor_Entry{Key: keys[i]}
				req.Descriptors = append(req.Descriptors, &rlcommon.RateLimitDescriptor{Entries: entries[i : i+1]})
			}
			for runCtx.Err() == nil {
				if !measuring.Load() && !time.Now().Before(measureFrom) {
					measuring.Store(true)
				}
				m := measuring.Load()
				if m && cfg.Requests > 0 && issued.Add(1) > cfg.Requests {
					return
				}
				subject := subjects[pk.pick(rng)]
				for _, e := range entries {
					e.Value = subject
				}
				t0 := time.Now()
				if m && !deadline.IsZero() && !t0.Before(deadline) {
					return
				}
				rctx, rcancel := context.WithTimeout(runCtx, cfg.Timeout)
				resp, err := client.ShouldRateLimit(rctx, req)
				rcancel()
				d := time.Since(t0)
				if !m {
					continue
				}
				if err != nil {
					if runCtx.Err() != nil {
						return
					}
					wk.errs++
					if wk.firstErr == nil {
						wk.firstErr = err
					}
					continue
				}
				wk.requests++
				wk.h.record(d)
				if resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
					wk.over++
				} else {
					wk.ok++
				}
			}
		}(w)
	}
	wg.Wait()
	end := time.Now()

	total := newHist()
	res := Result{Addr: cfg.Addr, Concurrency: cfg.Concurrency, Subjects: cfg.Subjects, Zipf: cfg.Zipf, Descriptors: cfg.Descriptors}
	for _, wk := range workers {
		total.merge(wk.h)
		res.Requests += wk.requests
		res.OK += wk.ok
		res.OverLimit += wk.over
		res.Errors += wk.errs
		if res.FirstError == "" && wk.firstErr != nil {
			res.FirstError = wk.firstErr.Error()
		}
	}
	if end.After(measureFrom) {
		res.Elapsed = end.Sub(measureFrom)
	}
	if s := res.Elapsed.Seconds(); s > 0 {
		res.RequestsPerSecond = float64(res.Requests) / s
		res.DecisionsPerSecond = res.RequestsPerSecond * float64(cfg.Descriptors)
	}
	res.P50, res.P90, res.P99 = total.quantile(0.50), total.quantile(0.90), total.quantile(0.99)
	res.Max, res.Mean = total.max, total.mean()
	if res.Requests == 0 {
		if ctx.Err() != nil {
			return res, fmt.Errorf("loadgen: cancelled before any answer: %w", ctx.Err())
		}
		return res, fmt.Errorf("loadgen: no request to %s was answered (%d errors; first: %s)", cfg.Addr, res.Errors, res.FirstError)
	}
	return res, nil
}

// noop answers every check OK at once, one OK status per descriptor.
type noop struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (noop) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	st := make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(req.GetDescriptors()))
	for i := range st {
		st[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	}
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: st}, nil
}

// ServeNoop serves a rate limit service that does no work on lis until
// ctx is done, then stops it and returns nil (or the serve error). Its
// gRPC server options are the regional node's, so that the ceiling and
// the node differ only in the work.
func ServeNoop(ctx context.Context, lis net.Listener) error {
	return serve(ctx, lis, noop{})
}

// ServeRoundTrip serves, as ServeNoop does, a rate limit service that
// answers every check OK, but only after one PING to the Redis server at
// redisAddr and its reply, on a plain RESP connection: the latency floor
// of any service that asks Redis once per check. A check whose PING fails
// is answered Unavailable.
func ServeRoundTrip(ctx context.Context, lis net.Listener, redisAddr string) error {
	rt := newRoundTrip(redisAddr)
	defer rt.close()
	return serve(ctx, lis, rt)
}

func serve(ctx context.Context, lis net.Listener, srv rlsv3.RateLimitServiceServer) error {
	s := grpc.NewServer(grpc.NumStreamWorkers(uint32(4*runtime.GOMAXPROCS(0))),
		grpc.InitialWindowSize(1<<20), grpc.InitialConnWindowSize(1<<20)) // as the node (regional.GRPCWindow)
	rlsv3.RegisterRateLimitServiceServer(s, srv)
	errc := make(chan error, 1)
	go func() { errc <- s.Serve(lis) }()
	select {
	case <-ctx.Done():
		s.Stop()
		<-errc
		return nil
	case err := <-errc:
		return fmt.Errorf("loadgen: no-work server: %w", err)
	}
}
