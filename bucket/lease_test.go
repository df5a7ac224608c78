package bucket_test

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/boundcheck"
	"github.com/quotacoord/quota/internal/redistest"
)

// leaseLimits: C = 100, r = 10/s (a full refill takes 10 s).
var leaseLimits = bucket.Limits{Capacity: 100, RefillPerSecond: 10, IdleTTL: time.Minute}

var leaseT0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func leaseKey(t testing.TB, policy, subject string) bucket.Key {
	t.Helper()
	k, err := bucket.NewKey(policy, 1, subject)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func grant(k bucket.Key, holder string, rate float64, burst int64, renew bool) bucket.LeaseRequest {
	return bucket.LeaseRequest{
		Request: bucket.Request{Key: k, Limits: leaseLimits, Share: 1},
		Holder:  holder, Rate: rate, Burst: burst, For: 2 * time.Second, Cut: time.Second, Renew: renew,
	}
}

func release(k bucket.Key, holder string, unspent int64, within time.Duration) bucket.LeaseRelease {
	return bucket.LeaseRelease{Request: bucket.Request{Key: k, Limits: leaseLimits, Share: 1},
		Holder: holder, Unspent: unspent, Within: within}
}

func near(a, b float64) bool { return math.Abs(a-b) < 0.0015 }

// TestLeaseSteps walks one bucket through grants, a partial grant, a
// blocked hot path, a renewal, the credit of the unleased refill, a
// release with unspent tokens and the end of every lease.
func TestLeaseSteps(t *testing.T) {
	m, err := bucket.NewMemory(bucket.MemoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	k := leaseKey(t, "p", "s")
	at := func(ms int) time.Time { return leaseT0.Add(time.Duration(ms) * time.Millisecond) }
	must := func(l bucket.Lease, err error) bucket.Lease {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	take := func(ms int, cost int64) bucket.Decision {
		t.Helper()
		d, err := m.TakeAt(at(ms), bucket.Request{Key: k, Limits: leaseLimits, Share: 1, Cost: cost})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}

	l := must(m.LeaseAt(at(0), grant(k, "a", 4, 10, false)))
	if !l.Granted || l.Renewed || l.Rate != 4 || l.Burst != 10 || !near(l.Tokens, 90) || !near(l.FreeRate, 6) || !l.Expiry.Equal(at(2000)) {
		t.Fatalf("first grant: %+v", l)
	}
	l = must(m.LeaseAt(at(0), grant(k, "b", 8, 10, false)))
	if !l.Granted || !near(l.Rate, 6) || !near(l.Tokens, 80) || !near(l.FreeRate, 0) {
		t.Fatalf("second grant, 6 of the 8 asked left: %+v", l)
	}
	if l = must(m.LeaseAt(at(0), grant(k, "c", 1, 1, false))); l.Granted {
		t.Fatalf("a third lease with the refill all leased: %+v", l)
	}
	if d := take(500, 80); !d.Allowed {
		t.Fatalf("the hot path may take what the bucket holds: %+v", d)
	}
	if d := take(1000, 1); d.Allowed {
		t.Fatalf("the hot path refilled while the refill is leased: %+v", d)
	}
	l = must(m.LeaseAt(at(1000), grant(k, "a", 4, 10, true)))
	if !l.Granted || !l.Renewed || !near(l.Tokens, 0) || !l.Expiry.Equal(at(3000)) {
		t.Fatalf("renewal (no credit: every token of refill was leased): %+v", l)
	}
	l = must(m.Release(context.Background(), release(k, "b", 5, 0)))
	// Release reads the Memory's clock (real time, long after at(1000)):
	// every lease has ended by then, so the bucket refilled in full.
	if !near(l.Tokens, 100) || l.Leased != 0 {
		t.Fatalf("release at a time past every lease: %+v", l)
	}

	// Again, with the release at a controlled instant.
	k = leaseKey(t, "p", "s2")
	must(m.LeaseAt(at(0), grant(k, "a", 4, 10, false)))
	must(m.LeaseAt(at(0), grant(k, "b", 6, 10, false)))
	take(0, 80)
	l = must(m.ReleaseAt(at(1000), release(k, "b", 5, 0)))
	if !near(l.Tokens, 5) || !near(l.Leased, 4) || !near(l.FreeRate, 6) {
		t.Fatalf("release of b with 5 unspent: %+v", l)
	}
	l = must(m.LeaseAt(at(1500), grant(k, "a", 4, 10, true)))
	// [1 s, 1.5 s]: 10/s of refill, 4/s leased: 3 credited.
	if !l.Renewed || !near(l.Tokens, 8) {
		t.Fatalf("renewal after half a second with 6/s unleased: %+v", l)
	}
	// a's lease ends at 3.5 s; the hot path refills from then at 10/s.
	if d := take(5000, 0); !near(d.Remaining, 23) {
		t.Fatalf("a second after the last lease ended: %+v", d)
	}
	// A credit is clamped to the room the bucket had at the last call: a
	// bucket full (with the leases' bursts) until the hot path spends it
	// just before the next call earned almost nothing meanwhile.
	k = leaseKey(t, "p", "s4")
	must(m.LeaseAt(at(0), grant(k, "a", 2, 50, false)))
	take(1800, 50)
	if l = must(m.LeaseAt(at(1900), grant(k, "a", 2, 50, true))); !l.Renewed || !near(l.Tokens, 0) {
		t.Fatalf("credit after a full bucket was spent: %+v (an eager bucket would hold under a token)", l)
	}
	// A lease that changes counts at its larger rate until the cut.
	k = leaseKey(t, "p", "s3")
	must(m.LeaseAt(at(0), grant(k, "a", 8, 5, false)))
	l = must(m.LeaseAt(at(100), grant(k, "a", 2, 5, false)))
	if !l.Granted || l.Renewed || !near(l.Leased, 8) || !near(l.Tokens, 90) {
		t.Fatalf("changed lease within the cut: %+v", l)
	}
	if l = must(m.LeaseAt(at(100), grant(k, "b", 8, 5, false))); !near(l.Rate, 2) {
		t.Fatalf("b gets only what a's old lease leaves until the cut: %+v", l)
	}
}

// TestLeaseValidate checks that bad lease requests are rejected with
// ErrInvalidLease and good ones are not.
func TestLeaseValidate(t *testing.T) {
	k := leaseKey(t, "p", "s")
	ok := grant(k, "node-1:envoy.a", 4, 10, false)
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mod := range map[string]func(q *bucket.LeaseRequest){
		"holder empty":    func(q *bucket.LeaseRequest) { q.Holder = "" },
		"holder bytes":    func(q *bucket.LeaseRequest) { q.Holder = "a b" },
		"rate 0":          func(q *bucket.LeaseRequest) { q.Rate = 0 },
		"rate NaN":        func(q *bucket.LeaseRequest) { q.Rate = math.NaN() },
		"rate above f·r":  func(q *bucket.LeaseRequest) { q.Rate = 10.5 },
		"burst 0":         func(q *bucket.LeaseRequest) { q.Burst = 0 },
		"burst above f·C": func(q *bucket.LeaseRequest) { q.Request.Share = 0.5; q.Burst = 51 },
		"for 0":           func(q *bucket.LeaseRequest) { q.For = 0 },
		"for past TTL":    func(q *bucket.LeaseRequest) { q.For = 51 * time.Second },
		"cut above for":   func(q *bucket.LeaseRequest) { q.Cut = 3 * time.Second },
		"cost":            func(q *bucket.LeaseRequest) { q.Request.Cost = 1 },
		"no refill":       func(q *bucket.LeaseRequest) { q.Request.Limits.RefillPerSecond = 0 },
		"window":          func(q *bucket.LeaseRequest) { q.Request.Limits.Algorithm = bucket.FixedWindow },
		"sharded":         func(q *bucket.LeaseRequest) { q.Request.Limits.Shards = 4 },
	} {
		q := ok
		mod(&q)
		if err := q.Validate(); !errors.Is(err, bucket.ErrInvalidLease) && !errors.Is(err, bucket.ErrInvalidRequest) && !errors.Is(err, bucket.ErrInvalidLimits) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if got := bucket.MaxLeaseFor(leaseLimits); got != 50*time.Second {
		t.Errorf("MaxLeaseFor = %v, want 50s", got)
	}
}

// leaseOp is one step of a random lease run.
type leaseOp struct {
	dt      time.Duration
	kind    int // 0 grant, 1 renew, 2 release, 3 hot take
	holder  string
	rate    float64
	burst   int64
	cost    int64
	within  time.Duration
	unspent int64
	share   float64
	keep    bool // a renewal keeps the holder's last lease (LeaseRequest.Keep)
}

func randomLeaseOps(rng *rand.Rand, n int) []leaseOp {
	holders := []string{"a", "b", "c"}
	rates := []float64{0.5, 2, 3.3, 5, 10}
	ops := make([]leaseOp, n)
	for i := range ops {
		o := leaseOp{
			dt:     time.Duration(rng.IntN(1200)) * time.Millisecond,
			kind:   rng.IntN(4),
			holder: holders[rng.IntN(len(holders))],
			rate:   rates[rng.IntN(len(rates))],
			burst:  1 + rng.Int64N(20),
			cost:   1 + rng.Int64N(10),
			share:  1,
		}
		if rng.IntN(50) == 0 {
			o.dt += 12 * time.Second // every lease ends, the bucket refills
		}
		if rng.IntN(20) == 0 {
			o.share = 0.6 // a share shrink (clamps the bucket; leases are not checked)
		}
		o.keep = o.kind == 1 && rng.IntN(4) == 0
		if o.kind == 2 {
			o.within = time.Duration(rng.IntN(2)) * 500 * time.Millisecond
			o.unspent = rng.Int64N(5)
		}
		ops[i] = o
	}
	return ops
}

// TestLeaseDifferential drives Memory and Redis through the same random
// grants, renewals, releases, hot-path takes, share changes and time
// steps, and demands equal answers.
func TestLeaseDifferential(t *testing.T) {
	r := newRedis(t, redistest.Client(t))
	var now int64
	bucket.SetRedisNow(r, func() int64 { return now })
	ctx := context.Background()
	var fresh, renewed int
	for seed := range uint64(4) {
		m, err := bucket.NewMemory(bucket.MemoryConfig{})
		if err != nil {
			t.Fatal(err)
		}
		k := leaseKey(t, redistest.Unique(t), "s")
		clock := leaseT0
		last := map[string]bucket.Lease{}
		for i, o := range randomLeaseOps(rand.New(rand.NewPCG(seed, 7)), 300) {
			clock = clock.Add(o.dt)
			now = clock.UnixMicro()
			req := bucket.Request{Key: k, Limits: leaseLimits, Share: o.share}
			var lm, lr bucket.Lease
			var em, er error
			switch o.kind {
			case 0, 1:
				q := grant(k, o.holder, min(o.rate, o.share*leaseLimits.RefillPerSecond), min(o.burst, 60), o.kind == 1)
				if g, ok := last[o.holder]; ok && o.kind == 1 && g.Rate <= o.share*leaseLimits.RefillPerSecond && g.Burst <= int64(o.share*float64(leaseLimits.Capacity)) {
					q.Rate, q.Burst = g.Rate, g.Burst
				}
				if g, ok := last[o.holder]; ok && o.keep {
					q.Rate, q.Burst, q.Keep = g.Rate, g.Burst, true
				}
				q.Request = req
				lm, em = m.LeaseAt(clock, q)
				lr, er = r.Lease(ctx, q)
			case 2:
				q := release(k, o.holder, o.unspent, o.within)
				q.Request = req
				lm, em = m.ReleaseAt(clock, q)
				lr, er = r.Release(ctx, q)
			case 3:
				req.Cost = o.cost
				dm, err1 := m.TakeAt(clock, req)
				dr, err2 := r.Take(ctx, req)
				if err1 != nil || err2 != nil || dm.Allowed != dr.Allowed || dm.Remaining != dr.Remaining {
					t.Fatalf("seed %d step %d take %+v: memory %+v %v, redis %+v %v", seed, i, o, dm, err1, dr, err2)
				}
				continue
			}
			if em != nil || er != nil {
				t.Fatalf("seed %d step %d %+v: memory %v, redis %v", seed, i, o, em, er)
			}
			if lm != lr && !(lm.Expiry.Equal(lr.Expiry) && sameLease(lm, lr)) {
				t.Fatalf("seed %d step %d %+v:\nmemory %+v\nredis  %+v", seed, i, o, lm, lr)
			}
			if lr.Granted {
				last[o.holder] = lr
			}
			if lr.Renewed {
				renewed++
			} else if lr.Granted {
				fresh++
			}
		}
	}
	if fresh < 50 || renewed < 10 {
		t.Errorf("%d fresh leases and %d renewals: the run exercised too few", fresh, renewed)
	}
}

func sameLease(a, b bucket.Lease) bool {
	a.Expiry, b.Expiry = time.Time{}, time.Time{}
	return a == b
}

// TestLeaseBound runs holders that spend every token their leases allow,
// as Envoy's token bucket does (a fresh lease starts full at its burst; a
// renewal keeps the holder's tokens; a changed lease reaches the holder
// up to the cut later, the old one in force until then), beside a hot
// path that takes all the bucket gives, and checks every window against
// C + r·W.
func TestLeaseBound(t *testing.T) {
	type holder struct {
		tokens, rate, burst float64
		end                 time.Time
		pending             *bucket.Lease // a changed lease on its way
		arrives             time.Time
	}
	for seed := range uint64(6) {
		m, err := bucket.NewMemory(bucket.MemoryConfig{})
		if err != nil {
			t.Fatal(err)
		}
		k := leaseKey(t, "p", "s")
		rng := rand.New(rand.NewPCG(seed, 11))
		hs := map[string]*holder{"a": {}, "b": {}, "c": {}}
		names := []string{"a", "b", "c"}
		var adms []boundcheck.Admission
		var fresh, renewed, denied int
		clock := leaseT0
		const step = 50 * time.Millisecond
		for i := 0; i < 2000; i++ {
			clock = clock.Add(step)
			// Holders refill and spend all they hold.
			for _, n := range names {
				h := hs[n]
				if h.pending != nil && !clock.Before(h.arrives) {
					h.tokens, h.rate, h.burst, h.end = float64(h.pending.Burst), h.pending.Rate, float64(h.pending.Burst), h.pending.Expiry
					h.pending = nil
				}
				if clock.Before(h.end) {
					h.tokens = min(h.burst, h.tokens+h.rate*step.Seconds())
					if n := int64(h.tokens); n > 0 {
						h.tokens -= float64(n)
						adms = append(adms, boundcheck.Admission{Policy: "p", Subject: "s", Region: "lease", At: clock, Cost: n})
					}
				}
			}
			// The hot path takes what it can, in bursts now and then
			// (so that leases find tokens for their bursts).
			for j := 0; rng.IntN(8) == 0 && j < 200; j++ {
				d, err := m.TakeAt(clock, bucket.Request{Key: k, Limits: leaseLimits, Share: 1, Cost: 1})
				if err != nil {
					t.Fatal(err)
				}
				if !d.Allowed {
					break
				}
				adms = append(adms, boundcheck.Admission{Policy: "p", Subject: "s", Region: "redis", At: clock, Cost: 1})
			}
			if i%10 != 0 {
				continue
			}
			// Every half second, each holder asks for a lease (a
			// renewal when it has one), or now and then releases.
			for _, n := range names {
				h := hs[n]
				if rng.IntN(15) == 0 {
					if _, err := m.ReleaseAt(clock, release(k, n, 0, time.Second)); err != nil {
						t.Fatal(err)
					}
					h.end = minTime(h.end, clock.Add(time.Second))
					if h.pending != nil {
						h.pending.Expiry = minTime(h.pending.Expiry, clock.Add(time.Second))
					}
					continue
				}
				rate := []float64{1, 3, 5}[rng.IntN(3)]
				renew := clock.Before(h.end) && h.pending == nil && rng.IntN(3) > 0
				burst := int64(math.Ceil(rate))
				if renew {
					rate, burst = h.rate, int64(h.burst)
				}
				l, err := m.LeaseAt(clock, grant(k, n, rate, burst, renew))
				if err != nil {
					t.Fatal(err)
				}
				if l.Leased > leaseLimits.RefillPerSecond+1e-9 {
					t.Fatalf("seed %d: leased %v above the refill", seed, l.Leased)
				}
				switch {
				case !l.Granted:
					denied++
				case l.Renewed:
					renewed++
					h.end = l.Expiry
				default:
					fresh++
					lc := l
					h.pending, h.arrives = &lc, clock.Add(time.Duration(rng.IntN(1000))*time.Millisecond)
				}
			}
		}
		rep, err := boundcheck.Check(boundcheck.Config{
			Limits:  map[string]bucket.Limits{"p": leaseLimits},
			Windows: []time.Duration{step, time.Second, 3 * time.Second, 10 * time.Second, time.Minute},
		}, adms)
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Violations) > 0 {
			t.Fatalf("seed %d: %d admissions, violations: %v", seed, rep.Decisions, rep.Violations[0])
		}
		var total int64
		for _, a := range adms {
			total += a.Cost
		}
		ideal := float64(leaseLimits.Capacity) + leaseLimits.RefillPerSecond*clock.Sub(leaseT0).Seconds()
		t.Logf("seed %d: %d fresh leases, %d renewals, %d denials; admitted %d of an ideal bucket's %.0f (%.1f%%)",
			seed, fresh, renewed, denied, total, ideal, 100*float64(total)/ideal)
		if fresh < 20 || renewed < 20 {
			t.Errorf("seed %d: the run exercised too few leases", seed)
		}
		if float64(total) < 0.5*ideal {
			t.Errorf("seed %d: admitted %d, less than half of %.0f", seed, total, ideal)
		}
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// TestLeaseKeep: the share shrinks from 1 to 0.3 (refill 10 → 3 per
// second) under holder a's lease of 8 per second. A plain renewal of it
// is refused (its rate is above the new refill); one that keeps extends
// it as it is, and it still counts: holder b is granted nothing while it
// lives. Once a stops keeping it, the lease ends and b is granted. Memory
// and Redis alike.
func TestLeaseKeep(t *testing.T) {
	r := newRedis(t, redistest.Client(t))
	var now int64
	bucket.SetRedisNow(r, func() int64 { return now })
	m, err := bucket.NewMemory(bucket.MemoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	stores := map[string]func(time.Time, bucket.LeaseRequest) (bucket.Lease, error){
		"memory": m.LeaseAt,
		"redis": func(at time.Time, q bucket.LeaseRequest) (bucket.Lease, error) {
			now = at.UnixMicro()
			return r.Lease(context.Background(), q)
		},
	}
	for name, lease := range stores {
		t.Run(name, func(t *testing.T) {
			k := leaseKey(t, redistest.Unique(t), "s")
			at := func(ms int) time.Time { return leaseT0.Add(time.Duration(ms) * time.Millisecond) }
			a, err := lease(at(0), grant(k, "a", 8, 10, false))
			if err != nil || !a.Granted || a.Rate != 8 {
				t.Fatalf("a's lease at share 1: %+v, %v", a, err)
			}
			shrunk := func(q bucket.LeaseRequest) bucket.LeaseRequest { q.Request.Share = 0.3; return q }
			plain := shrunk(grant(k, "a", a.Rate, a.Burst, true))
			if _, err := lease(at(500), plain); !errors.Is(err, bucket.ErrInvalidLease) {
				t.Fatalf("a plain renewal above the shrunk share: %v, want ErrInvalidLease", err)
			}
			keep := plain
			keep.Keep = true
			for ms := 500; ms <= 3500; ms += 1000 { // past the lease's 2 s
				got, err := lease(at(ms), keep)
				if err != nil || !got.Renewed || got.Rate != 8 || got.FreeRate > 0 {
					t.Fatalf("keeping a's lease at %d ms: %+v, %v; want it renewed at 8/s, no free refill", ms, got, err)
				}
				b, err := lease(at(ms+1), shrunk(grant(k, "b", 2, 5, false)))
				if err != nil || b.Granted {
					t.Fatalf("b's lease while a keeps its own: %+v, %v; want none", b, err)
				}
			}
			b, err := lease(at(6000), shrunk(grant(k, "b", 2, 5, false)))
			if err != nil || !b.Granted || b.Rate != 2 {
				t.Fatalf("b's lease once a's ended: %+v, %v", b, err)
			}
			notRenew := keep
			notRenew.Renew = false
			if _, err := lease(at(7000), notRenew); !errors.Is(err, bucket.ErrInvalidLease) {
				t.Fatalf("keep without renew: %v, want ErrInvalidLease", err)
			}
		})
	}
}

// TestLeaseAll: a batch of grants, renewals and one invalid request over
// several buckets, more than one pipeline long, gets from Redis the
// answers Memory gives to the same calls made one by one; after SCRIPT
// FLUSH (NOSCRIPT) the batch still goes through.
func TestLeaseAll(t *testing.T) {
	c := redistest.Client(t)
	r := newRedis(t, c)
	clk := leaseT0
	bucket.SetRedisNow(r, func() int64 { return clk.UnixMicro() })
	m, err := bucket.NewMemory(bucket.MemoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var keys []bucket.Key
	for i := range 7 {
		keys = append(keys, leaseKey(t, redistest.Unique(t), "s"+strconv.Itoa(i)))
	}
	batch := func(step int) []bucket.LeaseRequest {
		var reqs []bucket.LeaseRequest
		for i := range bucket.MaxLeaseBatch + 44 {
			q := grant(keys[i%len(keys)], "h"+strconv.Itoa(i%5), float64(1+i%3), int64(1+i%4), step > 0)
			reqs = append(reqs, q)
		}
		reqs[17].Rate = -1 // invalid: its own error, the others unaffected
		return reqs
	}
	ctx := context.Background()
	for step := range 3 {
		if step == 2 {
			if err := c.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
		clk = clk.Add(700 * time.Millisecond)
		reqs := batch(step)
		got, errs := r.LeaseAll(ctx, reqs)
		if len(got) != len(reqs) || len(errs) != len(reqs) {
			t.Fatalf("step %d: %d answers, %d errors for %d requests", step, len(got), len(errs), len(reqs))
		}
		for i, q := range reqs {
			want, werr := m.LeaseAt(clk, q)
			if (werr == nil) != (errs[i] == nil) || (werr != nil && !errors.Is(errs[i], bucket.ErrInvalidLease)) {
				t.Fatalf("step %d request %d: redis error %v, memory error %v", step, i, errs[i], werr)
			}
			if werr == nil && !(want.Expiry.Equal(got[i].Expiry) && sameLease(want, got[i])) {
				t.Fatalf("step %d request %d %+v:\nmemory %+v\nredis  %+v", step, i, q, want, got[i])
			}
		}
	}
}
