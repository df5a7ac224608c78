package bucket

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Leases carve time-bounded parts of a region's token bucket out for
// consumers that decide on their own (an Envoy over RLQS, a node deciding
// a hot subject in memory). A lease is a rate ρ and a burst b for a span
// of time: its holder may admit at most b at once and ρ per second after,
// until it ends, which is the shape of the token bucket an Envoy enforces.
//
// # Why the bound holds
//
// A region's bucket has capacity B = f·C and refill R = f·r. While any
// lease of a bucket lives, the bucket itself refills nothing on the hot
// path: a lease moves the bucket's stored timestamp to the lease's end
// (the refill code already reads a timestamp in the future as "nothing to
// add before then"). Instead, each lease call credits the bucket with the
// refill that no lease held since the previous call, ∫(R − Σρ(t))dt,
// clamped to the room the bucket had at that call (lim − Σ bursts −
// tokens then: the room only grows between calls, so a late credit never
// fills more than an eager one would have). A fresh lease takes its burst
// from the bucket's tokens; grants keep Σρ ≤ R over the live leases. So at
// every instant the tokens the bucket holds plus the bursts its live
// leases may hold are at most B, and what refills them all is at most R:
// the bucket and its leases together admit no more than the bucket alone
// would, in every window. A lease that lapses takes its unspent tokens
// with it (they were taken, so nothing is lost to the bound); one that is
// released with tokens its holder certifies unspent gives them back.
//
// A holder whose lease changes keeps using its previous one until the
// change reaches it: LeaseRequest.Cut says how long that may take, and
// until then the holder counts at the larger of its two leases.
//
// What the bound rests on: a holder stops using a lease by its end (the
// end includes the delivery margin the caller passes in For), and a
// region's share does not shrink under live leases (a node acknowledges a
// shrink only once the leases granted above the new share have ended; see
// internal/rlqs). A Redis-backed check of a leased subject gets only what
// the bucket holds between lease calls (RetryAfter then counts no refill
// before the lease's end).

// MaxLeaseHolders bounds the live leases of one bucket.
const MaxLeaseHolders = 64

// maxHolderLen bounds a lease holder's name.
const maxHolderLen = 64

// ErrInvalidLease reports a lease request that LeaseRequest.Validate or
// LeaseRelease.Validate rejects.
var ErrInvalidLease = errors.New("bucket: invalid lease")

func leaseErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidLease, fmt.Sprintf(format, args...))
}

// LeaseRequest asks for a lease on the token bucket of Request.Key, at the
// region's share Request.Share.
type LeaseRequest struct {
	// Request names the bucket and its limits; its Cost must be 0.
	Request Request
	// Holder names who holds the lease: [A-Za-z0-9_.:-]{1,64}. A holder
	// holds at most one lease of a bucket; a new grant replaces it.
	Holder string
	// Rate is what the holder may admit per second, in tokens; at most
	// the bucket's refill f·r.
	Rate float64
	// Burst is what the holder may admit at once, in tokens: the capacity
	// of its own bucket, which starts full. A fresh lease takes it from
	// the region's bucket. 1 ≤ Burst ≤ f·C.
	Burst int64
	// For is how long from now the holder may use the lease: its TTL plus
	// the time a grant may take to reach it. At least a millisecond, at
	// most IdleTTL less the bucket's full refill time C/r, so that the
	// bucket's Redis key (kept IdleTTL after its last write) outlives the
	// lease by a full refill.
	For time.Duration
	// Cut is how long the holder may still use its previous lease after
	// this call: the time a grant may take to reach it. 0 ≤ Cut ≤ For.
	Cut time.Duration
	// Renew extends the holder's live lease without taking its burst
	// again (the holder keeps its token state). It is honoured only when
	// that lease has this Rate and Burst and the rate still fits; else
	// the call grants a fresh lease.
	Renew bool
	// Keep, with Renew, extends the holder's live lease of this Rate and
	// Burst even when its rate no longer fits the bucket at
	// Request.Share: the share shrank under a lease its holder may still
	// use (an Envoy whose stream stalls may apply a renewal that waited
	// in it at any time, with a full TTL). The lease keeps counting, so
	// no other lease is granted its rate, and the region's node holds
	// back its acknowledgement of the shrink while it keeps the lease
	// (internal/rlqs): the region stays within the share the lease was
	// taken at. Rate and Burst are then bounded by the policy's limits at
	// share 1 + overcommit, not by Request.Share.
	Keep bool
}

