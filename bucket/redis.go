package bucket

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisClient is the part of a go-redis client the Redis store uses.
// *redis.Client, *redis.ClusterClient and *redis.Ring implement it.
type RedisClient interface {
	redis.Scripter
	Pipeline() redis.Pipeliner
}

// Defaults of RedisConfig.
const (
	DefaultMaxBatch  = 128
	DefaultQueueSize = 4096
	DefaultFlushers  = 2
)

// ErrClosed reports a call on a closed Redis store.
var ErrClosed = errors.New("bucket: redis store closed")

// RedisConfig configures a Redis store.
type RedisConfig struct {
	// Client sends the script calls. Required.
	Client RedisClient
	// MaxBatch is the most script calls sent in one pipeline; 0 means
	// DefaultMaxBatch.
	MaxBatch int
	// QueueSize bounds the calls waiting for a pipeline; 0 means
	// DefaultQueueSize. A caller blocks while the queue is full, until its
	// context ends.
	QueueSize int
	// Flushers is how many goroutines send pipelines concurrently; 0 means
	// DefaultFlushers.
	Flushers int
	// Merge is the most single-bucket calls (Take, Refund) that a flusher
	// merges into one script call; 0 means DefaultMerge, 1 sends every
	// call as a script call of its own. Calls merge on a single server
	// whatever their groups, on a cluster only within one hash slot.
	Merge int
	// Groups is how many group hashes hold the token buckets of one policy
	// version (see DefaultGroups for the trade-off); 0 means DefaultGroups,
	// at most MaxGroups. Every node that shares a Redis must use the same
	// value: a different one puts a subject's buckets under other keys,
	// where they start full.
	Groups int
	// LossGuard detects a Redis that lost its state (a restart without
	// persistence, FLUSHALL, a failover to a replica that never had the
	// data) and starts absent buckets conservatively for one refill time
	// after the loss. The scripts keep a loss marker per group,
	// rl:m:{g.<group>} (no TTL, one small string per group ever used,
	// at most Groups), holding the Redis TIME it was created at; a script
	// that finds a bucket absent reads its group's marker and, when there
	// is none, creates it. A bucket absent less than its refill time
	// after its group's marker was created reads as lost at that instant:
	// a token bucket as emptied then (what refilled since, at most its
	// fill), a window algorithm as full in that window. A server that
	// starts empty cannot be told from one that lost its data, so a new
	// Redis, too, starts its buckets this way for one refill time. Every
	// node that shares a Redis should use the same setting.
	LossGuard bool
}

