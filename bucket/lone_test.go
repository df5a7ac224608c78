package bucket_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/clock"
	"github.com/quotacoord/quota/internal/redistest"
)

// watchedConns dials the connections of a go-redis client and counts what
// the client does on them: dials, and health checks. go-redis checks a
// connection it takes from its pool by peeking at the socket through
// SyscallConn's RawConn.Read; replies are read through Read, so every
// RawConn.Read is one health check.
type watchedConns struct {
	dials, checks atomic.Int64
	// refuse makes dials fail.
	refuse atomic.Bool
	// breaks is how many of the next writes close their connection once
	// the command is sent.
	breaks atomic.Int64

	mu    sync.Mutex
	conns []net.Conn
}

func (w *watchedConns) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if w.refuse.Load() {
		return nil, errors.New("watchedConns: dial refused by the test")
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	w.dials.Add(1)
	w.mu.Lock()
	w.conns = append(w.conns, c)
	w.mu.Unlock()
	return &watchedConn{Conn: c, w: w}, nil
}

// last is the connection dialed last.
func (w *watchedConns) last() net.Conn {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.conns[len(w.conns)-1]
}

type watchedConn struct {
	net.Conn
	w *watchedConns
}

func (c *watchedConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if c.w.breaks.Add(-1) >= 0 {
		_ = c.Conn.Close()
	} else {
		c.w.breaks.Store(0)
	}
	return n, err
}

func (c *watchedConn) SyscallConn() (syscall.RawConn, error) {
	rc, err := c.Conn.(syscall.Conn).SyscallConn()
	return countingRawConn{RawConn: rc, reads: &c.w.checks}, err
}

type countingRawConn struct {
	syscall.RawConn
	reads *atomic.Int64
}

func (c countingRawConn) Read(f func(fd uintptr) bool) error {
	c.reads.Add(1)
	return c.RawConn.Read(f)
}