// LeaseRelease ends a holder's lease early.
type LeaseRelease struct {
	// Request names the bucket and its limits; its Cost must be 0.
	Request Request
	// Holder names the lease's holder.
	Holder string
	// Unspent is what the holder certifies it will never admit, in
	// tokens; it goes back to the bucket (never above what the bucket and
	// the other leases may hold together).
	Unspent int64
	// Within is how long the holder may still use the lease (0: it has
	// stopped). For a remote holder it is the time the release may take
	// to reach it.
	Within time.Duration
}

// Lease is the answer to a lease call.
type Lease struct {
	// Granted reports that the holder has a lease with Rate and Burst
	// until Expiry (as the store's clock reads it).
	Granted bool
	// Renewed reports that the holder's lease was extended and its burst
	// not taken again.
	Renewed bool
	// Rate is the granted rate in tokens per second, at most the one
	// asked for: less when the other leases leave less of the refill.
	Rate float64
	// Burst is the granted burst in tokens.
	Burst int64
	// Expiry is when the lease ends.
	Expiry time.Time
	// Tokens is what the bucket holds for Redis-backed checks after the call.
	Tokens float64
	// FreeRate is the refill, in tokens per second, that no live lease holds.
	FreeRate float64
	// Leased is the rate, in tokens per second, that the live leases hold.
	Leased float64
}

// Leaser grants and releases leases. Memory and Redis implement it with
// the same decisions.
type Leaser interface {
	Lease(ctx context.Context, req LeaseRequest) (Lease, error)
	Release(ctx context.Context, rel LeaseRelease) (Lease, error)
}

func validHolder(h string) error {
	if len(h) == 0 || len(h) > maxHolderLen {
		return leaseErr("holder %q: want 1..%d bytes", h, maxHolderLen)
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if !(isSubjectByte(c) || c == '.' || c == ':') {
			return leaseErr("holder %q: byte %q outside [A-Za-z0-9_.:-]", h, c)
		}
	}
	return nil
}

// leaseBase validates what every lease call shares.
func leaseBase(r *Request, holder string) error {
	if err := r.Validate(); err != nil {
		return err
	}
	if a := r.Limits.Algorithm; a != "" && a != TokenBucket {
		return leaseErr("algorithm %s: only token buckets are leased", a)
	}
	if r.Limits.RefillPerSecond <= 0 {
		return leaseErr("refill 0: a bucket without refill cannot be leased")
	}
	if r.Limits.Shards > 1 {
		// Checks of a sharded policy take from its sub-buckets, which a
		// lease of the one bucket would not see: both would spend.
		return leaseErr("shards %d: a bucket split into sub-buckets cannot be leased", r.Limits.Shards)
	}
	if r.Cost != 0 {
		return leaseErr("cost %d: a lease call takes no cost", r.Cost)
	}
	return validHolder(holder)
}

// MaxLeaseFor returns the longest LeaseRequest.For that l allows: IdleTTL
// less the full refill time C/r (rounded up to a millisecond); 0 when l
// cannot be leased.
func MaxLeaseFor(l Limits) time.Duration {
	if l.RefillPerSecond <= 0 {
		return 0
	}
	full := time.Duration(math.Ceil(float64(l.Capacity)/l.RefillPerSecond*1000)) * time.Millisecond
	return max(0, l.IdleTTL-full)
}

// Validate reports whether q can be granted.
func (q LeaseRequest) Validate() error {
	if err := leaseBase(&q.Request, q.Holder); err != nil {
		return err
	}
	r := &q.Request
	share := r.Share
	if q.Keep {
		if !q.Renew {
			return leaseErr("keep without renew")
		}
		share = max(share, 1+r.Limits.Overcommit)
	}
	if !finite(q.Rate) || q.Rate <= 0 || q.Rate > share*r.Limits.RefillPerSecond {
		return leaseErr("rate %v outside (0, %v] (the bucket's refill)", q.Rate, share*r.Limits.RefillPerSecond)
	}
	if lim := int64(share * float64(r.Limits.Capacity)); q.Burst < 1 || q.Burst > lim {
		return leaseErr("burst %d outside 1..%d (the bucket's capacity)", q.Burst, lim)
	}
	if most := MaxLeaseFor(r.Limits); q.For < time.Millisecond || q.For > most {
		return leaseErr("for %v outside 1ms..%v (idle TTL less a full refill)", q.For, most)
	}
	if q.Cut < 0 || q.Cut > q.For {
		return leaseErr("cut %v outside 0..%v (for)", q.Cut, q.For)
	}
	return nil
}