// Redis is the store that production regional nodes use: one Lua script
// call per decision, atomic in Redis, timed by Redis TIME only.
//
// A call that finds no other in the store is sent by its caller, on its
// own goroutine and in its own context: one round trip, no hand-off. On a
// single server (Client is a *redis.Client speaking RESP2 whose pool has
// more connections than Flushers) it goes out on one connection of the
// pool that the store holds between such calls, which spares the pool's
// take, health check (a recvfrom) and put on every call. A connection
// that met an error is given back and another borrowed; one idle for
// 100 ms, or held for the client's ConnMaxLifetime, goes back to the pool
// too, and is checked when borrowed again. A
// take that finds the held connection closed is sent once more through
// the pool (see direct).
// Concurrent callers are coalesced: while a call is in the store, Take,
// TakeAll and Refund put their script call on a bounded queue; Flushers
// goroutines (started by NewRedis, stopped by Close) each take every call
// waiting, up to MaxBatch, and send them in one pipeline. A woken flusher
// first yields once, so that callers already runnable add their calls.
// Within a pipeline, up to Merge single-bucket calls of the same
// operation (and, on a cluster, hash slot) go out as one script call that
// decides each bucket on its own, in queue order, as separate calls would:
// Redis then pays a script call's fixed cost once for all of them (see
// DefaultMerge).
// EVALSHA is used; a NOSCRIPT reply (after SCRIPT FLUSH, a restart or a
// failover) is answered by resending that call with EVAL in the same
// operation, so the caller never sees it.
//
// Errors from Redis are returned wrapped; the caller applies its failure
// mode. A denial is never an error. When a caller's context ends while its
// call is queued or in flight, it gets the context's error and the call may
// or may not have been charged. A call whose context has ended by the time
// a flusher takes it from the queue is never sent: a caller that gave up
// (its deadline passed, so its check ended and its region may have
// acknowledged a smaller share since) does not have its take written
// afterwards at the share it read. A call already handed to Redis when its
// deadline passes still runs.
//
// On a single server (Client is a *redis.Client) TakeAll sends all its
// buckets in one script call, all or nothing, whatever their groups; if
// the server answers CROSSSLOT (a proxy in front of a cluster), the store
// falls back for good to what it does on other clients: one script call
// per group. Every bucket of one subject carries its group's hash tag (one
// Redis Cluster slot), so the buckets of one subject, and of any subjects
// that share its group, are checked all or nothing in that call. When one
// TakeAll spans several groups and one of their calls denies, the calls
// that admitted are compensated by a refund call. That refund is not atomic with the charge: between the two, other
// callers may see fewer tokens (under-admission, never over-admission of a token
// bucket), and a window that rolls over in between is refunded in the new
// window.
//
// Redis is safe for concurrent use.
type Redis struct {
	client   RedisClient
	maxBatch int
	merge    int
	groups   uint32
	queue    chan *call
	stop     chan struct{}
	wg       sync.WaitGroup

	mu     sync.RWMutex
	closed bool

	// single is true when client is one server (*redis.Client): a TakeAll
	// then sends all its buckets in one script call, whatever their
	// groups. crossSlot turns that off for good when the server refuses
	// keys of several hash tags in one call (CROSSSLOT: a proxy in front
	// of a cluster).
	single    bool
	crossSlot atomic.Bool
	// calls counts the single calls (Take, Refund, one-call TakeAll) in
	// the store, sent or waiting: one that finds no other goes direct
	// while the store is lone.
	calls atomic.Int64
	// busy is true while calls come concurrently: the last pipeline a
	// flusher sent carried more than one call. A lone call then goes
	// through the queue all the same, where the calls that follow it
	// within the flusher's yield join its pipeline (see direct).
	busy atomic.Bool
	// lone is the connection that direct calls go out on, when the client
	// is a single server's (see loneConn).
	lone *loneConn
	args argCache
	// guard is the boxed guard argument of every call: "1" with
	// LossGuard, else "0" (see lua/take.lua).
	guard any

	// now, when set (tests only, through export_test.go), is passed to the
	// scripts as ARGV[2] in place of Redis TIME.
	now func() int64
}

// call is one script call: its command line, as go-redis sends it, and
// its answer. Calls are pooled: the caller that got the answer puts it
// back; a caller that gives up (its context ended) leaves it to the
// garbage collector, since the flusher may still write to it.
type call struct {
	// ctx is the caller's context, set when the call is queued: a call
	// whose context has ended by the time a flusher takes it is not sent
	// (see dropEnded).
	ctx    context.Context
	n      int    // buckets
	op     byte   // opTake or opRefund
	group  uint32 // the group of the first bucket
	script *redis.Script
	// argv is the command: "evalsha", the script's hash, len(keys), the
	// keys, then the arguments (see lua/take.lua).
	argv []any
	// sets are the call's distinct parameter sets, in the order argv
	// carries them, and set[i] is bucket i's (an index into sets).
	sets []params
	set  []int
	// at is the instant of the decisions (microseconds since the Unix
	// epoch) and res the replyPerBucket numbers of each bucket.
	at  int64
	res []int64
	err error
	// done receives one value per use, when res and err are set.
	done chan struct{}
}

var callPool = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

// Script arguments boxed once: boxing a string into an interface
// allocates on every call otherwise.
var (
	argOpTake, argOpRefund  any = string(rune(opTake)), string(rune(opRefund))
	argOpTakeEach           any = "i" // independent takes of a merged call (merge.go)
	argEvalSha, argEval     any = "evalsha", "eval"
	argEmpty                any = ""
	argGuardOn, argGuardOff any = "1", "0"
	argAlg                  [len(algCodes)]any
	argHash                 [len(algCodes)]any // set with the scripts (scripts.go)
	argHashAll              any
)

