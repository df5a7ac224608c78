package bucket

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"time"
)

// MaxShards bounds Limits.Shards: a take whose cost no single sub-bucket
// holds is split over the sub-buckets in one TakeAll, which checks at most
// MaxTakeAll buckets.
const MaxShards = MaxTakeAll

// clusterSlots is the number of Redis Cluster hash slots.
const clusterSlots = 16384

// shardSearch bounds the names tried per sub-bucket when looking for one
// whose group lies in the sub-bucket's slot range (see shardSubject).
const shardSearch = 64

// shardRateTrim scales every sub-bucket's refill down by a few units in the
// last place of a float64, so that the sub-rates, each rounded by two
// float operations, never add up to more than the whole bucket's rate.
const shardRateTrim = 1 - 0x1p-46

// shardOps is what the sharded path needs of a store: single-bucket calls
// (take or refund) and all-or-nothing takes, at one instant for Memory.
type shardOps struct {
	one func(req *Request, op byte) (Decision, error)
	all func(reqs []Request) ([]Decision, error)
	// groups places sub-buckets on Redis Cluster slots (Redis's Groups);
	// 0 names them by index only (Memory, where placement means nothing).
	groups uint32
}

// sharded reports whether req addresses a whole sharded bucket, which the
// store splits into sub-bucket calls.
func (r *Request) sharded() bool { return r.Limits.Shards > 1 && r.Limits.shard == 0 }

// shardUnits is sub-bucket i's part (of k) of an amount u of milli-tokens:
// the whole tokens of u split as evenly as integers allow (the first
// u mod k sub-buckets hold one more), and the fraction of a token on
// sub-bucket 0. The parts add up to u exactly, and each part only grows
// when u grows.
func shardUnits(u float64, i, k int) float64 {
	t := math.Floor(u / unitsPerToken)
	q := math.Floor(t / float64(k))
	v := q
	if float64(i) < t-q*float64(k) {
		v++
	}
	v *= unitsPerToken
	if i == 0 {
		v += u - t*unitsPerToken
	}
	return v
}

// activeShards is how many sub-buckets of k hold anything when the whole
// bucket holds lim milli-tokens: all k from k whole tokens on, else one per
// whole token (sub-bucket 0 also holds the fraction, so at least one).
func activeShards(lim float64, k int) int {
	return max(1, min(k, int(lim/unitsPerToken)))
}

// split turns the whole bucket's params into sub-bucket i's (of k):
// capacity and fill by shardUnits, and for a token bucket a refill in
// proportion to the capacity, so that every sub-bucket refills in the
// whole bucket's full refill time and the sub-rates add up to the whole
// rate (rounded down). Window algorithms keep their window.
func (p *params) split(i, k int) {
	whole := p.lim
	p.lim = shardUnits(whole, i, k)
	// Both parts grow with their amount, but the fractions may differ:
	// the clamp keeps a sub-bucket's fill within its capacity.
	p.fill = min(p.lim, shardUnits(p.fill, i, k))
	if p.alg == algTB {
		if whole > 0 {
			p.p = p.p * (p.lim / whole) * shardRateTrim
		} else {
			p.p = 0
		}
	}
}

// shardSubject names sub-bucket i (of k) of subject. With groups > 0 (a
// Redis store), it is subject + "." + n for the smallest n whose group's
// hash tag falls in the i-th of k equal ranges of the 16384 cluster slots,
// so that a cluster whose masters hold equal contiguous slot ranges (as
// redis-cli --cluster create assigns them) spreads the sub-buckets evenly
// over its masters when k is a multiple of their number. When no such n
// lies below shardSearch·k (few groups), and always without groups, the
// name is subject + ".s" + i. A '.' cannot occur in a subject, so no
// sub-bucket ever meets a plain subject's bucket, and the two forms never
// meet each other.
func shardSubject(subject string, i, k int, groups uint32) string {
	b := make([]byte, 0, len(subject)+8)
	b = append(b, subject...)
	b = append(b, '.')
	if groups > 0 {
		for n := 0; n < shardSearch*k; n++ {
			b = strconv.AppendUint(b[:len(subject)+1], uint64(n), 10)
			slot := int(groupClusterSlot(groupOf(string(b), groups)))
			if slot*k/clusterSlots == i {
				return string(b)
			}
		}
	}
	b = append(b[:len(subject)+1], 's')
	return string(strconv.AppendUint(b, uint64(i), 10))
}

// shardReq is sub-bucket i's request for the whole bucket's req.
func (o *shardOps) shardReq(req *Request, i int) Request {
	sub := *req
	k := &req.Key
	sub.Key = Key{policy: k.policy, version: k.version}
	sub.Key.subject = shardSubject(k.subject, i, req.Limits.Shards, o.groups)
	sub.Key.hash = keyHash(k.policy, k.version, sub.Key.subject)
	sub.Limits.shard = uint8(i + 1)
	return sub
}

