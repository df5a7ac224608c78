package bucket

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"sync"

	"github.com/redis/go-redis/v9"
)

// DefaultMerge is how many single-bucket calls a Redis store merges into
// one script call when RedisConfig.Merge is 0.
//
// A script call has a fixed cost in Redis (the EVALSHA lookup, entering
// Lua, TIME, the reply) that a merged call pays once, while each bucket in
// it costs Redis time of its own: the cap keeps one merged call from
// holding single-threaded Redis for long (docs/performance.md has the
// per-call and per-bucket figures).
const DefaultMerge = 32

// A wire is one script call in a pipeline: a queued call as it is, or the
// single-bucket calls of several callers merged into one call of
// independent takes (or refunds) in queue order (op 'i' or 'r' in
// lua/take.lua). Its reply holds the instant of the decisions, then
// replyPerBucket numbers per bucket, in the order of calls.
type wire struct {
	// first is the batch index of the wire's first call and n its number
	// of calls, while plan lays the batch out.
	first, n int
	argv     []any
	script   *redis.Script
	calls    []*call
	cmd      *redis.IntSliceCmd
}

// flush is a flusher's reusable state: the calls taken from the queue and
// the wires they go out on.
type flush struct {
	batch []*call
	wires []wire
	// of[i] is the wire of batch[i]; members lists the calls wire by wire
	// (wire.calls are windows of it).
	of      []int
	members []*call
	// open maps a merge class (operation and cluster slot) to the wire
	// still taking calls of that class.
	open map[uint32]int
	// argvs are the command lines of merged wires, reused; sets and set
	// are lay's scratch: a wire's distinct parameter sets and each call's
	// set number.
	argvs [][]any
	sets  []params
	set   []int
	retry []int
}

// newFlush returns a flush for batches of at most size calls.
func newFlush(size int) *flush {
	return &flush{
		batch:   make([]*call, 0, size),
		of:      make([]int, size),
		members: make([]*call, size),
		open:    make(map[uint32]int),
	}
}

// reset drops f's references to the calls it sent, keeping its buffers.
func (f *flush) reset() {
	clear(f.batch)
	f.batch = f.batch[:0]
	clear(f.members)
	for w := range f.wires {
		f.wires[w] = wire{}
	}
	for w := range f.argvs {
		clear(f.argvs[w])
	}
}

// directFlush holds the flushes of calls sent on their caller's goroutine
// (see Redis.direct), one call each.
var directFlush = sync.Pool{New: func() any { return newFlush(1) }}

func (r *Redis) flusher() {
	defer r.wg.Done()
	f := newFlush(r.maxBatch)
	for {
		select {
		case <-r.stop:
			return
		case c := <-r.queue:
			f.batch = append(f.batch[:0], c)
			// The caller that woke this flusher readied it to run next,
			// before the other callers already runnable had queued their
			// calls: let them run first, so that the pipeline carries
			// their calls too rather than this one alone.
			runtime.Gosched()
		fill:
			for len(f.batch) < r.maxBatch {
				select {
				case c := <-r.queue:
					f.batch = append(f.batch, c)
				default:
					break fill
				}
			}
			f.batch = dropEnded(f.batch)
			if len(f.batch) == 0 {
				continue
			}
			r.busy.Store(len(f.batch) > 1)
			r.plan(f)
			r.send(context.Background(), f, r.client)
			f.reset()
		}
	}
}

// dropEnded answers, without sending them, the calls of batch whose
// caller's context has ended (its deadline passed while the call waited
// in the queue) with the context's error, and returns the others in
// order. The caller has stopped waiting and was told the call may not
// have run; sent now, a take would charge its bucket after the caller's
// check ended, at a share the region may since have given up and
// acknowledged.
func dropEnded(batch []*call) []*call {
	kept := batch[:0]
	for _, c := range batch {
		if err := c.ctx.Err(); err != nil {
			c.res, c.err = nil, err
			c.done <- struct{}{}
			continue
		}
		kept = append(kept, c)
	}
	clear(batch[len(kept):])
	return kept
}

// mergeClass returns the class of calls that c may share a wire with, and
// false when c goes out alone: only single-bucket takes and refunds merge,
// with calls of the same operation and, unless the client is one server
// that takes keys of any slot, the same cluster slot. (plan also keeps
// calls of different test times, ARGV[2], apart.)
func (r *Redis) mergeClass(c *call, anySlot bool) (uint32, bool) {
	if r.merge < 2 || c.n != 1 || (c.op != opTake && c.op != opRefund) {
		return 0, false
	}
	class := uint32(c.op) << 16
	if !anySlot {
		class |= uint32(groupClusterSlot(c.group))
	}
	return class, true
}

// plan lays f.batch out on f.wires: a call that cannot merge gets a wire
// of its own; mergeable calls join the open wire of their class until it
// holds r.merge of them. A wire sits where its first call was queued.
func (r *Redis) plan(f *flush) {
	f.wires = f.wires[:0]
	clear(f.open)
	anySlot := r.single && !r.crossSlot.Load()
	for i, c := range f.batch {
		if class, ok := r.mergeClass(c, anySlot); ok {
			if w, open := f.open[class]; open {
				first := f.batch[f.wires[w].first]
				if f.wires[w].n < r.merge && first.argv[5] == c.argv[5] {
					f.of[i] = w
					f.wires[w].n++
					continue
				}
			}
			f.open[class] = len(f.wires)
		}
		f.of[i] = len(f.wires)
		f.wires = append(f.wires, wire{first: i, n: 1})
	}
	// Give each wire its window of f.members, then fill the windows in
	// queue order.
	off := 0
	for w := range f.wires {
		f.wires[w].calls = f.members[off : off : off+f.wires[w].n]
		off += f.wires[w].n
	}
	for i, c := range f.batch {
		w := &f.wires[f.of[i]]
		w.calls = append(w.calls, c)
	}
	for w := range f.wires {
		r.lay(f, w)
	}
}