func init() {
	for i, a := range algCodes {
		argAlg[i] = a
	}
}

// maxArgCache bounds each of a store's caches of script arguments (see
// argCache): the params cache is emptied when full and starts again; the
// group key table has this many slots (a power of 2, 128 KiB of pointers).
const maxArgCache = 1 << 14

// argCache holds, boxed for the command line, script arguments that
// repeat: the decimal forms of params (policies repeat the same few
// numbers) and the group keys of token buckets (one per policy, version
// and group). Building them cost five allocations and about half a
// microsecond per bucket. Lookups take no lock.
type argCache struct {
	nums sync.Map // params -> [6]any: the numbers of its parameter set
	n    atomic.Int64
	// keys is a direct-mapped table of group keys: slot groupSlot(id)
	// holds the last key built for an id that maps there.
	keys [maxArgCache]atomic.Pointer[groupKeySlot]
}

// groupKeySlot is one cached group key.
type groupKeySlot struct {
	id groupKeyID
	v  any // string
}

// groupKeyID names a group key.
type groupKeyID struct {
	policy  string
	version uint32
	g       uint32
}

// appendSet appends p's parameter set (see lua/take.lua) to argv.
func (a *argCache) appendSet(argv []any, p *params) []any {
	v, ok := a.nums.Load(*p)
	if !ok {
		v = [6]any{
			strconv.FormatFloat(p.lim, 'f', -1, 64),
			strconv.FormatFloat(p.p, 'g', -1, 64),
			strconv.FormatFloat(p.cost, 'f', -1, 64),
			strconv.FormatInt(p.ttl, 10),
			strconv.FormatFloat(p.fill, 'f', -1, 64),
			strconv.FormatFloat(p.since, 'f', -1, 64),
		}
		if a.n.Add(1) > maxArgCache {
			a.nums.Clear()
			a.n.Store(0)
		}
		a.nums.Store(*p, v)
	}
	n := v.([6]any)
	return append(argv, argAlg[p.alg], n[0], n[1], n[2], n[3], n[4], n[5])
}

// groupKey is groupKey(k, g), boxed.
func (a *argCache) groupKey(k *Key, g uint32) any {
	slot := &a.keys[groupSlot(k.policy, k.version, g)]
	if s := slot.Load(); s != nil && s.id.g == g && s.id.version == k.version && s.id.policy == k.policy {
		return s.v
	}
	s := &groupKeySlot{id: groupKeyID{k.policy, k.version, g}, v: groupKey(k, g)}
	slot.Store(s)
	return s.v
}

// groupSlot places a group key in argCache.keys: FNV-1a of the policy and
// version, plus the group, so that one policy's groups take consecutive
// slots.
func groupSlot(policy string, version, g uint32) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(policy); i++ {
		h = (h ^ uint32(policy[i])) * 16777619
	}
	h = (h ^ version) * 16777619
	return (h + g) & (maxArgCache - 1)
}

// NewRedis validates cfg and starts the store's Flushers goroutines; Close
// stops them.
func NewRedis(cfg RedisConfig) (*Redis, error) {
	if cfg.Client == nil {
		return nil, errors.New("bucket: new redis store: Client is nil")
	}
	if cfg.MaxBatch < 0 || cfg.QueueSize < 0 || cfg.Flushers < 0 || cfg.Merge < 0 {
		return nil, fmt.Errorf("bucket: new redis store: negative MaxBatch %d, QueueSize %d, Flushers %d or Merge %d", cfg.MaxBatch, cfg.QueueSize, cfg.Flushers, cfg.Merge)
	}
	if cfg.Groups < 0 || cfg.Groups > MaxGroups {
		return nil, fmt.Errorf("bucket: new redis store: Groups %d, want 0 (default %d) to %d", cfg.Groups, DefaultGroups, MaxGroups)
	}
	if cfg.Groups == 0 {
		cfg.Groups = DefaultGroups
	}
	if cfg.MaxBatch == 0 {
		cfg.MaxBatch = DefaultMaxBatch
	}
	if cfg.QueueSize == 0 {
		cfg.QueueSize = DefaultQueueSize
	}
	if cfg.Flushers == 0 {
		cfg.Flushers = DefaultFlushers
	}
	if cfg.Merge == 0 {
		cfg.Merge = DefaultMerge
	}
	r := &Redis{
		client:   cfg.Client,
		maxBatch: cfg.MaxBatch,
		merge:    cfg.Merge,
		groups:   uint32(cfg.Groups),
		guard:    argGuardOff,
		queue:    make(chan *call, cfg.QueueSize),
		stop:     make(chan struct{}),
		lone:     newLoneConn(cfg.Client, cfg.Flushers),
	}
	if cfg.LossGuard {
		r.guard = argGuardOn
	}
	_, r.single = cfg.Client.(*redis.Client)
	r.wg.Add(cfg.Flushers)
	for range cfg.Flushers {
		go r.flusher()
	}
	return r, nil
}