// wholeDecision reports sub-bucket i's decision d as the whole bucket's:
// Limit is the whole capacity, Remaining the sub-bucket's scaled by the
// whole capacity over the sub-bucket's (an estimate: the other sub-buckets
// are not read), RetryAfter and ResetAfter the sub-bucket's.
func wholeDecision(d Decision, whole, part float64) Decision {
	if part > 0 {
		d.Remaining = math.Floor(d.Remaining*unitsPerToken*whole/part) / unitsPerToken
	}
	d.Limit = whole / unitsPerToken
	return d
}

// take decides req for a sharded bucket (see Limits.Shards).
func (o *shardOps) take(req *Request, op byte) (Decision, error) {
	if err := req.Validate(); err != nil {
		return Decision{}, err
	}
	whole := paramsOf(req)
	k := req.Limits.Shards
	n := activeShards(whole.lim, k)
	start := rand.IntN(n)
	switch {
	case op == opRefund:
		return o.refund(req, whole.lim, n, start)
	case req.Cost == 0:
		return o.every(req, whole.lim, n, opTake, func(int) int64 { return 0 })
	}
	cost := float64(req.Cost) * unitsPerToken
	ds := make([]Decision, n)
	for j := range n {
		i := (start + j) % n
		sub := o.shardReq(req, i)
		d, err := o.one(&sub, opTake)
		if err != nil {
			return Decision{}, err
		}
		if d.Allowed {
			return wholeDecision(d, whole.lim, shardUnits(whole.lim, i, k)), nil
		}
		ds[i] = d
	}
	// No sub-bucket holds the cost alone: take it from several when what
	// they hold adds up to it.
	if n > 1 && cost <= whole.lim {
		if d, ok, err := o.splitTake(req, ds, whole.lim, start); err != nil || ok {
			return d, err
		}
	}
	return o.denial(ds, &whole, cost, k), nil
}

// splitTake takes req.Cost from several sub-buckets at once (TakeAll, all
// or nothing), in milli-tokens from each as the denials ds last reported
// them, starting at start. ok is false when they do not add up to the cost
// or the TakeAll denied (tokens taken by others in between).
func (o *shardOps) splitTake(req *Request, ds []Decision, whole float64, start int) (Decision, bool, error) {
	need := req.Cost * unitsPerToken
	var subs []Request
	for j := range ds {
		if need == 0 {
			break
		}
		i := (start + j) % len(ds)
		have := min(int64(math.Round(ds[i].Remaining*unitsPerToken)), need)
		if have <= 0 {
			continue
		}
		sub := o.shardReq(req, i)
		sub.units = have
		sub.Cost = (have + unitsPerToken - 1) / unitsPerToken
		subs = append(subs, sub)
		need -= have
	}
	if need > 0 {
		return Decision{}, false, nil
	}
	out, err := o.all(subs)
	if err != nil {
		return Decision{}, false, err
	}
	if !out[0].Allowed {
		return Decision{}, false, nil
	}
	d := Decision{Allowed: true, Limit: whole / unitsPerToken}
	for _, x := range out {
		d.add(x)
	}
	return d, true, nil
}

// denial is the whole bucket's denial of cost from its sub-buckets' denials
// ds: Remaining is their sum, ResetAfter the longest. RetryAfter, for a
// token bucket and a cost within the whole capacity, is the time the whole
// refill rate needs to bring their sum up to the cost: a split take admits
// it then, and no sub-bucket alone holds it sooner (a sub-bucket that is
// full stops refilling, so it may take longer, never less: a negative cache
// that waits RetryAfter never denies what the store would admit). For a
// window algorithm it is the soonest a sub-bucket large enough for the cost
// holds it; for a cost above the whole capacity, the longest RetryAfter (a
// full refill, as one bucket answers).
func (o *shardOps) denial(ds []Decision, whole *params, cost float64, k int) Decision {
	d := Decision{Limit: whole.lim / unitsPerToken}
	var soonest, longest time.Duration = -1, 0
	for i, x := range ds {
		d.add(x)
		longest = max(longest, x.RetryAfter)
		if shardUnits(whole.lim, i, k) >= cost && (soonest < 0 || x.RetryAfter < soonest) {
			soonest = x.RetryAfter
		}
	}
	switch {
	case cost <= whole.lim && whole.alg == algTB && whole.p > 0:
		missing := max(0, cost-math.Round(d.Remaining*unitsPerToken))
		d.RetryAfter = max(time.Microsecond, time.Duration(math.Ceil(missing/whole.p))*time.Microsecond)
	case soonest >= 0:
		d.RetryAfter = soonest
	default:
		d.RetryAfter = longest
	}
	return d
}

