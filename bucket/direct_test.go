package bucket_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/redistest"
)

// callerMark marks a caller's context, so that pipelineContexts can tell
// whether a pipeline went out in it.
type callerMark struct{}

// pipelineContexts records, for every pipeline a client sends, whether its
// context carries callerMark.
type pipelineContexts struct {
	mu     sync.Mutex
	marked []bool
}

func (p *pipelineContexts) DialHook(next redis.DialHook) redis.DialHook { return next }
func (p *pipelineContexts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return next
}

func (p *pipelineContexts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		p.mu.Lock()
		p.marked = append(p.marked, ctx.Value(callerMark{}) != nil)
		p.mu.Unlock()
		return next(ctx, cmds)
	}
}

func (p *pipelineContexts) sent() []bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]bool(nil), p.marked...)
}

// TestRedisLoneCallGoesDirect: a call that finds no other in the store is
// sent on its caller's goroutine, in its caller's context (no hand-off to
// a flusher, and its own deadline bounds the round trip), and a lone call
// whose context has ended is not sent at all.
func TestRedisLoneCallGoesDirect(t *testing.T) {
	c := redistest.Client(t)
	hook := &pipelineContexts{}
	c.AddHook(hook)
	r := newRedis(t, c)
	k, _ := bucket.NewKey("direct", 1, redistest.Unique(t))
	req := bucket.Request{Key: k, Limits: bucket.Limits{Capacity: 5, RefillPerSecond: 0.001, IdleTTL: 2 * time.Hour}, Share: 1, Cost: 1}
	ctx := context.WithValue(context.Background(), callerMark{}, true)
	for range 3 {
		if d, err := r.Take(ctx, req); err != nil || !d.Allowed {
			t.Fatalf("take: %+v, %v", d, err)
		}
	}
	if d, err := r.TakeAll(ctx, []bucket.Request{req}); err != nil || !d[0].Allowed {
		t.Fatalf("take-all: %+v, %v", d, err)
	}
	// A fresh server answers the first EVALSHA of a script NOSCRIPT: the
	// call is sent again, with EVAL, in a pipeline of its own.
	sent := hook.sent()
	if len(sent) < 4 {
		t.Fatalf("4 lone calls went out in %d pipelines", len(sent))
	}
	for i, marked := range sent {
		if !marked {
			t.Errorf("pipeline %d of lone calls went out in another context than its caller's: handed to a flusher", i)
		}
	}

	ended, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := r.Take(ended, req); !errors.Is(err, context.Canceled) {
		t.Fatalf("take in an ended context: %v, want context.Canceled", err)
	}
	if n := len(hook.sent()); n != len(sent) {
		t.Fatalf("a call whose context had ended was sent (%d pipelines, want %d)", n, len(sent))
	}
	if d, err := r.Take(context.Background(), bucket.Request{Key: k, Limits: req.Limits, Share: 1}); err != nil || d.Remaining < 1 || d.Remaining > 1.1 {
		t.Fatalf("bucket after 4 takes of 5 tokens: %+v, %v", d, err)
	}
}

// TestRedisDirectCallHonoursItsDeadline: a lone call to a Redis that does
// not answer returns when its caller's context ends, with the context's
// error, as a queued call does.
func TestRedisDirectCallHonoursItsDeadline(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() { // accepts and never answers
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { conn.Close() })
		}
	}()
	c := redis.NewClient(&redis.Options{Addr: l.Addr().String(), ContextTimeoutEnabled: true, MaxRetries: -1, Protocol: 2})
	t.Cleanup(func() { _ = c.Close() })
	r := newRedis(t, c)
	k, _ := bucket.NewKey("direct", 1, "silent")
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = r.Take(ctx, bucket.Request{Key: k, Limits: bucket.Limits{Capacity: 5, RefillPerSecond: 1, IdleTTL: time.Hour}, Share: 1, Cost: 1})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("take against a silent server: %v, want context.DeadlineExceeded", err)
	}
	if waited := time.Since(start); waited > 2*time.Second {
		t.Fatalf("take waited %v past its 100 ms deadline", waited)
	}
}

// gatedPipelines records, as pipelineContexts does, whether each pipeline
// went out in a caller's context, and holds the first pipeline until gate
// is closed (held is closed once it waits there).
type gatedPipelines struct {
	pipelineContexts
	once       sync.Once
	held, gate chan struct{}
}

func (p *gatedPipelines) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	inner := p.pipelineContexts.ProcessPipelineHook(next)
	return func(ctx context.Context, cmds []redis.Cmder) error {
		p.once.Do(func() {
			close(p.held)
			<-p.gate
		})
		return inner(ctx, cmds)
	}
}

// TestRedisLoneCallQueuesUnderLoad: once a flusher's pipeline has carried
// several calls (calls come concurrently), a call that finds no other in
// the store is queued all the same, where the calls that follow it join
// its pipeline, rather than sent alone on its caller's goroutine; after a
// pipeline of one call, lone calls go direct again.
func TestRedisLoneCallQueuesUnderLoad(t *testing.T) {
	c := redistest.Client(t)
	hook := &gatedPipelines{held: make(chan struct{}), gate: make(chan struct{})}
	c.AddHook(hook)
	r, err := bucket.NewRedis(bucket.RedisConfig{Client: c, Flushers: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	lim := bucket.Limits{Capacity: 100, RefillPerSecond: 1, IdleTTL: time.Hour}
	req := func(name string) bucket.Request {
		k, _ := bucket.NewKey("lone", 1, redistest.Unique(t)+name)
		return bucket.Request{Key: k, Limits: lim, Share: 1, Cost: 1}
	}
	// The flusher holds a first call at the gate while two more queue
	// behind it: they go out together, in one pipeline.
	ctx := context.Background()
	first, err := bucket.QueueTake(r, ctx, req("a"))
	if err != nil {
		t.Fatal(err)
	}
	<-hook.held
	var waits []func() (bucket.Decision, error)
	for _, name := range []string{"b", "c"} {
		w, err := bucket.QueueTake(r, ctx, req(name))
		if err != nil {
			t.Fatal(err)
		}
		waits = append(waits, w)
	}
	close(hook.gate)
	for _, w := range append(waits, first) {
		if d, err := w(); err != nil || !d.Allowed {
			t.Fatalf("queued take: %+v, %v", d, err)
		}
	}
	marked := context.WithValue(ctx, callerMark{}, true)
	for i, want := range []bool{false, true, true} {
		n := len(hook.sent())
		if d, err := r.Take(marked, req("lone")); err != nil || !d.Allowed {
			t.Fatalf("lone take %d: %+v, %v", i, d, err)
		}
		sent := hook.sent()
		// A fresh server answers the first EVALSHA NOSCRIPT: the call then
		// goes out again, in a second pipeline of the same context.
		if len(sent) == n || sent[len(sent)-1] != want {
			t.Fatalf("lone take %d went out in pipelines %v (caller's context: want %v)", i, sent[n:], want)
		}
	}
}