// Close stops the flushers and gives the lone calls' connection back to
// the client's pool. Calls still queued fail with ErrClosed; later calls
// fail with ErrClosed. Close does not close the client.
func (r *Redis) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	r.mu.Unlock()
	close(r.stop)
	r.wg.Wait()
	r.lone.close()
	for {
		select {
		case c := <-r.queue:
			c.err = ErrClosed
			c.done <- struct{}{}
		default:
			return nil
		}
	}
}

// newScriptCmd is an EVALSHA (or EVAL) command line whose reply, a list
// of integers, is read without boxing each number.
func newScriptCmd(ctx context.Context, argv []any) *redis.IntSliceCmd {
	cmd := redis.NewIntSliceCmd(ctx, argv...)
	cmd.SetFirstKeyPos(3)
	return cmd
}

func scriptSource(s *redis.Script) string {
	if s == scriptAll {
		return sourceAll
	}
	for alg := range scriptByAlg {
		if scriptByAlg[alg] == s {
			return sources[alg]
		}
	}
	return "" // unreachable: every call uses one of the package's scripts
}

// do sends c and waits for its answer: on the caller's goroutine when no
// other call is in the store and calls have not been coming concurrently
// (see direct), else through the flushers' queue, where it may share a
// pipeline and a script call with others.
func (r *Redis) do(ctx context.Context, c *call) error {
	defer r.calls.Add(-1)
	if r.calls.Add(1) == 1 && !r.busy.Load() {
		return r.direct(ctx, c)
	}
	if err := r.enqueue(ctx, c); err != nil {
		return err
	}
	return wait(ctx, c)
}

// direct sends c, the only call in the store, on the caller's goroutine,
// in the caller's context: a lone check then pays one round trip and no
// hand-off to a flusher and back (two goroutine switches, and a yield in
// the flusher, that only pay off when other calls can join the
// pipeline). Calls that come while it is in flight go through the queue,
// so merging still gathers concurrent calls. Under concurrent load a lone
// call is only the first of a burst (the callers a pipeline's answers
// woke, coming back one by one): sent direct, it would take a round trip
// of its own, and Redis a script call of its own, that the burst's
// pipeline would have carried; so once a flusher's pipeline has carried
// several calls (busy), lone calls queue too, until a pipeline carries
// one call again. Like a queued call, a call
// whose context has ended is not sent; one whose context ends in flight
// gets the context's error and may have been charged.
func (r *Redis) direct(ctx context.Context, c *call) error {
	r.mu.RLock()
	closed := r.closed
	r.mu.RUnlock()
	switch {
	case closed:
		return ErrClosed
	case ctx.Err() != nil:
		return ctx.Err()
	}
	c.ctx = ctx
	f := directFlush.Get().(*flush)
	if conn, held := r.lone.take(); held {
		r.sendAlone(ctx, f, c, conn)
		r.lone.give(c.err)
		if c.err != nil && c.op == opTake && peerClosed(c.err) && ctx.Err() == nil {
			// The server had closed the held connection (a restart, a
			// failover, CLIENT KILL) or it was closed here (a Sentinel
			// switch): the pool checks a connection before it sends, and
			// would have dialed anew. Send the take once more on one of
			// the pool's. Should the server have run the first before
			// closing without an answer, the bucket is charged twice:
			// an under-admission, never an over-admission. A refund is
			// not sent again, as a second one could give back tokens
			// never taken.
			r.sendAlone(ctx, f, c, r.client)
		}
	} else {
		r.sendAlone(ctx, f, c, r.client)
	}
	directFlush.Put(f)
	if c.err != nil {
		// The connection's deadline is the context's, and may pass just
		// before the context's own timer ends it.
		if err := ctx.Err(); err != nil {
			return err
		}
		if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
			return context.DeadlineExceeded
		}
	}
	return c.err
}

