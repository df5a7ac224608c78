package regional

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/quotacoord/quota/bucket"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

func TestBreakerSteps(t *testing.T) {
	b := newBreaker(3, time.Second)
	type step struct {
		at      time.Duration
		op      string // allow, ok, fail
		probe   bool
		want    bool // allow's answer, or failure's "opened"
		wantPrb bool
	}
	steps := []step{
		{0, "allow", false, true, false},
		{0, "fail", false, false, false},
		{0, "fail", false, false, false},
		{0, "fail", false, true, false}, // third consecutive failure opens
		{10 * time.Millisecond, "allow", false, false, false},
		{999 * time.Millisecond, "allow", false, false, false},
		{time.Second, "allow", false, true, true},   // half-open: one probe
		{time.Second, "allow", false, false, false}, // a second caller waits
		{time.Second, "fail", true, true, false},    // probe failed: open again
		{1500 * time.Millisecond, "allow", false, false, false},
		{2 * time.Second, "allow", false, true, true},
		{2 * time.Second, "ok", true, false, false}, // probe answered: closed
		{2 * time.Second, "allow", false, true, false},
		{2 * time.Second, "fail", false, false, false}, // count starts again
		{2 * time.Second, "ok", false, false, false},
		{2 * time.Second, "fail", false, false, false},
		{2 * time.Second, "fail", false, false, false},
		{2 * time.Second, "allow", false, true, false},
	}
	for i, s := range steps {
		now := t0.Add(s.at)
		switch s.op {
		case "allow":
			ok, probe := b.allow(now)
			if ok != s.want || probe != s.wantPrb {
				t.Fatalf("step %d: allow = %v, probe %v; want %v, %v", i, ok, probe, s.want, s.wantPrb)
			}
		case "ok":
			b.success(s.probe)
		case "fail":
			if got := b.failure(now, s.probe); got != s.want {
				t.Fatalf("step %d: failure opened = %v, want %v", i, got, s.want)
			}
		}
	}
}

func TestNegativeCache(t *testing.T) {
	key, _ := bucket.NewKey("p", 1, "s")
	lim := bucket.Limits{Capacity: 10, RefillPerSecond: 1, IdleTTL: time.Minute}
	req := func(cost int64, share float64) bucket.Request {
		return bucket.Request{Key: key, Limits: lim, Share: share, Cost: cost}
	}
	c := newNegativeCache(100)
	c.add(key, req(3, 1), bucket.Decision{Allowed: false, Limit: 10, RetryAfter: 2 * time.Second, ResetAfter: 9 * time.Second}, t0)
	tests := []struct {
		name string
		at   time.Duration
		req  bucket.Request
		hit  bool
	}{
		{"same cost", time.Second, req(3, 1), true},
		{"larger cost", time.Second, req(9, 1), true},
		{"smaller cost may pass", time.Second, req(2, 1), false},
		{"other share", time.Second, req(3, 0.5), false},
		{"at retry-after", 2 * time.Second, req(3, 1), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, hit := c.deny(key, tt.req, t0.Add(tt.at))
			if hit != tt.hit {
				t.Fatalf("hit = %v, want %v", hit, tt.hit)
			}
			if hit && (d.Allowed || d.RetryAfter != 2*time.Second-tt.at) {
				t.Fatalf("decision %+v", d)
			}
		})
	}
	// Bounded: a full cache refuses new entries until old ones expire.
	small := newNegativeCache(negShards) // one per shard
	for i := 0; i < 1000; i++ {
		k, _ := bucket.NewKey("p", 1, "s"+string(rune('a'+i%26))+string(rune('a'+i/26%26)))
		small.add(k, req(1, 1), bucket.Decision{RetryAfter: time.Second}, t0)
	}
	if n := small.len(); n > negShards {
		t.Fatalf("cache holds %d entries, bound %d", n, negShards)
	}
}