// Validate reports whether q can be applied.
func (q LeaseRelease) Validate() error {
	if err := leaseBase(&q.Request, q.Holder); err != nil {
		return err
	}
	if q.Unspent < 0 || q.Unspent > q.Request.Limits.Capacity {
		return leaseErr("unspent %d outside 0..%d", q.Unspent, q.Request.Limits.Capacity)
	}
	if q.Within < 0 || q.Within > MaxLeaseFor(q.Request.Limits) {
		return leaseErr("within %v outside 0..%v", q.Within, MaxLeaseFor(q.Request.Limits))
	}
	return nil
}

// ---- the reference model (lua/lease.lua computes the same) ----

// leaseHolder is one holder's lease in script units: rates in units per
// microsecond, bursts in units, ends in microseconds. (r1, b1, e1) is the
// current lease; (r2, b2, e2) the previous one, still usable until e2.
type leaseHolder struct {
	name       string
	r1, b1, e1 float64
	r2, b2, e2 float64
}

// at returns the rate and burst h counts for at us: the larger of its
// leases still live.
func (h *leaseHolder) at(us float64) (rate, burst float64) {
	if us < h.e1 {
		rate, burst = h.r1, h.b1
	}
	if us < h.e2 {
		rate, burst = max(rate, h.r2), max(burst, h.b2)
	}
	return rate, burst
}

// held integrates h's rate over [a, b].
func (h *leaseHolder) held(a, b float64) float64 {
	lo, hi, rl := h.e1, h.e2, h.r2
	if h.e2 < h.e1 {
		lo, hi, rl = h.e2, h.e1, h.r1
	}
	// The conversions keep the compiler from fusing the multiply-adds, so
	// that Lua's doubles give the same result.
	return float64(max(h.r1, h.r2)*span(a, min(lo, b))) + float64(rl*span(max(a, lo), min(hi, b)))
}

func span(a, b float64) float64 {
	if b > a {
		return b - a
	}
	return 0
}

// leaseSet is one bucket's leases: holders sorted by name, and what the
// last call left: its instant, the end of the blocked refill (until), and
// the room the bucket then had for credits.
type leaseSet struct {
	last, until, room float64
	holders           []leaseHolder
}

// leaseArgs is one lease call in script units.
type leaseArgs struct {
	op          byte // 'g' grant, 'x' release
	holder      string
	rate, burst float64 // grant; burst is Unspent for a release
	dur, cut    float64 // grant: For, Cut; release: Within (dur)
	renew, keep bool
}

// leaseOut is the outcome of a lease call in script units.
type leaseOut struct {
	granted, renewed   bool
	rate, burst, until float64
	tokens, free, held float64
	ts                 float64 // the bucket's new stored timestamp
	write              bool    // the bucket (tokens, ts) must be written
}

