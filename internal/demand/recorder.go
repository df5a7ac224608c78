package demand

import (
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quotacoord/quota/internal/clock"
	"github.com/quotacoord/quota/internal/etcdlayout"
)

// Defaults for Config fields left zero.
const (
	DefaultTopK        = 32
	DefaultMaxPolicies = 1024
	DefaultShards      = 8
)

// Limits on what a Recorder keeps.
const (
	// MaxTopK bounds Config.TopK.
	MaxTopK = 1024
	// MaxShards bounds Config.Shards.
	MaxShards = 256
	// MaxPolicyNameLen is the longest policy name recorded; records of
	// longer names are dropped.
	MaxPolicyNameLen = 64
	// MaxSubjectLen is the longest subject kept in the pressured summary.
	MaxSubjectLen = 96
)

// ErrInvalidConfig reports a Config that New cannot use.
var ErrInvalidConfig = errors.New("demand: invalid config")

// Config configures a Recorder. Zero fields take their defaults.
type Config struct {
	// TopK is how many pressured subjects a report carries per policy, and
	// how many counters each shard of a policy keeps. Default 32.
	TopK int
	// MaxPolicies caps the policies tracked at once. Default 1024.
	MaxPolicies int
	// Shards splits each policy's pressured-subject summary so that
	// concurrent pressured records of different subjects rarely share a
	// lock. Default 8.
	Shards int
	// Clock starts the first interval. Default clock.Real{}.
	Clock clock.Clock
}

