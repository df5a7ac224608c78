package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/quotacoord/quota/internal/rlqs"
)

// Bounds on an RLQSConfig.
const (
	MaxStreams          = 10000
	MaxBucketsPerStream = 256
)

// RLQSConfig shapes a run of Envoy-faithful RLQS clients (rlqs.Client)
// against a node's Rate Limit Quota Service.
type RLQSConfig struct {
	// Addr is the node's gRPC address, host:port.
	Addr string
	// Streams is how many clients (one stream each) to open. Default 100.
	Streams int
	// Buckets is how many bucket ids each client uses: {Key: "b<k>"} for
	// k < Buckets, shared by every client (so the node splits each
	// bucket's rate among Streams clients). Default 10.
	Buckets int
	// Domain is sent in each stream's first message. Default "bench".
	Domain string
	// Key is the bucket id's key. Default "tenant".
	Key string
	// Rate is the requests each client offers per bucket per second,
	// decided locally. Default 10.
	Rate float64
	// ReportInterval is each client's report timer. Default 1 s.
	ReportInterval time.Duration
	// Duration is the measured time, after Warmup. Default 10 s.
	Duration, Warmup time.Duration
	// Conns is how many gRPC connections the streams share. Default 1.
	Conns int
	// NodeCPU, when set, reads the node's CPU time (user + system) at the
	// start and end of the measured time: ProcessCPU for a node running as
	// another process, cputime.Process for one in this process.
	NodeCPU func() (time.Duration, error)
}

func (c RLQSConfig) withDefaults() (RLQSConfig, error) {
	if c.Streams == 0 {
		c.Streams = 100
	}
	if c.Buckets == 0 {
		c.Buckets = 10
	}
	if c.Domain == "" {
		c.Domain = "bench"
	}
	if c.Key == "" {
		c.Key = "tenant"
	}
	if c.Rate == 0 {
		c.Rate = 10
	}
	if c.ReportInterval == 0 {
		c.ReportInterval = time.Second
	}
	if c.Duration == 0 {
		c.Duration = 10 * time.Second
	}
	if c.Conns == 0 {
		c.Conns = 1
	}
	switch {
	case c.Addr == "":
		return c, fmt.Errorf("%w: no address", ErrInvalidConfig)
	case c.Streams < 1 || c.Streams > MaxStreams:
		return c, fmt.Errorf("%w: %d streams, want 1 to %d", ErrInvalidConfig, c.Streams, MaxStreams)
	case c.Buckets < 1 || c.Buckets > MaxBucketsPerStream:
		return c, fmt.Errorf("%w: %d buckets per stream, want 1 to %d", ErrInvalidConfig, c.Buckets, MaxBucketsPerStream)
	case !(c.Rate > 0) || c.Rate > 1e6:
		return c, fmt.Errorf("%w: rate %v per bucket, want (0, 1e6]", ErrInvalidConfig, c.Rate)
	case c.ReportInterval < 10*time.Millisecond:
		return c, fmt.Errorf("%w: report interval %v, want at least 10ms", ErrInvalidConfig, c.ReportInterval)
	case c.Duration < 0 || c.Warmup < 0:
		return c, fmt.Errorf("%w: negative duration", ErrInvalidConfig)
	case c.Conns < 1 || c.Conns > MaxConns:
		return c, fmt.Errorf("%w: %d connections, want 1 to %d", ErrInvalidConfig, c.Conns, MaxConns)
	}
	return c, nil
}