// sendAlone sends c in a pipeline of its own on via, with f as scratch,
// and waits for its answer.
func (r *Redis) sendAlone(ctx context.Context, f *flush, c *call, via pipeliner) {
	f.batch = append(f.batch[:0], c)
	r.plan(f)
	r.send(ctx, f, via)
	f.reset()
	<-c.done // send answered it on this goroutine
}

// peerClosed reports whether err says that the connection a call went out
// on was closed, by the server (end of stream, reset, broken pipe) or here.
func peerClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed)
}

// enqueue puts c on the queue of the flushers.
func (r *Redis) enqueue(ctx context.Context, c *call) error {
	r.mu.RLock()
	if r.closed {
		r.mu.RUnlock()
		return ErrClosed
	}
	c.ctx = ctx
	select {
	case r.queue <- c:
		r.mu.RUnlock()
		return nil
	case <-ctx.Done():
		r.mu.RUnlock()
		return ctx.Err()
	}
}

// storeFull wraps a Redis OOM reply (used memory above maxmemory with the
// noeviction policy) in ErrMemoryFull; other errors are returned as they
// are.
func storeFull(err error) error {
	var re redis.Error
	if errors.As(err, &re) && strings.HasPrefix(re.Error(), "OOM ") {
		return fmt.Errorf("%w: redis: %w", ErrMemoryFull, err)
	}
	return err
}

