package bucket_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/redistest"
)

// dialSentinels opens a client of sg's primary through its Sentinels and a
// store on it.
func dialSentinels(t *testing.T, sg *redistest.Sentinels) (*redis.Client, *bucket.Redis) {
	t.Helper()
	c, err := bucket.DialRedis(strings.Join(sg.Addrs, ","), bucket.DialOptions{
		SentinelMaster: redistest.SentinelMaster, PoolSize: 4, ReadTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	rc, ok := c.(*redis.Client)
	if !ok {
		t.Fatalf("DialRedis with a Sentinel master gave %T", c)
	}
	return rc, newRedis(t, c)
}

// servedBy returns the address of the server that answers c's next
// command (INFO server's tcp_port on loopback).
func servedBy(t *testing.T, c *redis.Client) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(info, "\r\n") {
		if p, ok := strings.CutPrefix(line, "tcp_port:"); ok {
			return net.JoinHostPort("127.0.0.1", p)
		}
	}
	return ""
}

// waitServedBy waits until c's commands reach addr.
func waitServedBy(t *testing.T, c *redis.Client, addr string, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for servedBy(t, c) != addr {
		if time.Since(start) > within {
			t.Fatalf("after %v the client still talks to %s, not %s", within, servedBy(t, c), addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start)
}

// TestDialRedisSentinelFailover: a store on a client dialed through three
// real Sentinels follows a SENTINEL FAILOVER without being reopened: its
// commands reach the promoted replica, and a bucket spent before the
// failover (replicated, WAIT) keeps its spending there.
func TestDialRedisSentinelFailover(t *testing.T) {
	sg := redistest.StartSentinels(t, redistest.SentinelAuth{})
	c, r := dialSentinels(t, sg)
	ctx := context.Background()
	if got := servedBy(t, c); got != sg.Nodes[0].Addr {
		t.Fatalf("client talks to %s, want the primary %s", got, sg.Nodes[0].Addr)
	}
	k, _ := bucket.NewKey("sentinel", 1, redistest.Unique(t))
	req := bucket.Request{Key: k, Limits: bucket.Limits{Capacity: 5, IdleTTL: time.Hour}, Share: 1, Cost: 1}
	for i := range 3 {
		if d, err := r.Take(ctx, req); err != nil || !d.Allowed {
			t.Fatalf("take %d before the failover: %+v, %v", i, d, err)
		}
	}
	if n, err := sg.Nodes[0].Client(t).Do(ctx, "WAIT", 1, 5000).Int(); err != nil || n != 1 {
		t.Fatalf("WAIT for the replica: %d, %v", n, err)
	}

	promoted := sg.Failover(t)
	if promoted != sg.Nodes[1].Addr {
		t.Fatalf("Sentinels promoted %s, want the replica %s", promoted, sg.Nodes[1].Addr)
	}
	took := waitServedBy(t, c, promoted, 10*time.Second)
	t.Logf("client on the promoted replica %v after the Sentinels named it", took.Round(time.Millisecond))
	for i, want := range []bool{true, true, false} {
		d, err := r.Take(ctx, req)
		if err != nil || d.Allowed != want {
			t.Fatalf("take %d after the failover: %+v, %v; want allowed=%v (3 of 5 spent before)", i, d, err, want)
		}
	}
	if servedBy(t, c) != promoted {
		t.Fatal("client went back to the old primary")
	}
}

// TestDialRedisSentinelReadOnly: the client holds pooled connections to
// the primary when an operator promotes the replica and demotes the
// primary with REPLICAOF, without a Sentinel failover (no +switch-master
// reaches the client). Every take on the demoted primary fails with its
// READONLY reply (an error, never a decision), and once the Sentinels name
// the new primary the client reaches it without being reopened: each
// READONLY reply closed its connection, and the next dial asked the
// Sentinels.
func TestDialRedisSentinelReadOnly(t *testing.T) {
	sg := redistest.StartSentinels(t, redistest.SentinelAuth{})
	c, r := dialSentinels(t, sg)
	ctx := context.Background()
	k, _ := bucket.NewKey("readonly", 1, redistest.Unique(t))
	req := bucket.Request{Key: k, Limits: bucket.Limits{Capacity: 1000, IdleTTL: time.Hour}, Share: 1, Cost: 1}
	takeAll := func(n int) (allowed int, errs []error) {
		var mu sync.Mutex
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				d, err := r.Take(ctx, req)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
				} else if d.Allowed {
					allowed++
				}
			})
		}
		wg.Wait()
		return allowed, errs
	}
	// Fill the pool with connections to the primary.
	for range 5 {
		if ok, errs := takeAll(8); ok != 8 {
			t.Fatalf("takes on the primary: %d of 8 admitted, errors %v", ok, errs)
		}
	}
	old, neu := sg.Nodes[0], sg.Nodes[1]
	oc, nc := old.Client(t), neu.Client(t)
	if n := redistest.Info(t, oc, "clients", "connected_clients"); n < 3 {
		t.Fatalf("primary has %d clients, want the pool's connections", n)
	}
	host, port, _ := net.SplitHostPort(neu.Addr)
	if err := nc.Do(ctx, "REPLICAOF", "NO", "ONE").Err(); err != nil {
		t.Fatal(err)
	}
	if err := oc.Do(ctx, "REPLICAOF", host, port).Err(); err != nil {
		t.Fatal(err)
	}

	// The Sentinels still name the demoted primary: every take fails.
	for range 3 {
		ok, errs := takeAll(8)
		if ok != 0 || len(errs) != 8 {
			t.Fatalf("takes on the demoted primary: %d admitted, %d errors, want 0 and 8 (%v)", ok, len(errs), errs)
		}
		for _, err := range errs {
			if errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("take on the demoted primary: %v, want its refusal", err)
			}
		}
	}
	if n := readOnlyReplies(t, oc); n == 0 {
		t.Fatal("the demoted primary sent no READONLY reply")
	} else {
		t.Logf("the demoted primary refused %d writes with READONLY", n)
	}

	sg.Remonitor(t, neu.Addr)
	start := time.Now()
	for {
		ok, errs := takeAll(8)
		if ok == 8 {
			break
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("10s after the Sentinels named %s: %d of 8 admitted, errors %v", neu.Addr, ok, errs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("takes admitted on the new primary %v after the Sentinels named it", time.Since(start).Round(time.Millisecond))
	if got := servedBy(t, c); got != neu.Addr {
		t.Fatalf("client talks to %s, want the new primary %s", got, neu.Addr)
	}
}

// readOnlyReplies returns how many READONLY errors the server behind c
// has replied (INFO errorstats).
func readOnlyReplies(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "errorstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "errorstat_READONLY:count="); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("errorstat_READONLY %q: %v", v, err)
			}
			return n
		}
	}
	return 0
}