// RLQSResult is what an RLQS run measured (the warmup excluded, except
// StreamsHeld and the decision counts, which cover the whole run).
type RLQSResult struct {
	Addr    string `json:"addr"`
	Streams int    `json:"streams"`
	Buckets int    `json:"buckets_per_stream"`
	// StreamsHeld counts the streams whose last report went out.
	StreamsHeld int `json:"streams_held"`
	// Reports counts bucket usage reports sent and accepted by the
	// transport (one per bucket per report timer) in the measured time.
	Reports          uint64  `json:"reports"`
	ReportsPerSecond float64 `json:"reports_per_s"`
	// Responses counts the node's responses applied.
	Responses uint64 `json:"responses"`
	// Decisions by what decided them (rlqs.ClientStats).
	Allowed      uint64 `json:"allowed"`
	Denied       uint64 `json:"denied"`
	NoAssignment uint64 `json:"no_assignment"`
	Expired      uint64 `json:"expired"`
	Assignments  uint64 `json:"assignments"`
	Abandons     uint64 `json:"abandons"`
	// ReportErrors counts report timers that found the stream down.
	ReportErrors uint64        `json:"report_errors"`
	FirstError   string        `json:"first_error,omitempty"`
	Elapsed      time.Duration `json:"elapsed_ns"`
	// NodeCPU is the node's CPU time over the measured time, and
	// ReportsPerNodeCPUSecond the reports per second of it (0 without
	// RLQSConfig.NodeCPU).
	NodeCPU                 time.Duration `json:"node_cpu_ns"`
	ReportsPerNodeCPUSecond float64       `json:"reports_per_node_cpu_s"`
}

// Print writes r as one human-readable block.
func (r RLQSResult) Print(w io.Writer) error {
	_, err := fmt.Fprintf(w, "addr %s  streams=%d  buckets/stream=%d\n"+
		"RLQS: streams held %d, reports %d in %v (%.0f/s), %.0f reports per node CPU-second (node CPU %v)\n"+
		"decisions: allowed %d, denied %d (no assignment %d, expired %d); assignments %d, abandons %d, responses %d\n",
		r.Addr, r.Streams, r.Buckets, r.StreamsHeld, r.Reports, r.Elapsed.Round(time.Millisecond), r.ReportsPerSecond,
		r.ReportsPerNodeCPUSecond, r.NodeCPU.Round(time.Millisecond),
		r.Allowed, r.Denied, r.NoAssignment, r.Expired, r.Assignments, r.Abandons, r.Responses)
	if err == nil && r.FirstError != "" {
		_, err = fmt.Fprintf(w, "report errors %d, first: %s\n", r.ReportErrors, r.FirstError)
	}
	return err
}

// RunRLQS opens cfg.Streams clients, each on its own goroutine: it offers
// cfg.Rate requests per bucket per second (decided by the client's local
// assignment) and fires its report timer every cfg.ReportInterval, the
// clients' timers spread over one interval. It returns after the warmup
// and the measured time, or when ctx ends; an error for a bad config, a
// failed dial, or when no stream could be opened.
func RunRLQS(ctx context.Context, cfg RLQSConfig) (RLQSResult, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return RLQSResult{}, err
	}
	conns, closeConns, err := dial(cfg.Addr, cfg.Conns)
	if err != nil {
		return RLQSResult{}, err
	}
	defer closeConns()
	ids := make([]map[string]string, cfg.Buckets)
	for k := range ids {
		ids[k] = map[string]string{cfg.Key: "b" + strconv.Itoa(k)}
	}
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	clients := make([]*rlqs.Client, 0, cfg.Streams)
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	for i := range cfg.Streams {
		c := rlqs.NewClient(rlqs.ClientConfig{Domain: cfg.Domain, NoAssignment: rlqs.DenyAll, Expired: rlqs.DenyAll, ReportNew: true})
		if err := c.Connect(sctx, conns[i%len(conns)]); err != nil {
			return RLQSResult{}, fmt.Errorf("loadgen: open stream %d: %w", i, err)
		}
		clients = append(clients, c)
	}
	var (
		mu       sync.Mutex
		measure  bool
		reports  uint64
		repErrs  uint64
		firstErr error
		up       = make([]bool, len(clients)) // the last report went out
	)
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			drive(sctx, c, ids, cfg, time.Duration(i)*cfg.ReportInterval/time.Duration(len(clients)), func(n int, err error) {
				mu.Lock()
				defer mu.Unlock()
				up[i] = err == nil
				if err != nil {
					repErrs++
					if firstErr == nil {
						firstErr = err
					}
					return
				}
				if measure {
					reports += uint64(n)
				}
			})
		}()
	}
	wait := func(d time.Duration) {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		}
	}
	wait(cfg.Warmup)
	cpu0, cpuErr := readCPU(cfg.NodeCPU)
	mu.Lock()
	measure = true
	mu.Unlock()
	start := time.Now()
	wait(cfg.Duration)
	mu.Lock()
	measure = false
	res := RLQSResult{Addr: cfg.Addr, Streams: cfg.Streams, Buckets: cfg.Buckets, Reports: reports, ReportErrors: repErrs, Elapsed: time.Since(start)}
	for _, u := range up {
		if u {
			res.StreamsHeld++
		}
	}
	mu.Unlock()
	cpu1, err := readCPU(cfg.NodeCPU)
	if cpuErr == nil {
		cpuErr = err
	}
	if cpuErr != nil {
		return RLQSResult{}, fmt.Errorf("loadgen: node CPU: %w", cpuErr)
	}
	stop()
	wg.Wait()
	for _, c := range clients {
		st := c.Stats()
		res.Allowed += st.Allowed
		res.Denied += st.Denied
		res.NoAssignment += st.NoAssignment
		res.Expired += st.Expired
		res.Assignments += st.Assignments
		res.Abandons += st.Abandons
		res.Responses += c.Responses()
	}
	if firstErr != nil {
		res.FirstError = firstErr.Error()
	}
	if s := res.Elapsed.Seconds(); s > 0 {
		res.ReportsPerSecond = float64(res.Reports) / s
	}
	if res.NodeCPU = cpu1 - cpu0; res.NodeCPU > 0 {
		res.ReportsPerNodeCPUSecond = float64(res.Reports) / res.NodeCPU.Seconds()
	}
	if res.Reports == 0 && ctx.Err() == nil {
		return res, fmt.Errorf("loadgen: no usage report reached %s (first error: %s)", cfg.Addr, res.FirstError)
	}
	return res, nil
}