// watchedClient is a client of addr as DialRedis makes one (RESP2, context
// deadlines, no retries, one dial attempt) whose connections w dials; edit,
// when set, changes its options first.
func watchedClient(t *testing.T, addr string, w *watchedConns, edit func(*redis.Options)) *redis.Client {
	t.Helper()
	o := &redis.Options{
		Addr: addr, Protocol: 2, ContextTimeoutEnabled: true, MaxRetries: -1,
		DialerRetries: 1, DialerRetryTimeout: time.Millisecond, Dialer: w.dial,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	}
	if edit != nil {
		edit(o)
	}
	c := redis.NewClient(o)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// loneReq is a take of 1 from a bucket of 100 tokens that hardly refills.
func loneReq(t *testing.T) bucket.Request {
	k, _ := bucket.NewKey("lone", 1, redistest.Unique(t))
	return bucket.Request{Key: k, Limits: bucket.Limits{Capacity: 100, RefillPerSecond: 0.001, IdleTTL: 30 * time.Hour}, Share: 1, Cost: 1}
}

// takeLeft takes req and fails the test unless it is admitted with left
// tokens remaining (to within the refill of a test's run).
func takeLeft(t *testing.T, r *bucket.Redis, req bucket.Request, left float64) {
	t.Helper()
	d, err := r.Take(context.Background(), req)
	if err != nil || !d.Allowed || !leftAbout(d.Remaining, left) {
		t.Fatalf("take of %v: %+v, %v; want admitted with %v left", req.Cost, d, err, left)
	}
}

// TestRedisLoneCallsSkipHealthCheck: lone calls go out on one connection
// that the store holds, with no health check (go-redis's recvfrom) per
// call: one dial and at most one check (when the connection is first
// borrowed) for 20 calls, where the pool checks a connection on every
// call.
func TestRedisLoneCallsSkipHealthCheck(t *testing.T) {
	w := &watchedConns{}
	r := newRedis(t, watchedClient(t, redistest.Addr(t), w, nil))
	req := loneReq(t)
	takeLeft(t, r, req, 99) // borrows the connection; NOSCRIPT on a fresh server
	checks := w.checks.Load()
	for i := range 20 {
		takeLeft(t, r, req, float64(98-i))
	}
	if n := w.checks.Load() - checks; n != 0 {
		t.Errorf("20 lone calls made %d health checks of their connection, want 0", n)
	}
	if n := w.dials.Load(); n != 1 {
		t.Errorf("21 lone calls dialed %d connections, want 1", n)
	}
}

// TestRedisLoneConnIdleGoesBackToPool: a lone connection idle for
// LoneIdle is checked by the pool before the next call, so a connection
// the server closed while idle (its timeout, a restart, CLIENT KILL) costs
// a new dial, not a failed call, as on the pool path.
func TestRedisLoneConnIdleGoesBackToPool(t *testing.T) {
	w := &watchedConns{}
	r := newRedis(t, watchedClient(t, redistest.Addr(t), w, nil))
	mono := clock.NewManual(time.Unix(0, 0))
	bucket.SetLoneClock(r, mono)
	req := loneReq(t)
	takeLeft(t, r, req, 99)
	admin := redistest.Client(t)
	if err := admin.Do(context.Background(), "client", "kill", "addr", w.last().LocalAddr().String()).Err(); err != nil {
		t.Fatal(err)
	}
	mono.Advance(bucket.LoneIdle)
	checks := w.checks.Load()
	takeLeft(t, r, req, 98)
	if n := w.checks.Load() - checks; n < 1 {
		t.Errorf("a lone connection idle for %v carried a call without a health check", bucket.LoneIdle)
	}
	if n := w.dials.Load(); n != 2 {
		t.Errorf("%d dials, want 2: the killed connection replaced", n)
	}
	// Used again within LoneIdle: no check.
	mono.Advance(bucket.LoneIdle / 2)
	checks = w.checks.Load()
	takeLeft(t, r, req, 97)
	if n := w.checks.Load() - checks; n != 0 {
		t.Errorf("a lone connection idle for %v was checked %d times", bucket.LoneIdle/2, n)
	}
}

// TestRedisLoneConnLifetime: a lone connection in steady use goes back
// to the pool once held for the client's ConnMaxLifetime, and the pool
// checks it (or closes it, when it is that old) before lending it again.
func TestRedisLoneConnLifetime(t *testing.T) {
	w := &watchedConns{}
	r := newRedis(t, watchedClient(t, redistest.Addr(t), w, func(o *redis.Options) { o.ConnMaxLifetime = time.Second }))
	mono := clock.NewManual(time.Unix(0, 0))
	bucket.SetLoneClock(r, mono)
	req := loneReq(t)
	takeLeft(t, r, req, 99)
	checks := w.checks.Load()
	step := bucket.LoneIdle / 2
	for i := 1; time.Duration(i)*step < time.Second; i++ {
		mono.Advance(step)
		takeLeft(t, r, req, float64(99-i))
	}
	if n := w.checks.Load() - checks; n != 0 {
		t.Fatalf("a lone connection used every %v within its lifetime was checked %d times", step, n)
	}
	mono.Advance(step)
	takeLeft(t, r, req, float64(99-int(time.Second/step)))
	if n := w.checks.Load() - checks; n != 1 {
		t.Errorf("a lone connection held for its lifetime was checked %d times before its next call, want 1", n)
	}
}

// TestRedisLoneConnBreaksMidCall: when the lone connection breaks while a
// call is in flight, a take is sent once more through the pool (which
// checks its connections), and charged twice when Redis ran the first;
// when that fails too, or for a refund (never sent twice), the call fails
// with the connection's error and the caller's failure mode decides. The
// next call borrows a new connection; a dial that fails surfaces as that
// call's error, and calls go through once Redis can be reached again.
func TestRedisLoneConnBreaksMidCall(t *testing.T) {
	w := &watchedConns{}
	r := newRedis(t, watchedClient(t, redistest.Addr(t), w, nil))
	req := loneReq(t)
	takeLeft(t, r, req, 99)

	w.breaks.Store(1)
	d, err := r.Take(context.Background(), req)
	if err != nil || !d.Allowed || !(leftAbout(d.Remaining, 97) || leftAbout(d.Remaining, 98)) {
		t.Fatalf("take whose connection broke mid-call, sent again: %+v, %v; want admitted, 97 or 98 left", d, err)
	}
	left := d.Remaining

	w.breaks.Store(2)
	_, err = r.Take(context.Background(), req)
	if err == nil || !strings.Contains(err.Error(), "bucket: redis take") || !errors.Is(err, net.ErrClosed) {
		t.Fatalf("take whose connection broke twice: %v, want the closed connection's error", err)
	}
	w.breaks.Store(1)
	if _, err = r.Refund(context.Background(), req); err == nil || !errors.Is(err, net.ErrClosed) {
		t.Fatalf("refund whose connection broke: %v, want the closed connection's error, not a second refund", err)
	}

	w.refuse.Store(true)
	start := time.Now()
	_, err = r.Take(context.Background(), req)
	if err == nil || !strings.Contains(err.Error(), "dial refused by the test") {
		t.Fatalf("take while dials fail: %v, want the dial's error", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("a take that could not dial took %v", d)
	}

	w.refuse.Store(false)
	// The broken calls may or may not have run: 2 takes and a refund.
	d, err = r.Take(context.Background(), req)
	if err != nil || !d.Allowed || d.Remaining < left-3.01 || d.Remaining > left+0.1 {
		t.Fatalf("take after reconnecting: %+v, %v; want admitted, %v to %v left", d, err, left-3, left)
	}
}

// TestRedisLoneConnAfterScriptFlush: a lone call that meets NOSCRIPT (the
// server's script cache flushed) is resent with EVAL on the same
// connection, and the caller never sees the refusal.
func TestRedisLoneConnAfterScriptFlush(t *testing.T) {
	w := &watchedConns{}
	r := newRedis(t, watchedClient(t, redistest.Addr(t), w, nil))
	req := loneReq(t)
	takeLeft(t, r, req, 99)
	admin := redistest.Client(t)
	for i := range 3 {
		if err := admin.ScriptFlush(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
		takeLeft(t, r, req, float64(98-i))
	}
	if n := w.dials.Load(); n != 1 {
		t.Errorf("%d dials, want 1: NOSCRIPT dropped the lone connection", n)
	}
}

// TestRedisLoneCallDeadline: a lone call whose deadline passes while Redis
// holds it (CLIENT PAUSE) returns the context's error, and the next call
// reads its own reply, not the late one of the call that gave up.
func TestRedisLoneCallDeadline(t *testing.T) {
	srv := redistest.Start(t)
	w := &watchedConns{}
	r := newRedis(t, watchedClient(t, srv.Addr, w, nil))
	req := loneReq(t)
	takeLeft(t, r, req, 99)

	admin := srv.Client(t)
	if err := admin.Do(context.Background(), "client", "pause", 300, "all").Err(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	five := req
	five.Cost = 5
	if _, err := r.Take(ctx, five); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("take held by CLIENT PAUSE past its deadline: %v, want context.DeadlineExceeded", err)
	}
	if err := admin.Do(context.Background(), "client", "unpause").Err(); err != nil {
		t.Fatal(err)
	}
	// 98 left if the take of 5 never ran, 93 if it did; 94 would be its
	// reply read as this call's.
	d, err := r.Take(context.Background(), req)
	if err != nil || !d.Allowed || !(leftAbout(d.Remaining, 98) || leftAbout(d.Remaining, 93)) {
		t.Fatalf("take after a take that gave up: %+v, %v; want 98 or 93 left", d, err)
	}
}

// leftAbout reports whether left tokens are want, refilled by at most 0.1
// (100 s of the test buckets' refill).
func leftAbout(left, want float64) bool { return left >= want && left <= want+0.1 }

// TestRedisLoneConnSparesFlushers: the lone connection is one of the
// client's pool, so a store whose pool holds no more connections than its
// flushers use keeps lone calls on the pool: a queued call does not wait
// for a connection the store holds. (Here the client has no pipeline pool
// of its own, so the flushers' pipelines take the pool's connections.)
func TestRedisLoneConnSparesFlushers(t *testing.T) {
	w := &watchedConns{}
	c := watchedClient(t, redistest.Addr(t), w, func(o *redis.Options) {
		o.PoolSize, o.PipelinePoolSize, o.PoolTimeout = 1, -1, 300*time.Millisecond
	})
	r, err := bucket.NewRedis(bucket.RedisConfig{Client: c, Flushers: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	req := loneReq(t)
	takeLeft(t, r, req, 99)
	wait, err := bucket.QueueTake(r, context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if d, err := wait(); err != nil || !d.Allowed {
		t.Fatalf("queued take on a pool of one connection: %+v, %v", d, err)
	}
}

// TestRedisLoneConnNeedsRESP2: a client that speaks RESP3 keeps lone calls
// on the pool (each call's connection checked): go-redis sets up a
// connection borrowed through a redis.Conn under another lock than the
// client's, and on RESP3 may rewrite the options the client reads (a data
// race under -race).
func TestRedisLoneConnNeedsRESP2(t *testing.T) {
	w := &watchedConns{}
	r := newRedis(t, watchedClient(t, redistest.Addr(t), w, func(o *redis.Options) { o.Protocol = 3 }))
	req := loneReq(t)
	takeLeft(t, r, req, 99)
	checks := w.checks.Load()
	for i := range 5 {
		takeLeft(t, r, req, float64(98-i))
	}
	if n := w.checks.Load() - checks; n != 5 {
		t.Errorf("5 lone calls on a RESP3 client made %d health checks, want 5 (the pool path)", n)
	}
}