func TestReplayCache(t *testing.T) {
	ctx := context.Background()
	c := newReplayCache(2, time.Minute)
	r, e, err := c.begin(ctx, "a", fingerprint{}, t0)
	if r != nil || e == nil || err != nil {
		t.Fatalf("first begin = %v, %v, %v", r, e, err)
	}
	done := make(chan *quotav1.CheckResponse)
	go func() { // a retry while the first is in flight waits for it
		r, _, _ := c.begin(ctx, "a", fingerprint{}, t0.Add(time.Second))
		done <- r
	}()
	c.finish(e, &quotav1.CheckResponse{Allowed: true, Remaining: 7})
	if r := <-done; r == nil || r.Remaining != 7 {
		t.Fatalf("waiting retry got %v", r)
	}
	other := requestFingerprint([]string{"p"}, 0, true)
	if _, _, err := c.begin(ctx, "a", other, t0.Add(time.Second)); !errors.Is(err, errKeyReused) {
		t.Fatalf("key with another fingerprint: %v, want errKeyReused", err)
	}
	if r, _, _ := c.begin(ctx, "a", fingerprint{}, t0.Add(2*time.Minute)); r != nil {
		t.Fatal("replayed after the TTL")
	}
	// A failed owner is forgotten.
	_, e, _ = c.begin(ctx, "b", fingerprint{}, t0)
	c.finish(e, nil)
	if r, e2, _ := c.begin(ctx, "b", fingerprint{}, t0); r != nil || e2 == nil {
		t.Fatal("failed check replayed")
	}
	c.begin(ctx, "c", fingerprint{}, t0)
	c.begin(ctx, "d", fingerprint{}, t0)
	if n := c.len(); n != 2 {
		t.Fatalf("len %d, bound 2", n)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, _, err := c.begin(cctx, "d", fingerprint{}, t0); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled wait: %v", err)
	}
}

type nopStore struct{}

func (nopStore) Take(context.Context, bucket.Request) (bucket.Decision, error) {
	return bucket.Decision{}, nil
}
func (nopStore) TakeAll(_ context.Context, r []bucket.Request) ([]bucket.Decision, error) {
	return make([]bucket.Decision, len(r)), nil
}
func (nopStore) Refund(context.Context, bucket.Request) (bucket.Decision, error) {
	return bucket.Decision{}, nil
}

func TestConfigDefaults(t *testing.T) {
	ok := Config{Region: "eu", Store: nopStore{}, Local: nopStore{}}
	tests := []struct {
		name   string
		mod    func(*Config)
		errSub string
		check  func(Config) bool
	}{
		{"defaults", func(*Config) {}, "", func(c Config) bool {
			return c.StoreTimeout == 5*time.Millisecond && c.BreakerThreshold == 5 && c.BreakerCooldown == time.Second &&
				c.UnknownPolicy == UnknownError && c.IdempotencyTTL == time.Minute && c.Headers == HeadersOff && c.Shares != nil
		}},
		{"no region", func(c *Config) { c.Region = "" }, "Region is empty", nil},
		{"bad region", func(c *Config) { c.Region = "eu west" }, "Region", nil},
		{"no store", func(c *Config) { c.Store = nil }, "Store is nil", nil},
		{"no local", func(c *Config) { c.Local = nil }, "Local is nil", nil},
		{"negative timeout", func(c *Config) { c.StoreTimeout = -1 }, "StoreTimeout", nil},
		{"bad unknown mode", func(c *Config) { c.UnknownPolicy = "maybe" }, "UnknownPolicy", nil},
		{"bad headers", func(c *Config) { c.Headers = "all" }, "Headers", nil},
		{"negative cache off", func(c *Config) { c.NegativeCacheSize = -1 }, "", func(c Config) bool { return c.NegativeCacheSize == 0 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := ok
			tt.mod(&c)
			got, err := c.withDefaults()
			if tt.errSub != "" {
				if err == nil || !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tt.errSub) {
					t.Fatalf("err = %v, want ErrConfig naming %q", err, tt.errSub)
				}
				return
			}
			if err != nil || !tt.check(got) {
				t.Fatalf("got %+v, %v", got, err)
			}
		})
	}
}
