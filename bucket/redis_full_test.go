package bucket_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/redistest"
)

// TestRedisOOMIsMemoryFull: a Redis at its maxmemory under noeviction
// refuses the script's writes with an OOM reply; TakeAll reports it as
// ErrMemoryFull (the store refused to grow, it did not fail), so callers
// can deny the check instead of counting a store failure.
func TestRedisOOMIsMemoryFull(t *testing.T) {
	srv := redistest.Start(t, "--maxmemory-policy", "noeviction")
	c := srv.Client(t)
	ctx := context.Background()
	used := redistest.Info(t, c, "memory", "used_memory")
	if err := c.ConfigSet(ctx, "maxmemory", strconv.FormatInt(used+256<<10, 10)).Err(); err != nil {
		t.Fatal(err)
	}
	r := newRedis(t, c)
	lim := bucket.Limits{Capacity: 5, RefillPerSecond: 1, IdleTTL: time.Hour}
	var full error
	for i := 0; i < 100000 && full == nil; i++ {
		k, _ := bucket.NewKey("oom", 1, fmt.Sprintf("s%d", i))
		_, err := r.TakeAll(ctx, []bucket.Request{{Key: k, Limits: lim, Share: 1, Cost: 1}})
		switch {
		case errors.Is(err, bucket.ErrMemoryFull):
			full = err
		case err != nil:
			t.Fatalf("take %d: %v, want ErrMemoryFull or success", i, err)
		}
	}
	if full == nil {
		t.Fatal("Redis never refused a write: maxmemory was not reached")
	}
	t.Logf("full: %v", full)
}