// TestDialRedisSentinelAuth: with Sentinels that require a password of
// their own and data nodes that require another, a client given both
// (SentinelPassword, Password) reaches the primary and a store runs on
// it; a wrong data-node password and a missing or wrong Sentinel password
// are ErrRedisAuth at PingRedis, without a password in the error.
func TestDialRedisSentinelAuth(t *testing.T) {
	const dataPW, sentinelPW = "data-s3cret", "watch-s3cret"
	sg := redistest.StartSentinels(t, redistest.SentinelAuth{Password: dataPW, SentinelPassword: sentinelPW})
	spec := strings.Join(sg.Addrs, ",")
	for _, tc := range []struct {
		name string
		opt  bucket.DialOptions
		auth bool // false: ErrRedisAuth
	}{
		{"both passwords", bucket.DialOptions{Password: dataPW, SentinelPassword: sentinelPW}, true},
		{"wrong data password", bucket.DialOptions{Password: "wrong", SentinelPassword: sentinelPW}, false},
		{"no Sentinel password", bucket.DialOptions{Password: dataPW}, false},
		{"wrong Sentinel password", bucket.DialOptions{Password: dataPW, SentinelPassword: "wrong"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.opt.SentinelMaster = redistest.SentinelMaster
			c, err := bucket.DialRedis(spec, tc.opt)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err = bucket.PingRedis(ctx, c)
			if !tc.auth {
				if !errors.Is(err, bucket.ErrRedisAuth) || strings.Contains(err.Error(), "s3cret") {
					t.Fatalf("PingRedis: %v, want ErrRedisAuth without a password", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("PingRedis: %v", err)
			}
			r := newRedis(t, c)
			k, _ := bucket.NewKey("sentinel-auth", 1, redistest.Unique(t))
			if d, err := r.Take(ctx, bucket.Request{Key: k, Limits: bucket.Limits{Capacity: 1, IdleTTL: time.Minute}, Share: 1, Cost: 1}); err != nil || !d.Allowed {
				t.Fatalf("take: %+v, %v", d, err)
			}
		})
	}
}