// lay sets the command line of wire w: a lone call's own, or for merged
// calls one line with every call's key, parameter set and field, in
// order: "evalsha", the script's hash, the key count, the keys, the
// operation, the test time, the guard, the number of parameter sets, the
// distinct parameter sets of the calls (calls with equal params share
// one), then each bucket's set number and, in a group hash, its field
// (lua/take.lua).
func (r *Redis) lay(f *flush, w int) {
	wr := &f.wires[w]
	if len(wr.calls) == 1 {
		c := wr.calls[0]
		wr.argv, wr.script = c.argv, c.script
		return
	}
	for len(f.argvs) <= w {
		f.argvs = append(f.argvs, nil)
	}
	k := len(wr.calls)
	argv := f.argvs[w][:0]
	first := wr.calls[0]
	wr.script = first.script
	hash := first.argv[1]
	for _, c := range wr.calls[1:] {
		if c.script != wr.script {
			wr.script, hash = scriptAll, argHashAll
			break
		}
	}
	argv = append(argv, argEvalSha, hash, k)
	for _, c := range wr.calls {
		argv = append(argv, c.argv[3])
	}
	op := first.argv[4]
	if first.op == opTake {
		op = argOpTakeEach
	}
	// A merged call has one bucket: its set is argv[8:15], followed by
	// its set number and, in a group hash, its field.
	const set = 3 + 1 + argsHead
	argv = append(argv, op, first.argv[5], first.argv[6], nil)
	m := len(argv) - 1
	f.sets, f.set = f.sets[:0], f.set[:0]
	for _, c := range wr.calls {
		var j int
		var added bool
		if f.sets, j, added = addSet(f.sets, &c.sets[0]); added {
			argv = append(argv, c.argv[set:set+argsPerSet]...)
		}
		f.set = append(f.set, j+1)
	}
	argv[m] = len(f.sets)
	for i, c := range wr.calls {
		argv = append(argv, f.set[i])
		argv = append(argv, c.argv[set+argsPerSet+1:]...)
	}
	f.argvs[w] = argv
	wr.argv = argv
}

// send runs f's wires in one pipeline of via (the client, or the lone
// connection), resends the ones Redis refused (NOSCRIPT: with EVAL;
// CROSSSLOT on a merged wire: its calls one by one, and no more merging
// across slots), and answers every call. ctx bounds the round trips: a
// flusher's never ends (the client's timeouts bound them), a direct
// caller's is its own.
func (r *Redis) send(ctx context.Context, f *flush, via pipeliner) {
	pipe := via.Pipeline()
	f.retry = f.retry[:0]
	for w := range f.wires {
		f.wires[w].cmd = newScriptCmd(ctx, f.wires[w].argv)
		_ = pipe.Process(ctx, f.wires[w].cmd)
		f.retry = append(f.retry, w)
	}
	_, _ = pipe.Exec(ctx) // errors are read per command below
	// A refusal costs one pass: a split merged wire's calls may still
	// meet NOSCRIPT in the next.
	for pass := 0; pass < 2; pass++ {
		pipe = via.Pipeline()
		n := len(f.retry)
		for _, w := range f.retry[:n] {
			wr := &f.wires[w]
			err := wr.cmd.Err()
			switch {
			case err == nil:
			case redis.HasErrorPrefix(err, "NOSCRIPT") && wr.argv[0] != argEval:
				wr.argv[0], wr.argv[1] = argEval, scriptSource(wr.script)
				wr.cmd = newScriptCmd(ctx, wr.argv)
				_ = pipe.Process(ctx, wr.cmd)
				f.retry = append(f.retry, w)
			case redis.HasErrorPrefix(err, "CROSSSLOT") && len(wr.calls) > 1:
				// Nothing ran: the server refused keys of several slots.
				r.crossSlot.Store(true)
				calls := wr.calls
				wr.calls = nil
				for j, c := range calls {
					f.wires = append(f.wires, wire{argv: c.argv, script: c.script, calls: calls[j : j+1]})
					nw := &f.wires[len(f.wires)-1]
					nw.cmd = newScriptCmd(ctx, nw.argv)
					_ = pipe.Process(ctx, nw.cmd)
					f.retry = append(f.retry, len(f.wires)-1)
				}
			}
		}
		f.retry = append(f.retry[:0], f.retry[n:]...)
		if len(f.retry) == 0 {
			break
		}
		_, _ = pipe.Exec(ctx)
	}
	for w := range f.wires {
		wr := &f.wires[w]
		if len(wr.calls) == 0 {
			continue // split
		}
		res, err := wr.cmd.Result()
		err = storeFull(err)
		want := replyHead
		for _, c := range wr.calls {
			want += replyPerBucket * c.n
		}
		if err == nil && len(res) != want {
			err = fmt.Errorf("bucket: script replied %d numbers, want %d", len(res), want)
		}
		off := replyHead
		for _, c := range wr.calls {
			if err != nil {
				c.res, c.err = nil, err
			} else {
				end := off + replyPerBucket*c.n
				c.at, c.res, c.err = res[0], res[off:end:end], nil
				off = end
			}
			c.done <- struct{}{}
		}
	}
}

// groupClusterSlot is the Redis Cluster slot of group g's hash tag
// "g.<g>": CRC16 (XMODEM) of the tag modulo 16384, as Redis computes it.
func groupClusterSlot(g uint32) uint16 {
	var b [16]byte
	tag := strconv.AppendUint(append(b[:0], "g."...), uint64(g), 10)
	var crc uint16
	for _, x := range tag {
		crc ^= uint16(x) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc & 16383
}