// leaseStep applies a to the bucket holding tokens at t (the later of now
// and its stored timestamp) with capacity lim and refill R (p.p), and to
// set, which it updates. It mirrors lua/lease.lua.
func leaseStep(p *params, a *leaseArgs, set *leaseSet, tokens, t, now float64) leaseOut {
	lim, R := p.lim, p.p
	var o leaseOut
	o.ts = t
	// Credit the refill no lease held since the last call, while the hot
	// path was blocked (until ≥ now), at most the room then.
	if set.until >= now && set.last < now {
		pend := float64(R * (now - set.last))
		for i := range set.holders {
			pend -= set.holders[i].held(set.last, now)
		}
		if c := math.Floor(min(pend, set.room)); c > 0 {
			tokens += c
			o.write = true
		}
	}
	live := set.holders[:0]
	for _, h := range set.holders {
		if max(h.e1, h.e2) > now {
			live = append(live, h)
		}
	}
	set.holders = live
	self := -1
	var otherRate float64
	for i := range set.holders {
		if set.holders[i].name == a.holder {
			self = i
			continue
		}
		r, _ := set.holders[i].at(now)
		otherRate += r
	}
	if a.op == 'g' {
		avail := R - otherRate
		var h *leaseHolder
		if self >= 0 {
			h = &set.holders[self]
		}
		// A renewal names the rate it was granted, which went through a
		// conversion to tokens per second and back: a billionth of slack.
		if a.renew && h != nil && h.e1 > now && math.Abs(h.r1-a.rate) <= h.r1*1e-9 && h.b1 == a.burst && (h.r1 <= avail || a.keep) {
			h.e1 = now + a.dur
			o.granted, o.renewed, o.rate, o.burst = true, true, h.r1, h.b1
		} else if g := min(a.rate, avail); g > 0 && tokens >= a.burst && (h != nil || len(set.holders) < MaxLeaseHolders) {
			tokens -= a.burst
			o.write = true
			nh := leaseHolder{name: a.holder, r1: g, b1: a.burst, e1: now + a.dur}
			if h != nil {
				nh.r2, nh.b2 = h.at(now)
				nh.e2 = min(max(h.e1, h.e2), now+a.cut)
				*h = nh
			} else {
				set.holders = append(set.holders, nh)
				slices.SortFunc(set.holders, func(x, y leaseHolder) int { return strings.Compare(x.name, y.name) })
			}
			o.granted, o.rate, o.burst = true, g, a.burst
		}
		if o.granted {
			o.write = true
			o.until = now + a.dur
			set.until = max(set.until, o.until)
		}
	} else if self >= 0 {
		h := &set.holders[self]
		if a.dur == 0 {
			set.holders = slices.Delete(set.holders, self, self+1)
		} else {
			h.e1, h.e2 = min(h.e1, now+a.dur), min(h.e2, now+a.dur)
		}
	}
	var bursts float64
	for i := range set.holders {
		r, b := set.holders[i].at(now)
		o.held += r
		bursts += b
	}
	if a.op == 'x' && a.burst > 0 {
		if back := min(tokens+a.burst, lim-bursts); back > tokens {
			tokens = back
			o.write = true
		}
	}
	if len(set.holders) == 0 {
		// No lease lives: the hot path refills from now on.
		if set.until > now || o.ts > now {
			o.write = true
		}
		set.until = now
		o.ts = now
	} else {
		o.ts = max(o.ts, set.until)
	}
	set.last = now
	set.room = max(0, lim-bursts-tokens)
	o.tokens, o.free = tokens, R-o.held
	return o
}

// ---- Memory ----

// memLeases holds Memory's lease sets, under Memory's leaseMu.
type memLeases map[Key]*leaseSet

// Lease implements Leaser at the configured clock's time.
func (m *Memory) Lease(_ context.Context, req LeaseRequest) (Lease, error) {
	return m.LeaseAt(m.clk.Now(), req)
}

// Release implements Leaser at the configured clock's time.
func (m *Memory) Release(_ context.Context, rel LeaseRelease) (Lease, error) {
	return m.ReleaseAt(m.clk.Now(), rel)
}

// LeaseAt grants req at now.
func (m *Memory) LeaseAt(now time.Time, req LeaseRequest) (Lease, error) {
	if err := req.Validate(); err != nil {
		return Lease{}, err
	}
	return m.leaseAt(now, &req.Request, grantArgs(&req))
}

// ReleaseAt applies rel at now.
func (m *Memory) ReleaseAt(now time.Time, rel LeaseRelease) (Lease, error) {
	if err := rel.Validate(); err != nil {
		return Lease{}, err
	}
	return m.leaseAt(now, &rel.Request, releaseArgs(&rel))
}

func grantArgs(q *LeaseRequest) leaseArgs {
	return leaseArgs{op: 'g', holder: q.Holder, rate: q.Rate / 1e6 * unitsPerToken,
		burst: float64(q.Burst) * unitsPerToken, dur: float64(q.For.Microseconds()),
		cut: float64(q.Cut.Microseconds()), renew: q.Renew, keep: q.Keep}
}

func releaseArgs(q *LeaseRelease) leaseArgs {
	return leaseArgs{op: 'x', holder: q.Holder, burst: float64(q.Unspent) * unitsPerToken,
		dur: float64(q.Within.Microseconds())}
}