func (c Config) withDefaults() (Config, error) {
	if c.TopK == 0 {
		c.TopK = DefaultTopK
	}
	if c.MaxPolicies == 0 {
		c.MaxPolicies = DefaultMaxPolicies
	}
	if c.Shards == 0 {
		c.Shards = DefaultShards
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	switch {
	case c.TopK < 1 || c.TopK > MaxTopK:
		return c, fmt.Errorf("%w: TopK %d, want 1 to %d", ErrInvalidConfig, c.TopK, MaxTopK)
	case c.MaxPolicies < 1:
		return c, fmt.Errorf("%w: MaxPolicies %d, want at least 1", ErrInvalidConfig, c.MaxPolicies)
	case c.Shards < 1 || c.Shards > MaxShards:
		return c, fmt.Errorf("%w: Shards %d, want 1 to %d", ErrInvalidConfig, c.Shards, MaxShards)
	}
	return c, nil
}

// Recorder accumulates demand between snapshots. See the package doc for
// its bounds and concurrency.
type Recorder struct {
	cfg  Config
	seed maphash.Seed

	policies atomic.Pointer[map[string]*policyDemand]
	dropped  atomic.Uint64

	// mu guards copy-on-write changes of policies, fresh and retired.
	// fresh holds the policies added since policies was last rebuilt:
	// a record finds them under mu until the next rebuild, which comes
	// once fresh holds a quarter as many as policies (or freshMin) and at
	// every snapshot, so that learning P policies copies O(P) entries in
	// all rather than the whole table per policy. retired holds policies
	// evicted to make room, drained once more at the next snapshot so
	// that records racing their eviction are still reported.
	mu      sync.Mutex
	fresh   map[string]*policyDemand
	retired []*policyDemand
	// snapMu serializes snapshots and guards last.
	snapMu sync.Mutex
	last   time.Time
}

type policyDemand struct {
	name     string
	offered  atomic.Int64
	admitted atomic.Int64
	// idle counts consecutive snapshots without records; a policy idle for
	// evictAfterIdle snapshots may be evicted when the table is full.
	idle   atomic.Int32
	shards []shard
}

const evictAfterIdle = 2

// shard is one Space-Saving summary of pressured subjects.
type shard struct {
	mu      sync.Mutex
	entries []entry
	_       [40]byte // keep neighbouring shards' locks off one cache line
}

// entry is a Space-Saving counter. count is an upper bound of the subject's
// pressured offered cost: the cost recorded since it entered the summary
// plus err, the count of the entry it replaced.
type entry struct {
	hash     uint64
	subject  string
	count    int64
	err      int64
	admitted int64
	denied   bool
}

// New returns a Recorder whose first interval starts at cfg.Clock.Now().
func New(cfg Config) (*Recorder, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	r := &Recorder{cfg: cfg, seed: maphash.MakeSeed(), last: cfg.Clock.Now()}
	empty := map[string]*policyDemand{}
	r.policies.Store(&empty)
	return r, nil
}

// Record adds one decision: cost offered to policy for subject, whether it
// was admitted, and whether the subject was under pressure (denied, or its
// bucket fell below half its local capacity). Records with cost ≤ 0 (peeks)
// are ignored. It is safe for concurrent use and does not allocate once
// policy is known.
func (r *Recorder) Record(policy, subject string, cost int64, admitted, pressured bool) {
	if cost <= 0 {
		return
	}
	pd := (*r.policies.Load())[policy]
	if pd == nil {
		if pd = r.add(policy); pd == nil {
			r.dropped.Add(1)
			return
		}
	}
	addSaturating(&pd.offered, cost)
	if admitted {
		addSaturating(&pd.admitted, cost)
	}
	if !pressured || len(subject) == 0 || len(subject) > MaxSubjectLen {
		return
	}
	h := maphash.String(r.seed, subject)
	s := &pd.shards[h%uint64(len(pd.shards))]
	s.mu.Lock()
	s.add(h, subject, cost, admitted)
	s.mu.Unlock()
}

// Dropped returns how many records were dropped because the policy cap was
// reached or the policy name was empty or too long.
func (r *Recorder) Dropped() uint64 { return r.dropped.Load() }

func (r *Recorder) add(policy string) *policyDemand {
	if len(policy) == 0 || len(policy) > MaxPolicyNameLen {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	old := *r.policies.Load()
	if pd := old[policy]; pd != nil {
		return pd
	}
	if pd := r.fresh[policy]; pd != nil {
		return pd
	}
	evict := false
	if len(old)+len(r.fresh) >= r.cfg.MaxPolicies {
		for _, pd := range old {
			if pd.idle.Load() >= evictAfterIdle {
				evict = true
				break
			}
		}
		if !evict {
			return nil
		}
	}
	pd := &policyDemand{name: string(append([]byte(nil), policy...)), shards: make([]shard, r.cfg.Shards)}
	for i := range pd.shards {
		pd.shards[i].entries = make([]entry, 0, r.cfg.TopK)
	}
	if r.fresh == nil {
		r.fresh = make(map[string]*policyDemand)
	}
	r.fresh[pd.name] = pd
	if evict || len(r.fresh) >= max(freshMin, len(old)/4) {
		r.rebuild(evict)
	}
	return pd
}

// freshMin is the number of fresh policies that makes add rebuild the
// table however small it is.
const freshMin = 16

// rebuild publishes a new table of the policies and the fresh ones,
// without the idle ones (moved to retired) when evict is set; r.mu is
// held. Records that loaded the old table and missed find their policy
// in the new one under r.mu (add).
func (r *Recorder) rebuild(evict bool) {
	old := *r.policies.Load()
	next := make(map[string]*policyDemand, len(old)+len(r.fresh))
	for k, v := range old {
		if evict && v.idle.Load() >= evictAfterIdle {
			r.retired = append(r.retired, v)
			continue
		}
		next[k] = v
	}
	for k, v := range r.fresh {
		next[k] = v
	}
	clear(r.fresh)
	r.policies.Store(&next)
}

func (s *shard) add(h uint64, subject string, cost int64, admitted bool) {
	for i := range s.entries {
		e := &s.entries[i]
		if e.hash == h && e.subject == subject {
			e.count = saturatingSum(e.count, cost)
			if admitted {
				e.admitted = saturatingSum(e.admitted, cost)
			} else {
				e.denied = true
			}
			return
		}
	}
	n := entry{hash: h, subject: subject, count: cost, denied: !admitted}
	if admitted {
		n.admitted = cost
	}
	if len(s.entries) < cap(s.entries) {
		s.entries = append(s.entries, n)
		return
	}
	// Space-Saving: the new subject takes over the smallest counter and
	// inherits its count as error.
	m := 0
	for i := 1; i < len(s.entries); i++ {
		if s.entries[i].count < s.entries[m].count {
			m = i
		}
	}
	n.err = s.entries[m].count
	n.count = saturatingSum(n.count, n.err)
	s.entries[m] = n
}

// Snapshot returns each policy's demand since the previous snapshot (or
// since New) as rates per second, and starts a new interval at now.
// Policies without records in the interval are left out. When now is not
// after the previous snapshot (a clock stepping back), it returns an empty
// map, keeps what was recorded for the next snapshot and restarts the
// interval at now.
func (r *Recorder) Snapshot(now time.Time) map[string]etcdlayout.PolicyDemand {
	m, _ := r.snapshot(now)
	return m
}

// Report is Snapshot wrapped in the DemandReport region writes to etcd.
func (r *Recorder) Report(region string, now time.Time) etcdlayout.DemandReport {
	m, iv := r.snapshot(now)
	return etcdlayout.DemandReport{Region: region, At: now, IntervalSeconds: iv.Seconds(), Policies: m}
}

type drained struct {
	offered, admitted int64
	entries           []entry
}

func (r *Recorder) snapshot(now time.Time) (map[string]etcdlayout.PolicyDemand, time.Duration) {
	r.snapMu.Lock()
	defer r.snapMu.Unlock()
	iv := now.Sub(r.last)
	if iv <= 0 {
		r.last = now
		return map[string]etcdlayout.PolicyDemand{}, 0
	}
	r.last = now

	acc := map[string]*drained{}
	drain := func(pd *policyDemand) bool {
		// A record adds its offered cost before its admitted cost, so a
		// record racing this drain may have its offered cost taken here
		// and its admitted cost by the next snapshot. Each report then
		// may show admitted above offered by the costs of the few records
		// that straddle its boundary; summed over reports both are exact,
		// and no cost waits for later traffic to be reported.
		a := pd.admitted.Swap(0)
		o := pd.offered.Swap(0)
		d := acc[pd.name]
		if d == nil {
			d = &drained{}
			acc[pd.name] = d
		}
		d.offered = saturatingSum(d.offered, o)
		d.admitted = saturatingSum(d.admitted, a)
		busy := o != 0 || a != 0
		for i := range pd.shards {
			s := &pd.shards[i]
			s.mu.Lock()
			if len(s.entries) > 0 {
				busy = true
				d.entries = append(d.entries, s.entries...)
				clear(s.entries)
				s.entries = s.entries[:0]
			}
			s.mu.Unlock()
		}
		return busy
	}

	r.mu.Lock()
	if len(r.fresh) > 0 {
		r.rebuild(false)
	}
	retired := r.retired
	r.retired = nil
	r.mu.Unlock()
	for _, pd := range retired {
		drain(pd)
	}
	for _, pd := range *r.policies.Load() {
		if drain(pd) {
			pd.idle.Store(0)
		} else if pd.idle.Load() < evictAfterIdle {
			pd.idle.Add(1)
		}
	}

	secs := iv.Seconds()
	out := make(map[string]etcdlayout.PolicyDemand, len(acc))
	for name, d := range acc {
		if d.offered == 0 && d.admitted == 0 && len(d.entries) == 0 {
			continue
		}
		out[name] = etcdlayout.PolicyDemand{
			Offered:   float64(d.offered) / secs,
			Admitted:  float64(d.admitted) / secs,
			Pressured: r.top(d.entries, secs),
		}
	}
	return out, iv
}

// top merges counters of one policy (a subject appears at most once per
// shard, but may appear in a retired and a live policy) and returns the
// TopK largest, by count then subject.
func (r *Recorder) top(es []entry, secs float64) []etcdlayout.SubjectDemand {
	if len(es) == 0 {
		return nil
	}
	merged := make(map[string]*entry, len(es))
	list := make([]*entry, 0, len(es))
	for i := range es {
		e := &es[i]
		if m := merged[e.subject]; m != nil {
			m.count = saturatingSum(m.count, e.count)
			m.admitted = saturatingSum(m.admitted, e.admitted)
			m.denied = m.denied || e.denied
			continue
		}
		merged[e.subject] = e
		list = append(list, e)
	}
	sort.Slice(list, func(i, j int) bool {
		if list[i].count != list[j].count {
			return list[i].count > list[j].count
		}
		return list[i].subject < list[j].subject
	})
	if len(list) > r.cfg.TopK {
		list = list[:r.cfg.TopK]
	}
	out := make([]etcdlayout.SubjectDemand, len(list))
	for i, e := range list {
		out[i] = etcdlayout.SubjectDemand{
			Subject:  e.subject,
			Offered:  float64(e.count) / secs,
			Admitted: float64(e.admitted) / secs,
			Denied:   e.denied,
		}
	}
	return out
}

// saturatingSum is a + b for non-negative a and b, or math.MaxInt64 when
// the sum does not fit: a demand counter pinned at its maximum is still
// the largest demand, where a wrapped one would turn negative.
func saturatingSum(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// addSaturating adds d ≥ 0 to v, saturating at math.MaxInt64.
func addSaturating(v *atomic.Int64, d int64) {
	for {
		old := v.Load()
		if old == math.MaxInt64 || v.CompareAndSwap(old, saturatingSum(old, d)) {
			return
		}
	}
}
