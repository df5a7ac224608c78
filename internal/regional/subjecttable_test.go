package regional

import (
	"math/rand"
	"testing"
)

// TestSubjectTableMatchesMap runs random puts, deletes and lookups on a
// subjectTable and on a map side by side: hashes from a small pool (so
// that deletes and re-puts meet), half of them sharing their high bits
// (so that they share a home slot and probe past each other), through
// growth and the moves back of deletion.
func TestSubjectTableMatchesMap(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	// inverse * fibonacci = 1 (mod 2^64), by Newton's iteration.
	inverse := uint64(fibonacci)
	for range 6 {
		inverse *= 2 - fibonacci*inverse
	}
	pool := make([]uint64, 600)
	for i := range pool {
		pool[i] = rng.Uint64()
		if i%2 == 1 {
			// The same home as the one before at every table size up
			// to 2^32 slots: the same high 32 bits of hash × fibonacci.
			home := (pool[i-1] * fibonacci) &^ (1<<32 - 1)
			pool[i] = (home | uint64(rng.Uint32())) * inverse
		}
	}
	var tab subjectTable
	ref := make(map[uint64]int32)
	for op := range 50000 {
		h := pool[rng.Intn(len(pool))]
		switch rng.Intn(3) {
		case 0:
			if _, ok := ref[h]; !ok {
				ref[h] = int32(op)
				tab.put(h, int32(op), int64(op))
			}
		case 1:
			delete(ref, h)
			tab.delete(h)
		}
		s := tab.find(h)
		i, ok := ref[h]
		switch {
		case ok != (s != nil):
			t.Fatalf("op %d: hash %x in map %v, in table %v", op, h, ok, s != nil)
		case ok && (s.i1-1 != i || s.expires != int64(i)):
			t.Fatalf("op %d: hash %x: table has entry %d expiring %d, want %d", op, h, s.i1-1, s.expires, i)
		}
		if tab.len() != len(ref) {
			t.Fatalf("op %d: table holds %d, map %d", op, tab.len(), len(ref))
		}
	}
	for i, h := range pool {
		if i%2 == 1 && tab.home(h) != tab.home(pool[i-1]) {
			t.Fatalf("pair %d does not share its home slot", i/2)
		}
		if _, ok := ref[h]; ok != (tab.find(h) != nil) {
			t.Fatalf("at the end: hash %x in map %v, in table %v", h, ok, !ok)
		}
	}
}