func (m *Memory) leaseAt(now time.Time, req *Request, a leaseArgs) (Lease, error) {
	p := paramsOf(req)
	us := now.UnixMicro()
	sh := &m.shards[m.shardOf(&req.Key)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	m.leaseMu.Lock()
	defer m.leaseMu.Unlock()
	set := m.leases[req.Key]
	if set == nil {
		if len(m.leases) >= int(m.max) {
			m.pruneLeases(float64(us))
			if len(m.leases) >= int(m.max) {
				return Lease{}, fmt.Errorf("%w: %d lease sets", ErrMemoryFull, len(m.leases))
			}
		}
		set = &leaseSet{last: float64(us)}
	}
	e := sh.find(&req.Key)
	var st State
	if e != nil {
		st = e.st
	}
	if st.absent(&p, us) {
		p.born = m.born(&req.Key, us, p.since)
	}
	var bo outcome
	lw := st.into(&p, opTake, us, false, &bo)
	t := float64(us)
	if !st.absent(&p, us) && st.st.a > t {
		t = st.st.a
	}
	o := leaseStep(&p, &a, set, bo.rem, t, float64(us))
	if o.write || bo.w == writeSet {
		bo.w, bo.a, bo.b, bo.c = writeSet, o.ts, o.tokens, p.lim
		if e != nil {
			e.st.commit(&p, &bo, lw, us)
		} else {
			if err := m.reserve(sh, us); err != nil {
				return Lease{}, err
			}
			sh.insert(&req.Key).st.commit(&p, &bo, lw, us)
		}
	}
	if len(set.holders) == 0 {
		delete(m.leases, req.Key)
	} else {
		if m.leases == nil {
			m.leases = make(memLeases)
		}
		m.leases[req.Key] = set
	}
	return leaseOf(&o, now.Truncate(time.Microsecond).Add(time.Duration(o.until-float64(us))*time.Microsecond)), nil
}

// pruneLeases drops the lease sets with no live holder.
func (m *Memory) pruneLeases(us float64) {
	for k, s := range m.leases {
		live := false
		for _, h := range s.holders {
			live = live || max(h.e1, h.e2) > us
		}
		if !live {
			delete(m.leases, k)
		}
	}
}

func leaseOf(o *leaseOut, expiry time.Time) Lease {
	l := Lease{
		Granted: o.granted, Renewed: o.renewed,
		Rate:     o.rate * 1e6 / unitsPerToken,
		Burst:    int64(o.burst / unitsPerToken),
		Tokens:   o.tokens / unitsPerToken,
		FreeRate: o.free * 1e6 / unitsPerToken,
		Leased:   o.held * 1e6 / unitsPerToken,
	}
	if o.granted {
		l.Expiry = expiry
	}
	return l
}

// ---- Redis ----

// leaseKey is the Redis key of k's lease set: a hash in k's group slot,
// "rl:lease:v<version>:{g.<g>}:<policy>:<subject>", field "_" holding
// "last until room" and one field per holder (see lua/lease.lua).
func leaseKey(k *Key, g uint32) string {
	return "rl:lease:" + ownKey(k, g)[len("rl:"):]
}

// Lease implements Leaser: one script call, atomic in Redis, timed by
// Redis TIME.
func (r *Redis) Lease(ctx context.Context, req LeaseRequest) (Lease, error) {
	if err := req.Validate(); err != nil {
		return Lease{}, err
	}
	return r.lease(ctx, &req.Request, grantArgs(&req))
}

// Release implements Leaser.
func (r *Redis) Release(ctx context.Context, rel LeaseRelease) (Lease, error) {
	if err := rel.Validate(); err != nil {
		return Lease{}, err
	}
	return r.lease(ctx, &rel.Request, releaseArgs(&rel))
}

func (r *Redis) lease(ctx context.Context, req *Request, a leaseArgs) (Lease, error) {
	keys, args := r.leaseCall(req, a)
	res, err := scriptLease.Run(ctx, r.client, keys, args...).StringSlice()
	if err != nil {
		return Lease{}, fmt.Errorf("bucket: redis lease %s for %s: %w", req.Key, a.holder, err)
	}
	return leaseReply(&req.Key, res)
}

// leaseCall is the lease script's keys and arguments for a on req.
func (r *Redis) leaseCall(req *Request, a leaseArgs) ([]string, []any) {
	p := paramsOf(req)
	k := &req.Key
	g := groupOf(k.subject, r.groups)
	now := ""
	if r.now != nil {
		now = strconv.FormatInt(r.now(), 10)
	}
	ff := func(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }
	renew := "0"
	switch {
	case a.keep:
		renew = "2"
	case a.renew:
		renew = "1"
	}
	return []string{groupKey(k, g), leaseKey(k, g)}, []any{
		string(rune(a.op)), now, fieldOf(k), ff(p.lim), ff(p.p), p.ttl, ff(p.fill), ff(p.since), r.guard,
		a.holder, ff(a.rate), ff(a.burst), ff(a.dur), ff(a.cut), renew}
}

// leaseReply reads the lease script's reply for k.
func leaseReply(k *Key, res []string) (Lease, error) {
	if len(res) != 9 {
		return Lease{}, fmt.Errorf("bucket: redis lease %s: reply of %d values, want 9", k, len(res))
	}
	var v [9]float64
	for i, s := range res {
		var err error
		if v[i], err = strconv.ParseFloat(s, 64); err != nil {
			return Lease{}, fmt.Errorf("bucket: redis lease %s: reply %q: %w", k, s, err)
		}
	}
	o := leaseOut{granted: v[0] == 1, renewed: v[1] == 1, rate: v[2], burst: v[3], until: v[4], tokens: v[5], free: v[6], held: v[7]}
	nowUs := v[8]
	return leaseOf(&o, time.UnixMicro(int64(nowUs)).Add(time.Duration(o.until-nowUs)*time.Microsecond)), nil
}

// BatchLeaser grants several leases in one round trip to the store: each
// as Lease would, in order, each atomic on its own (the batch is not).
// A caller renewing many leases each interval (internal/rlqs) pays one
// round trip instead of one per lease.
type BatchLeaser interface {
	LeaseAll(ctx context.Context, reqs []LeaseRequest) ([]Lease, []error)
}

// MaxLeaseBatch bounds the lease calls LeaseAll sends in one pipeline;
// more go in further ones.
const MaxLeaseBatch = 256

// LeaseAll implements BatchLeaser at the configured clock's time.
func (m *Memory) LeaseAll(_ context.Context, reqs []LeaseRequest) ([]Lease, []error) {
	out, errs := make([]Lease, len(reqs)), make([]error, len(reqs))
	now := m.clk.Now()
	for i := range reqs {
		out[i], errs[i] = m.LeaseAt(now, reqs[i])
	}
	return out, errs
}

// LeaseAll implements BatchLeaser: the lease script calls go out in
// pipelines of at most MaxLeaseBatch (EVALSHA; a call answered NOSCRIPT
// is sent again on its own, with EVAL if needed).
func (r *Redis) LeaseAll(ctx context.Context, reqs []LeaseRequest) ([]Lease, []error) {
	out, errs := make([]Lease, len(reqs)), make([]error, len(reqs))
	for lo := 0; lo < len(reqs); lo += MaxLeaseBatch {
		hi := min(lo+MaxLeaseBatch, len(reqs))
		pipe := r.client.Pipeline()
		cmds := make([]*redis.Cmd, hi-lo)
		for i := lo; i < hi; i++ {
			if errs[i] = reqs[i].Validate(); errs[i] != nil {
				continue
			}
			keys, args := r.leaseCall(&reqs[i].Request, grantArgs(&reqs[i]))
			cmds[i-lo] = scriptLease.EvalSha(ctx, pipe, keys, args...)
		}
		_, _ = pipe.Exec(ctx) // each command carries its own error
		for i := lo; i < hi; i++ {
			cmd := cmds[i-lo]
			if cmd == nil {
				continue
			}
			res, err := cmd.StringSlice()
			if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
				out[i], errs[i] = r.Lease(ctx, reqs[i])
				continue
			}
			if err != nil {
				errs[i] = fmt.Errorf("bucket: redis lease %s for %s: %w", reqs[i].Request.Key, reqs[i].Holder, err)
				continue
			}
			out[i], errs[i] = leaseReply(&reqs[i].Request.Key, res)
		}
	}
	return out, errs
}

var scriptLease = redis.NewScript(leaseSource())

func leaseSource() string {
	read := func(name string) string {
		b, err := luaFiles.ReadFile(name)
		if err != nil {
			panic("bucket: embedded script missing: " + name) // a build defect, not input
		}
		return string(b)
	}
	return read("lua/common.lua") + read("lua/token_bucket.lua") + read("lua/lease.lua")
}