// wait waits for the answer of a queued c.
func wait(ctx context.Context, c *call) error {
	select {
	case <-c.done:
		return c.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// The script's arguments (see lua/take.lua): argsHead before the
// parameter sets (operation, test time, guard, number of sets),
// argsPerSet per parameter set, then per bucket its set's number and,
// for an algorithm whose buckets live in a group hash, its field: at most
// argsPerBucket. The reply's numbers: replyHead (the instant), then
// replyPerBucket per bucket.
const (
	argsHead       = 4
	argsPerSet     = 7
	argsPerBucket  = 2
	replyHead      = 1
	replyPerBucket = 4
)

// newCall builds the script call for reqs, from the pool. All of reqs
// must share one hash slot (one group, or any groups on a single server).
// Buckets with equal params share one parameter set.
func (r *Redis) newCall(op byte, reqs []Request, ps []params) *call {
	c := callPool.Get().(*call)
	c.n, c.op, c.res, c.err = len(reqs), op, nil, nil
	c.sets, c.set = c.sets[:0], c.set[:0]
	alg := ps[0].alg
	for i := range ps {
		if ps[i].alg != alg {
			alg = -1
		}
		var j int
		c.sets, j, _ = addSet(c.sets, &ps[i])
		c.set = append(c.set, j)
	}
	size := 3 + len(reqs) + argsHead + argsPerSet*len(c.sets) + argsPerBucket*len(reqs)
	argv := c.argv[:0]
	if cap(argv) < size {
		argv = make([]any, 0, size)
	}
	if alg >= 0 {
		c.script = scriptByAlg[alg]
		argv = append(argv, argEvalSha, argHash[alg], len(reqs))
	} else {
		c.script = scriptAll
		argv = append(argv, argEvalSha, argHashAll, len(reqs))
	}
	for i := range reqs {
		k := &reqs[i].Key
		g := groupOf(k.subject, r.groups)
		if i == 0 {
			c.group = g
		}
		if grouped(ps[i].alg) {
			argv = append(argv, r.args.groupKey(k, g))
		} else {
			argv = append(argv, ownKey(k, g))
		}
	}
	if op == opRefund {
		argv = append(argv, argOpRefund)
	} else {
		argv = append(argv, argOpTake)
	}
	if r.now != nil {
		argv = append(argv, strconv.FormatInt(r.now(), 10))
	} else {
		argv = append(argv, argEmpty)
	}
	argv = append(argv, r.guard, len(c.sets))
	for j := range c.sets {
		argv = r.args.appendSet(argv, &c.sets[j])
	}
	for i := range reqs {
		argv = append(argv, c.set[i]+1)
		if grouped(ps[i].alg) {
			argv = append(argv, fieldOf(&reqs[i].Key))
		}
	}
	c.argv = argv
	return c
}

// addSet returns the index of p in sets, appending it when it is new
// (added reports that): buckets, and merged calls, with equal params
// share one parameter set. A call holds at most MaxTakeAll buckets and a
// wire at most a flush's calls, so a scan is the cheap lookup.
func addSet(sets []params, p *params) (_ []params, j int, added bool) {
	for j := range sets {
		if sets[j] == *p {
			return sets, j, false
		}
	}
	return append(sets, *p), len(sets), true
}

// release returns c to the pool once its caller has read the answer.
func (c *call) release() {
	clear(c.argv)
	c.argv, c.res, c.err, c.script, c.ctx = c.argv[:0], nil, nil, nil, nil
	c.sets, c.set = c.sets[:0], c.set[:0]
	callPool.Put(c)
}

// decision is bucket i's decision; its capacity is its parameter set's.
func (c *call) decision(i int) Decision {
	v := c.res[replyPerBucket*i : replyPerBucket*(i+1)]
	return decision(v[0] == 1, c.sets[c.set[i]].lim, float64(v[1]), float64(v[2]), float64(v[3]), c.at)
}

// Take charges req.Cost when the bucket holds it (Cost 0 peeks).
func (r *Redis) Take(ctx context.Context, req Request) (Decision, error) {
	return r.one(ctx, opTake, req)
}

// Refund gives back req.Cost, never above the bucket's capacity.
func (r *Redis) Refund(ctx context.Context, req Request) (Decision, error) {
	return r.one(ctx, opRefund, req)
}

func (r *Redis) one(ctx context.Context, op byte, req Request) (Decision, error) {
	if req.sharded() {
		return r.subBuckets(ctx).take(&req, op)
	}
	if err := req.Validate(); err != nil {
		return Decision{}, err
	}
	ps := [1]params{paramsOf(&req)}
	c := r.newCall(op, []Request{req}, ps[:])
	if err := r.do(ctx, c); err != nil {
		if ctx.Err() == nil {
			c.release()
		}
		return Decision{}, fmt.Errorf("bucket: redis %s %s: %w", opName(op), req.Key, err)
	}
	d := c.decision(0)
	c.release()
	return d, nil
}

// subBuckets is the sharded path's access to r under ctx (Limits.Shards).
func (r *Redis) subBuckets(ctx context.Context) *shardOps {
	return &shardOps{
		one:    func(req *Request, op byte) (Decision, error) { return r.one(ctx, op, *req) },
		all:    func(reqs []Request) ([]Decision, error) { return r.TakeAll(ctx, reqs) },
		groups: r.groups,
	}
}

func opName(op byte) string {
	if op == opRefund {
		return "refund"
	}
	return "take"
}

// takeOneCall decides reqs in one script call when they share one hash
// slot: one group, or any groups on a single server. ok is false when they
// must go one call per group instead.
func (r *Redis) takeOneCall(ctx context.Context, reqs []Request, ps []params) (out []Decision, err error, ok bool) {
	if !r.single || r.crossSlot.Load() {
		g := groupOf(reqs[0].Key.subject, r.groups)
		for i := 1; i < len(reqs); i++ {
			if groupOf(reqs[i].Key.subject, r.groups) != g {
				return nil, nil, false
			}
		}
	}
	c := r.newCall(opTake, reqs, ps)
	if err := r.do(ctx, c); err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("bucket: redis take-all %s: %w", reqs[0].Key, err), true
		}
		c.release()
		if redis.HasErrorPrefix(err, "CROSSSLOT") {
			// Nothing ran: the server refused the keys. Send one call
			// per group from now on.
			r.crossSlot.Store(true)
			return nil, nil, false
		}
		return nil, fmt.Errorf("bucket: redis take-all %s: %w", reqs[0].Key, err), true
	}
	out = make([]Decision, len(reqs))
	for i := range out {
		out[i] = c.decision(i)
	}
	c.release()
	return out, nil, true
}

