package bucket_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/redistest"
)

func TestNewRedisConfig(t *testing.T) {
	c := redistest.Client(t)
	for _, tc := range []struct {
		name string
		cfg  bucket.RedisConfig
		ok   bool
	}{
		{"defaults", bucket.RedisConfig{Client: c}, true},
		{"one group", bucket.RedisConfig{Client: c, Groups: 1}, true},
		{"max groups", bucket.RedisConfig{Client: c, Groups: bucket.MaxGroups}, true},
		{"no client", bucket.RedisConfig{}, false},
		{"negative groups", bucket.RedisConfig{Client: c, Groups: -1}, false},
		{"too many groups", bucket.RedisConfig{Client: c, Groups: bucket.MaxGroups + 1}, false},
		{"negative batch", bucket.RedisConfig{Client: c, MaxBatch: -1}, false},
		{"no merging", bucket.RedisConfig{Client: c, Merge: 1}, true},
		{"negative merge", bucket.RedisConfig{Client: c, Merge: -1}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := bucket.NewRedis(tc.cfg)
			if (err == nil) != tc.ok {
				t.Fatalf("NewRedis: %v, want ok=%v", err, tc.ok)
			}
			if r != nil {
				_ = r.Close()
			}
		})
	}
}

// TestRedisGroupLayout checks where buckets live: a token bucket is a
// 17-byte field of a listpack-encoded group hash with the idle TTL; a
// window bucket is a string key with the same hash tag.
func TestRedisGroupLayout(t *testing.T) {
	c := redistest.Client(t)
	r := newRedis(t, c)
	ctx := context.Background()
	u := redistest.Unique(t)
	long := u + strings.Repeat("x", bucket.MaxSubjectLen-len(u))
	tb := bucket.Limits{Capacity: 10, RefillPerSecond: 1, IdleTTL: time.Minute}
	fw := bucket.Limits{Algorithm: bucket.FixedWindow, Capacity: 10, Window: time.Second, IdleTTL: 30 * time.Second}
	for _, subj := range []string{u + "a", long} {
		k, err := bucket.NewKey("layout", 7, subj)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.Take(ctx, bucket.Request{Key: k, Limits: tb, Share: 1, Cost: 1}); err != nil {
			t.Fatal(err)
		}
		key, field := r.Location(k, tb)
		tag := key[strings.Index(key, "{") : strings.Index(key, "}")+1]
		if !strings.HasPrefix(key, "rl:v7:{g.") || !strings.HasSuffix(key, "}:layout") {
			t.Fatalf("group key %q, want rl:v7:{g.N}:layout", key)
		}
		if want := subj; len(subj) > 48 {
			if !strings.HasPrefix(field, "~") || len(field) != 33 {
				t.Fatalf("field of a %d-byte subject: %q, want a 33-byte digest", len(subj), field)
			}
		} else if field != want {
			t.Fatalf("field %q, want the subject %q", field, want)
		}
		v, err := c.HGet(ctx, key, field).Result()
		if err != nil || len(v) != 17 {
			t.Fatalf("HGET %s %s: %q, %v; want 17 bytes", key, field, v, err)
		}
		if enc, err := c.ObjectEncoding(ctx, key).Result(); err != nil || enc != "listpack" {
			t.Fatalf("group encoding %q, %v; want listpack", enc, err)
		}
		if ttl, err := c.PTTL(ctx, key).Result(); err != nil || ttl <= 0 || ttl > time.Minute {
			t.Fatalf("group PTTL %v, %v; want (0, 1m]", ttl, err)
		}
		if _, err := r.Take(ctx, bucket.Request{Key: k, Limits: fw, Share: 1, Cost: 1}); err != nil {
			t.Fatal(err)
		}
		wkey, wfield := r.Location(k, fw)
		if wfield != "" || wkey != strings.TrimSuffix(key, "layout")+"layout:"+subj || !strings.Contains(wkey, tag) {
			t.Fatalf("window key %q field %q, want %slayout:%s", wkey, wfield, strings.TrimSuffix(key, "layout"), subj)
		}
		if typ, err := c.Type(ctx, wkey).Result(); err != nil || typ != "string" {
			t.Fatalf("window key type %q, %v", typ, err)
		}
		if ttl, err := c.PTTL(ctx, wkey).Result(); err != nil || ttl <= 0 || ttl > 30*time.Second {
			t.Fatalf("window key PTTL %v, %v", ttl, err)
		}
	}
}

