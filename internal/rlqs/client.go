package rlqs

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/quotacoord/quota/internal/clock"
)

// Behavior is what the filter does with a request of a bucket that has no
// assignment in force.
type Behavior int

// The blanket behaviours.
const (
	AllowAll Behavior = iota
	DenyAll
)

// ClientConfig configures a Client.
type ClientConfig struct {
	// Domain is sent in the stream's first message.
	Domain string
	// NoAssignment applies to a bucket before its first assignment
	// (no_assignment_behavior). The filter's default lets traffic
	// through: AllowAll.
	NoAssignment Behavior
	// Expired applies after an assignment's TTL passed
	// (expired_assignment_behavior's fallback).
	Expired Behavior
	// ReportNew sends a usage report for a new bucket at its first request.
	ReportNew bool
	// Clock times token refills and TTLs. Default clock.Real{}.
	Clock clock.Clock
}

// ClientStats counts a Client's decisions by what decided them.
type ClientStats struct {
	Allowed, Denied, NoAssignment, Expired, Assignments, Abandons uint64
}

// Client does what Envoy's rate_limit_quota filter does, for tests and
// load generators: it decides requests locally from its assignments,
// reports usage per bucket when Report is called (the filter's report
// timer), and applies the server's actions as the filter does:
//
//   - a token_bucket assignment starts a new bucket holding max_tokens,
//     refilled continuously at tokens_per_fill per fill_interval, the
//     interval truncated to whole seconds; an assignment equal to the one
//     in force only extends its TTL and keeps the tokens;
//   - TTLs are truncated to whole seconds; no TTL never expires; TTL 0
//     expires at once; an expired assignment decides by Expired;
//   - a blanket rule allows or denies everything; requests_per_time_unit
//     is not enforced (the filter lets such traffic through);
//   - abandon_action drops the bucket: its next request starts it again,
//     without assignment;
//   - time_elapsed is whole seconds (truncated, so it can be 0); usage
//     counted while the stream is down is dropped at the next report.
//
// Client is safe for concurrent use.
type Client struct {
	cfg       ClientConfig
	mu        sync.Mutex
	buckets   map[string]*clientBucket
	st        grpc.BidiStreamingClient[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]
	sentFirst bool
	stats     ClientStats
	responses atomic.Uint64
	done      chan struct{}
	resume    chan struct{} // non-nil while paused: closed by Resume
}

type clientBucket struct {
	id              map[string]string
	allowed, denied uint64
	lastReport      time.Time
	has             bool
	strategy        *typev3.RateLimitStrategy
	expires         time.Time // zero: never
	tokens, max     float64
	rate            float64 // tokens per second
	ts              time.Time
}

// NewClient returns a Client that is not connected.
func NewClient(cfg ClientConfig) *Client {
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	return &Client{cfg: cfg, buckets: map[string]*clientBucket{}}
}

// Connect opens the stream and starts the goroutine that applies the
// server's responses; it ends with the stream (ctx, Close, or an error).
func (c *Client) Connect(ctx context.Context, conn grpc.ClientConnInterface) error {
	st, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.st, c.sentFirst, c.done = st, false, make(chan struct{})
	done := c.done
	c.mu.Unlock()
	go func() {
		defer close(done)
		for {
			c.mu.Lock()
			resume := c.resume
			c.mu.Unlock()
			if resume != nil {
				<-resume
			}
			r, err := st.Recv()
			if err != nil {
				c.mu.Lock()
				if c.st == st {
					c.st = nil
				}
				c.mu.Unlock()
				return
			}
			c.apply(r)
			c.responses.Add(1)
		}
	}()
	return nil
}

// Pause stops reading the server's responses, as a stopped Envoy process
// does: what the server sends waits in the stream's flow-control window
// and, once that is full, in the server. The caller stops calling Allow
// and Report for the pause.
func (c *Client) Pause() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.resume == nil {
		c.resume = make(chan struct{})
	}
}

// Resume reads again: every response that waited is applied in order.
func (c *Client) Resume() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.resume != nil {
		close(c.resume)
		c.resume = nil
	}
}

// Close ends the stream (assignments stay in force until their TTL) and
// waits for the response goroutine.
func (c *Client) Close() {
	c.Resume()
	c.mu.Lock()
	st, done := c.st, c.done
	c.st = nil
	c.mu.Unlock()
	if st != nil {
		_ = st.CloseSend()
	}
	if done != nil {
		<-done
	}
}

// Responses returns how many responses the client has applied.
func (c *Client) Responses() uint64 { return c.responses.Load() }