// refund gives req.Cost back: to the sub-bucket at start when the smallest
// active sub-bucket could hold it, else split over the active sub-buckets
// as the capacity is (shardUnits), each part capped at its sub-bucket's
// capacity like any refund.
func (o *shardOps) refund(req *Request, whole float64, n, start int) (Decision, error) {
	k := req.Limits.Shards
	cost := float64(req.Cost) * unitsPerToken
	if cost <= shardUnits(whole, n-1, k) {
		sub := o.shardReq(req, start)
		d, err := o.one(&sub, opRefund)
		return wholeDecision(d, whole, shardUnits(whole, start, k)), err
	}
	return o.every(req, whole, n, opRefund, func(i int) int64 { return int64(shardUnits(cost, i, n) / unitsPerToken) })
}

// every calls each of the n active sub-buckets with op and cost part(i)
// (a peek: part 0; a refund skips a part of 0) and reports the whole
// bucket: their remainders added up, the longest ResetAfter.
func (o *shardOps) every(req *Request, whole float64, n int, op byte, part func(i int) int64) (Decision, error) {
	d := Decision{Allowed: true, Limit: whole / unitsPerToken}
	for i := range n {
		sub := o.shardReq(req, i)
		if sub.Cost = part(i); sub.Cost == 0 && op == opRefund {
			continue
		}
		x, err := o.one(&sub, op)
		if err != nil {
			return Decision{}, err
		}
		d.add(x)
	}
	return d, nil
}

// add counts a sub-bucket's decision x into d, a whole bucket's: the
// remainders add up, the longest ResetAfter stays.
func (d *Decision) add(x Decision) {
	d.Remaining += x.Remaining
	d.ResetAfter = max(d.ResetAfter, x.ResetAfter)
}

// takeAll checks reqs all or nothing when some of them are sharded: each
// sharded request goes to one sub-bucket, starting at a random one, and
// while a sharded request's sub-bucket denies, the TakeAll is tried again
// with the next sub-bucket of the sharded requests that denied, until
// each has tried all its active sub-buckets. A sharded request whose cost
// is more than its largest sub-bucket holds (but within its whole
// capacity) is split over its active sub-buckets as the capacity is
// (shardUnits), so every part fits its sub-bucket. At most MaxTakeAll
// buckets in all.
func (o *shardOps) takeAll(reqs []Request) ([]Decision, error) {
	type member struct {
		whole      params
		n, at      int  // active sub-buckets, the one tried now
		split      bool // cost split over all n
		first, end int  // its requests in subs
	}
	ms := make([]member, len(reqs))
	rounds := 1
	for j := range reqs {
		if err := reqs[j].Validate(); err != nil {
			return nil, fmt.Errorf("request %d: %w", j, err)
		}
		if !reqs[j].sharded() {
			continue
		}
		m := &ms[j]
		m.whole = paramsOf(&reqs[j])
		m.n = activeShards(m.whole.lim, reqs[j].Limits.Shards)
		m.at = rand.IntN(m.n)
		cost := float64(reqs[j].Cost) * unitsPerToken
		m.split = m.n > 1 && cost > shardUnits(m.whole.lim, 0, reqs[j].Limits.Shards) && cost <= m.whole.lim
		if !m.split {
			rounds = max(rounds, m.n)
		}
	}
	var subs []Request
	for round := 0; ; round++ {
		subs = subs[:0]
		for j := range reqs {
			m := &ms[j]
			m.first = len(subs)
			switch {
			case m.n == 0:
				subs = append(subs, reqs[j])
			case m.split:
				for i := range m.n {
					sub := o.shardReq(&reqs[j], i)
					sub.Cost = int64(shardUnits(float64(reqs[j].Cost)*unitsPerToken, i, m.n) / unitsPerToken)
					subs = append(subs, sub)
				}
			default:
				subs = append(subs, o.shardReq(&reqs[j], m.at))
			}
			m.end = len(subs)
		}
		if len(subs) > MaxTakeAll {
			return nil, fmt.Errorf("%w: %d buckets once sharded requests are split over their sub-buckets", ErrTakeAllSize, len(subs))
		}
		ds, err := o.all(subs)
		if err != nil {
			return nil, err
		}
		out := make([]Decision, len(reqs))
		retry := false
		for j := range reqs {
			m := &ms[j]
			x := ds[m.first]
			switch {
			case m.n == 0:
			case m.split:
				x.Limit = m.whole.lim / unitsPerToken
				for _, y := range ds[m.first+1 : m.end] {
					x.add(y)
					x.RetryAfter = max(x.RetryAfter, y.RetryAfter)
				}
			default:
				x = wholeDecision(x, m.whole.lim, shardUnits(m.whole.lim, m.at, reqs[j].Limits.Shards))
				if !x.Allowed && x.RetryAfter > 0 {
					retry = true
					m.at = (m.at + 1) % m.n
				}
			}
			out[j] = x
		}
		if out[0].Allowed || !retry || round+1 >= rounds {
			return out, nil
		}
	}
}