// TestRedisGroupPruneBound writes a new subject into one group every 100
// ms of script time for 200 s with a 10 s TTL: without pruning the group
// would hold 2,000 fields; fields idle for two TTLs (200 subjects live
// within that) must be pruned on the way, to at most 4/3 of that in
// expectation (prune_group in lua/common.lua). A subject's field is
// created by a take, or by a lease grant (the lease script), so a group
// kept busy by either must stay bounded.
func TestRedisGroupPruneBound(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write func(ctx context.Context, r *bucket.Redis, req bucket.Request) error
	}{
		{"take", func(ctx context.Context, r *bucket.Redis, req bucket.Request) error {
			req.Cost = 1
			if d, err := r.Take(ctx, req); err != nil || !d.Allowed {
				return fmt.Errorf("take: %+v, %v", d, err)
			}
			return nil
		}},
		{"lease", func(ctx context.Context, r *bucket.Redis, req bucket.Request) error {
			l, err := r.Lease(ctx, bucket.LeaseRequest{Request: req, Holder: "node-a", Rate: 1, Burst: 1, For: 2 * time.Second, Cut: time.Second})
			if err != nil || !l.Granted {
				return fmt.Errorf("lease: %+v, %v", l, err)
			}
			return nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := redistest.Client(t)
			r, err := bucket.NewRedis(bucket.RedisConfig{Client: c, Groups: 1})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = r.Close() })
			var now int64 = t0.UnixMicro()
			bucket.SetRedisNow(r, func() int64 { return now })
			ctx := context.Background()
			pol := redistest.Unique(t)
			lim := bucket.Limits{Capacity: 10, RefillPerSecond: 10, IdleTTL: 10 * time.Second}
			var key string
			const n = 2000
			for i := range n {
				now += 100_000
				k, _ := bucket.NewKey(pol, 1, fmt.Sprintf("s%d", i))
				key, _ = r.Location(k, lim)
				if err := tc.write(ctx, r, bucket.Request{Key: k, Limits: lim, Share: 1}); err != nil {
					t.Fatalf("subject %d: %v", i, err)
				}
			}
			size, err := c.HLen(ctx, key).Result()
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%d fields after %d subjects (200 live within two TTLs)", size, n)
			if size < 200 || size > 400 {
				t.Fatalf("group holds %d fields, want 200 to 400 (bounded by pruning)", size)
			}
		})
	}
}

// TestRedisBytesPerBucket: 100,000 live token buckets cost at most 100
// bytes each of used_memory, and their groups stay listpack-encoded.
func TestRedisBytesPerBucket(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	r := newRedis(t, c)
	per, err := bytesPerBucket(c, r, "m", 100_000)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%.1f bytes per live token bucket", per)
	if per > 100 {
		t.Fatalf("%.1f bytes per bucket, want at most 100", per)
	}
	keys, err := c.Keys(context.Background(), "rl:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != bucket.DefaultGroups {
		t.Fatalf("%d group keys, want %d", len(keys), bucket.DefaultGroups)
	}
	for _, k := range keys[:64] {
		if enc, err := c.ObjectEncoding(context.Background(), k).Result(); err != nil || enc != "listpack" {
			t.Fatalf("%s: encoding %q, %v; want listpack", k, enc, err)
		}
	}
}

// bytesPerBucket creates n token buckets (subjects prefix0..) through r
// with 64 callers and returns the used_memory growth per bucket.
func bytesPerBucket(c *redis.Client, r *bucket.Redis, prefix string, n int) (float64, error) {
	ctx := context.Background()
	lim := bucket.Limits{Capacity: 100, RefillPerSecond: 10, IdleTTL: time.Minute}
	before, err := usedMemory(ctx, c)
	if err != nil {
		return 0, err
	}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for w := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 64 {
				k, err := bucket.NewKey("p", 1, fmt.Sprintf("%s%d", prefix, i))
				if err == nil {
					_, err = r.Take(ctx, bucket.Request{Key: k, Limits: lim, Share: 1, Cost: 1})
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := errors.Join(<-errs); err != nil {
		return 0, err
	}
	after, err := usedMemory(ctx, c)
	if err != nil {
		return 0, err
	}
	return float64(after-before) / float64(n), nil
}

// TestOwnKeyOneAllocation: the Redis key of a window bucket is built on
// the stack, so a check pays one allocation (the string) for it, with the
// longest policy name and subject.
func TestOwnKeyOneAllocation(t *testing.T) {
	k, err := bucket.NewKey(strings.Repeat("p", bucket.MaxPolicyNameLen), 7, strings.Repeat("s", 96))
	if err != nil {
		t.Fatal(err)
	}
	want := "rl:v7:{g." // the hash tag follows
	if got := bucket.OwnKey(k, 3); !strings.HasPrefix(got, want) || !strings.HasSuffix(got, ":"+k.Policy()+":"+strings.Repeat("s", 96)) {
		t.Fatalf("OwnKey = %q", got)
	}
	if n := testing.AllocsPerRun(100, func() { _ = bucket.OwnKey(k, 3) }); n != 1 {
		t.Fatalf("OwnKey allocates %v times, want 1", n)
	}
}