// Stats returns the decisions so far.
func (c *Client) Stats() ClientStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

// Allow decides one request of the bucket id at the clock's time.
func (c *Client) Allow(id map[string]string) bool {
	now := c.cfg.Clock.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	k := idKey(id)
	b := c.buckets[k]
	fresh := b == nil
	if fresh {
		b = &clientBucket{id: id, lastReport: now}
		c.buckets[k] = b
	}
	var ok bool
	switch {
	case !b.has:
		ok = c.cfg.NoAssignment == AllowAll
		c.stats.NoAssignment++
	case !b.expires.IsZero() && !now.Before(b.expires):
		ok = c.cfg.Expired == AllowAll
		c.stats.Expired++
	default:
		ok = b.decide(now)
	}
	if ok {
		b.allowed++
		c.stats.Allowed++
	} else {
		b.denied++
		c.stats.Denied++
	}
	if fresh && c.cfg.ReportNew {
		_ = c.sendLocked(now, []*clientBucket{b})
	}
	return ok
}

func (b *clientBucket) decide(now time.Time) bool {
	switch s := b.strategy.GetStrategy().(type) {
	case *typev3.RateLimitStrategy_BlanketRule_:
		return s.BlanketRule == typev3.RateLimitStrategy_ALLOW_ALL
	case *typev3.RateLimitStrategy_TokenBucket:
		if dt := now.Sub(b.ts); dt > 0 {
			b.tokens = min(b.max, b.tokens+b.rate*dt.Seconds())
			b.ts = now
		}
		if b.tokens >= 1 {
			b.tokens--
			return true
		}
		return false
	}
	return true // requests_per_time_unit: not enforced by the filter
}

// ErrNotConnected reports a Report without a stream; the usage counted
// since the last report is dropped, as the filter drops it.
var ErrNotConnected = errors.New("rlqs: client not connected")

// Report sends every bucket's usage since its last report (the filter's
// report timer firing).
func (c *Client) Report() error {
	now := c.cfg.Clock.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	bs := make([]*clientBucket, 0, len(c.buckets))
	for _, b := range c.buckets {
		bs = append(bs, b)
	}
	return c.sendLocked(now, bs)
}

func (c *Client) sendLocked(now time.Time, bs []*clientBucket) error {
	r := &rlqsv3.RateLimitQuotaUsageReports{}
	for _, b := range bs {
		el := now.Sub(b.lastReport).Truncate(time.Second)
		r.BucketQuotaUsages = append(r.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId:           &rlqsv3.BucketId{Bucket: b.id},
			TimeElapsed:        durationpb.New(el),
			NumRequestsAllowed: b.allowed, NumRequestsDenied: b.denied,
		})
		b.allowed, b.denied, b.lastReport = 0, 0, b.lastReport.Add(el)
	}
	if c.st == nil {
		return ErrNotConnected
	}
	if !c.sentFirst {
		r.Domain = c.cfg.Domain
	}
	if err := c.st.Send(r); err != nil {
		return err
	}
	c.sentFirst = true
	return nil
}

// apply applies one response, action by action, in order.
func (c *Client) apply(r *rlqsv3.RateLimitQuotaResponse) {
	now := c.cfg.Clock.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, a := range r.GetBucketAction() {
		k := idKey(a.GetBucketId().GetBucket())
		b := c.buckets[k]
		if b == nil {
			continue
		}
		if a.GetAbandonAction() != nil {
			delete(c.buckets, k)
			c.stats.Abandons++
			continue
		}
		qa := a.GetQuotaAssignmentAction()
		if qa == nil {
			continue
		}
		c.stats.Assignments++
		b.expires = time.Time{}
		if ttl := qa.GetAssignmentTimeToLive(); ttl != nil {
			b.expires = now.Add(ttl.AsDuration().Truncate(time.Second))
		}
		st := qa.GetRateLimitStrategy()
		if b.has && proto.Equal(st, b.strategy) {
			continue // the same assignment: a longer TTL, the same tokens
		}
		b.has, b.strategy = true, st
		if tb := st.GetTokenBucket(); tb != nil {
			per := uint32(1)
			if p := tb.GetTokensPerFill(); p != nil {
				per = p.GetValue()
			}
			fill := tb.GetFillInterval().AsDuration().Truncate(time.Second)
			b.max, b.tokens, b.ts, b.rate = float64(tb.GetMaxTokens()), float64(tb.GetMaxTokens()), now, 0
			if fill > 0 {
				b.rate = float64(per) / fill.Seconds()
			}
		}
	}
}