// drive offers c its load until ctx ends: every 10 ms each bucket's share
// of Rate, and a report every ReportInterval from offset on. done is told
// each report's usage entries, or its error.
func drive(ctx context.Context, c *rlqs.Client, ids []map[string]string, cfg RLQSConfig, offset time.Duration, done func(int, error)) {
	const step = 10 * time.Millisecond
	tick := time.NewTicker(step)
	defer tick.Stop()
	next := time.Now().Add(offset)
	acc := 0.0
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			acc += cfg.Rate * step.Seconds()
			for ; acc >= 1; acc-- {
				for _, id := range ids {
					c.Allow(id)
				}
			}
			if now.Before(next) {
				continue
			}
			next = next.Add(cfg.ReportInterval)
			if err := c.Report(); err != nil {
				if ctx.Err() == nil {
					done(0, err)
				}
				continue
			}
			done(len(ids), nil)
		}
	}
}

func readCPU(f func() (time.Duration, error)) (time.Duration, error) {
	if f == nil {
		return 0, nil
	}
	return f()
}

// userHZ is the kernel's USER_HZ, the unit of /proc/<pid>/stat's CPU
// times: 100 on every Linux architecture Go supports.
const userHZ = 100

// ErrProcStat reports a /proc/<pid>/stat that cannot be read or parsed.
var ErrProcStat = errors.New("loadgen: bad /proc stat")

// ProcessCPU returns a function reading the CPU time (user + system) of
// process pid from /proc/<pid>/stat (Linux), in steps of 10 ms.
func ProcessCPU(pid int) func() (time.Duration, error) {
	return func() (time.Duration, error) {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return 0, fmt.Errorf("%w: %w", ErrProcStat, err)
		}
		return parseStatCPU(string(b))
	}
}

// parseStatCPU reads utime + stime (fields 14 and 15) from a
// /proc/<pid>/stat line; the command name (field 2) may hold spaces and
// parentheses, so fields are counted after its last ')'.
func parseStatCPU(line string) (time.Duration, error) {
	i := strings.LastIndexByte(line, ')')
	if i < 0 {
		return 0, fmt.Errorf("%w: no command field", ErrProcStat)
	}
	f := strings.Fields(line[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("%w: %d fields after the command", ErrProcStat, len(f))
	}
	var ticks uint64
	for _, s := range f[11:13] {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%w: %w", ErrProcStat, err)
		}
		ticks += v
	}
	if ticks > math.MaxInt64/uint64(time.Second/userHZ) {
		return 0, fmt.Errorf("%w: %d ticks", ErrProcStat, ticks)
	}
	return time.Duration(ticks) * (time.Second / userHZ), nil
}