// TakeAll checks several buckets all or nothing: one script call per
// group, and a compensating refund across groups (see Redis).
func (r *Redis) TakeAll(ctx context.Context, reqs []Request) ([]Decision, error) {
	if len(reqs) == 0 || len(reqs) > MaxTakeAll {
		return nil, fmt.Errorf("%w: got %d", ErrTakeAllSize, len(reqs))
	}
	for i := range reqs {
		if reqs[i].sharded() {
			return r.subBuckets(ctx).takeAll(reqs)
		}
	}
	// The parameters stay on the stack: len(reqs) is at most MaxTakeAll.
	var psBuf [MaxTakeAll]params
	ps := psBuf[:len(reqs)]
	for i := range reqs {
		if err := reqs[i].Validate(); err != nil {
			return nil, fmt.Errorf("request %d: %w", i, err)
		}
		for j := 0; j < i; j++ {
			if reqs[j].Key == reqs[i].Key {
				return nil, fmt.Errorf("%w: %s", ErrDuplicateKey, reqs[i].Key)
			}
		}
		ps[i] = paramsOf(&reqs[i])
	}
	if out, err, ok := r.takeOneCall(ctx, reqs, ps); ok {
		return out, err
	}
	// Batch by group (hash tag), keeping order: idx[b] lists the requests
	// of batch b, whose subjects all lie in group tags[b].
	var idx [][]int
	var tags []uint32
	for i := range reqs {
		tag := groupOf(reqs[i].Key.subject, r.groups)
		b := -1
		for j, t := range tags {
			if t == tag {
				b = j
				break
			}
		}
		if b < 0 {
			idx = append(idx, nil)
			tags = append(tags, tag)
			b = len(idx) - 1
		}
		idx[b] = append(idx[b], i)
	}
	calls := make([]*call, len(idx))
	errs := make([]error, len(idx))
	active := make([]bool, len(idx))
	// run queues the call of every active group, then waits for each: the
	// flushers send them concurrently (in one pipeline when they are
	// waiting together), with no goroutine per group here.
	run := func(op byte) {
		for g, grp := range idx {
			if !active[g] {
				continue
			}
			gr, gp := reqs, ps
			if len(idx) > 1 {
				gr = make([]Request, len(grp))
				gp = make([]params, len(grp))
				for k, i := range grp {
					gr[k], gp[k] = reqs[i], ps[i]
				}
			}
			calls[g] = r.newCall(op, gr, gp)
			errs[g] = r.enqueue(ctx, calls[g])
		}
		for g := range idx {
			if active[g] && errs[g] == nil {
				errs[g] = wait(ctx, calls[g])
			}
		}
	}
	for g := range active {
		active[g] = true
	}
	run(opTake)
	out := make([]Decision, len(reqs))
	allOK := true
	var firstErr error
	for g, grp := range idx {
		if errs[g] != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("bucket: redis take-all %s: %w", reqs[grp[0]].Key, errs[g])
			}
			active[g] = false
			allOK = false
			continue
		}
		for k, i := range grp {
			out[i] = calls[g].decision(k)
			if !out[i].Allowed {
				allOK = false
			}
		}
	}
	if allOK {
		return out, nil
	}
	// Compensate the groups that were charged.
	for g, grp := range idx {
		if active[g] && !out[grp[0]].Allowed {
			active[g] = false
		}
	}
	run(opRefund)
	for g, grp := range idx {
		if !active[g] {
			continue
		}
		if errs[g] != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("bucket: redis take-all compensating refund %s: %w", reqs[grp[0]].Key, errs[g])
			}
			continue
		}
		for k, i := range grp {
			d := calls[g].decision(k)
			d.Allowed = false
			out[i] = d
		}
	}
	for i := range out {
		out[i].Allowed = false
	}
	if firstErr != nil {
		return nil, firstErr
	}
	return out, nil
}
