package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"time"
)

// Arrival is a batch of Count unit requests (cost 1 each) that subject
// Subject sends to region Region at instant At (time since the run's
// start, a multiple of the scenario's tick). The simulator decides them
// one after the other at At: a bucket admits min(Count, its whole tokens).
type Arrival struct {
	At      time.Duration
	Region  int
	Subject int
	Count   int64
}

// SubjectID is the subject name the simulator gives subject j (its bucket
// key's subject), for a live driver that replays a stream.
func SubjectID(j int) string { return fmt.Sprintf("s%07d", j) }

// batch is one subject's fresh arrivals in one region and tick.
type batch struct {
	subject int32
	n       int64
}

// stream generates a scenario's fresh arrivals tick by tick. It owns its
// random source (seeded by the run's seed alone) and follows the
// scenario's region failures itself, so the stream depends on the
// scenario, the seed, the region and subject counts and the duration only:
// never on the rebalance interval, the protocol or any decision. Retries
// of clients that ignore Retry-After are not part of it (they depend on
// decisions; the engine adds them).
type stream struct {
	sc     *Scenario
	rng    *rand.Rand
	groups []group
	n      int
	tick   time.Duration
	up     []bool
	events []Event // region failures, by time (stable)
	nextEv int
	w      []float64
	cnt    []int64    // per subject: arrivals this tick in the region being drawn
	out    [][]batch  // per region: this tick's batches, in order of first arrival
	replay *recording // when set, next reads the arrivals from it
	tape   *recording // when set, next appends the arrivals it draws to it
}

// Bounds of a recording: ticks × regions and batches. A stream beyond them
// is not recorded (its runs draw it again).
const (
	maxRecordedSlots   = 1 << 22
	maxRecordedBatches = 1 << 24 // 128 MiB
)

// recording is a stream's arrivals, drawn once by a baseline pass for the
// runs of the same stream (Sweep) to replay instead of drawing them again.
// Read-only once complete, so runs on several goroutines share it.
type recording struct {
	off []int32       // per tick·regions + region: first batch; one more at the end
	arr []packedBatch // every batch, in stream order
	ok  bool          // complete and within the bounds
}

// packedBatch is a batch in 8 bytes; a count above 2^32−1 stops recording.
type packedBatch struct {
	subject int32
	n       uint32
}

// newRecording returns an empty recording for sc's stream, or nil when
// sc's ticks × regions exceed maxRecordedSlots.
func newRecording(sc *Scenario) *recording {
	slots := int64(time.Duration(sc.Duration)/time.Duration(sc.Tick)) * int64(sc.Regions)
	if slots >= maxRecordedSlots {
		return nil
	}
	// Room for the mean number of arrivals (batches are at most that),
	// plus a little, so that append rarely copies.
	mean := 0.0
	for _, g := range compileGroups(sc, sc.Subjects) {
		mean += g.total
	}
	mean *= time.Duration(sc.Duration).Seconds() * 1.02
	return &recording{off: make([]int32, 1, slots+1), arr: make([]packedBatch, 0, int(min(mean, maxRecordedBatches))), ok: true}
}

// add appends tick t's batches (the ticks in order from 0).
func (rec *recording) add(out [][]batch) {
	if !rec.ok {
		return
	}
	for _, o := range out {
		for _, b := range o {
			if b.n > math.MaxUint32 || len(rec.arr) >= maxRecordedBatches {
				rec.ok, rec.off, rec.arr = false, nil, nil
				return
			}
			rec.arr = append(rec.arr, packedBatch{subject: b.subject, n: uint32(b.n)})
		}
		rec.off = append(rec.off, int32(len(rec.arr)))
	}
}

func newStream(sc *Scenario, seed uint64) *stream {
	n := sc.Regions
	s := &stream{sc: sc, n: n, tick: time.Duration(sc.Tick),
		rng:    rand.New(rand.NewPCG(seed, 0xa771fa15)),
		groups: compileGroups(sc, sc.Subjects),
		up:     make([]bool, n), w: make([]float64, n),
		cnt: make([]int64, sc.Subjects), out: make([][]batch, n)}
	for i := range s.up {
		s.up[i] = true
	}
	for _, ev := range sc.Events {
		if ev.Kind == EventRegionDown || ev.Kind == EventRegionUp {
			s.events = append(s.events, ev)
		}
	}
	sort.SliceStable(s.events, func(a, b int) bool { return s.events[a].At < s.events[b].At })
	return s
}

// next draws tick t's arrivals into s.out (valid until the next call).
func (s *stream) next(t int64) {
	if rec := s.replay; rec != nil {
		slot := int(t) * s.n
		for r := range s.out {
			out := s.out[r][:0]
			for _, p := range rec.arr[rec.off[slot+r]:rec.off[slot+r+1]] {
				out = append(out, batch{subject: p.subject, n: int64(p.n)})
			}
			s.out[r] = out
		}
		return
	}
	now := time.Duration(t) * s.tick
	for s.nextEv < len(s.events) && time.Duration(s.events[s.nextEv].At) <= now {
		ev := s.events[s.nextEv]
		s.up[ev.Region] = ev.Kind == EventRegionUp
		s.nextEv++
	}
	tickS := s.tick.Seconds()
	for r := 0; r < s.n; r++ {
		out := s.out[r][:0]
		if !s.up[r] {
			s.out[r] = out
			continue
		}
		for gi := range s.groups {
			g := &s.groups[gi]
			g.weights(now, s.up, s.w)
			for k := poisson(s.rng, g.total*s.w[r]*tickS); k > 0; k-- {
				j := g.First
				if g.alias != nil {
					j += g.alias.sample(s.rng)
				} else {
					j += s.rng.IntN(g.n)
				}
				if s.cnt[j] == 0 {
					out = append(out, batch{subject: int32(j)})
				}
				s.cnt[j]++
			}
		}
		for i := range out {
			j := out[i].subject
			out[i].n = s.cnt[j]
			s.cnt[j] = 0
		}
		s.out[r] = out
	}
	if s.tape != nil {
		s.tape.add(s.out)
	}
}

// Arrivals generates the request stream the simulator decides for cfg, in
// the order it decides it: tick by tick, region by region, subjects in the
// order of their first arrival in the tick. It reads cfg.Scenario, Seed and
// the Regions, Subjects and Duration overrides; the other fields do not
// change the stream. yield returning false stops the stream.
//
// Not in the stream: the retries of a group with Retries > 0 (clients that
// ignore Retry-After resend each denied request at the next tick, up to
// Retries times). They depend on decisions; a live driver replaying a
// retry scenario sends them itself. Every other built-in scenario's stream
// is exactly what the simulator and its baselines decide.
func Arrivals(cfg Config, yield func(Arrival) bool) error {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return err
	}
	sc := cfg.Scenario
	s := newStream(sc, cfg.Seed)
	ticks := int64(time.Duration(sc.Duration) / s.tick)
	for t := int64(0); t < ticks; t++ {
		s.next(t)
		at := time.Duration(t) * s.tick
		for r, out := range s.out {
			for _, b := range out {
				if !yield(Arrival{At: at, Region: r, Subject: int(b.subject), Count: b.n}) {
					return nil
				}
			}
		}
	}
	return nil
}
