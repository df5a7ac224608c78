package bucket_test

import (
	"context"
	"testing"
	"time"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/redistest"
)

// leastPrivilege is the ACL rule set docs/redis.md gives a node's Redis
// user: the rl:* keys, no channels, PING and the scripts with the
// commands they call.
var leastPrivilege = []any{"~rl:*", "resetchannels", "+ping", "+evalsha", "+eval",
	"+time", "+get", "+set", "+del", "+hget", "+hset", "+hdel", "+hrandfield", "+pexpire"}

// TestRedisLeastPrivilegeUser: a store with LossGuard runs every algorithm
// as an ACL user holding only leastPrivilege, and a user allowed the
// scripts but not the commands they call is refused (Redis checks a
// script's commands against the caller's ACL).
func TestRedisLeastPrivilegeUser(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	ctx := context.Background()
	for _, tc := range []struct {
		user  string
		rules []any
		ok    bool
	}{
		{"limiter", leastPrivilege, true},
		{"no-time", leastPrivilege[:5], false},
	} {
		args := append([]any{"ACL", "SETUSER", tc.user, "on", ">pw"}, tc.rules...)
		if err := admin.Do(ctx, args...).Err(); err != nil {
			t.Fatal(err)
		}
		c, err := bucket.DialRedis(srv.Addr, bucket.DialOptions{Username: tc.user, Password: "pw"})
		if err != nil {
			t.Fatal(err)
		}
		if err := bucket.PingRedis(ctx, c); err != nil {
			t.Fatalf("%s: PING: %v", tc.user, err)
		}
		r, err := bucket.NewRedis(bucket.RedisConfig{Client: c, LossGuard: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, lim := range []bucket.Limits{
			{Capacity: 5, RefillPerSecond: 1, IdleTTL: time.Minute},
			{Algorithm: bucket.FixedWindow, Capacity: 3, Window: 10 * time.Second, IdleTTL: 10 * time.Second},
			{Algorithm: bucket.SlidingWindow, Capacity: 3, Window: 10 * time.Second, IdleTTL: 20 * time.Second},
			{Algorithm: bucket.SlidingLog, Capacity: 3, Window: 10 * time.Second, IdleTTL: 10 * time.Second},
		} {
			k, _ := bucket.NewKey("acl", 1, redistest.Unique(t))
			_, err := r.Take(ctx, bucket.Request{Key: k, Limits: lim, Share: 1, Cost: 1})
			if (err == nil) != tc.ok {
				t.Errorf("%s, %s: take: %v, want success %v", tc.user, lim.Algorithm, err, tc.ok)
			}
		}
		_ = r.Close()
		_ = c.Close()
	}
}
