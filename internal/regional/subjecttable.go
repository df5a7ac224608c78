package regional

import "math/bits"

// subjectTable maps the 64-bit hashes of a shard's live subjects to their
// entries: open addressing with linear probing in one pointer-free array,
// each slot holding the hash, the entry's expiry and its index. A check
// of a live subject reads one slot (and its neighbours on a collision):
// a Go map reached the slot through its header, directory, table and
// group, each a cache miss among 100,000 subjects, and then read the
// entry for its expiry.
//
// The array holds at most 3/4 of its slots, doubles when it would hold
// more and never shrinks (a shard holds at most subjectSet.per
// subjects). The zero value is an empty table.
type subjectTable struct {
	slots []tableSlot // len a power of two, or 0
	shift uint        // 64 - log2(len(slots))
	n     int
}

type tableSlot struct {
	hash    uint64
	expires int64 // unix nanoseconds, as the entry's
	i1      int32 // the entry's index + 1; 0 for an empty slot
}

// fibonacci spreads a hash over the table with its high bits: a shard's
// hashes share their low bits (the shard is the hash modulo the shards).
const fibonacci = 0x9E3779B97F4A7C15

func (t *subjectTable) home(h uint64) int {
	return int((h * fibonacci) >> t.shift)
}

// len is the number of subjects in the table.
func (t *subjectTable) len() int { return t.n }

// find returns the slot of h, nil when h is not in the table.
func (t *subjectTable) find(h uint64) *tableSlot {
	if t.n == 0 {
		return nil
	}
	mask := len(t.slots) - 1
	for p := t.home(h); ; p = (p + 1) & mask {
		s := &t.slots[p]
		if s.i1 == 0 {
			return nil
		}
		if s.hash == h {
			return s
		}
	}
}

// put adds h, which is not in the table, for entry i expiring at expires.
func (t *subjectTable) put(h uint64, i int32, expires int64) {
	if (t.n+1)*4 > len(t.slots)*3 {
		t.grow()
	}
	t.place(tableSlot{hash: h, expires: expires, i1: i + 1})
	t.n++
}

func (t *subjectTable) place(s tableSlot) {
	mask := len(t.slots) - 1
	for p := t.home(s.hash); ; p = (p + 1) & mask {
		if t.slots[p].i1 == 0 {
			t.slots[p] = s
			return
		}
	}
}

func (t *subjectTable) grow() {
	old := t.slots
	size := max(8, 2*len(old))
	t.slots = make([]tableSlot, size)
	t.shift = uint(64 - bits.TrailingZeros(uint(size)))
	for _, s := range old {
		if s.i1 != 0 {
			t.place(s)
		}
	}
}

// delete removes h from the table, if there. The slots after it that
// belong at or before its place move back, so that no probe sequence
// meets an empty slot before its hash (no tombstones).
func (t *subjectTable) delete(h uint64) {
	s := t.find(h)
	if s == nil {
		return
	}
	mask := len(t.slots) - 1
	hole := t.home(h)
	for &t.slots[hole] != s {
		hole = (hole + 1) & mask
	}
	t.slots[hole] = tableSlot{}
	for j := (hole + 1) & mask; t.slots[j].i1 != 0; j = (j + 1) & mask {
		// The slot at j stays unless its home is cyclically outside
		// (hole, j], that is, its probe passed the hole.
		k := t.home(t.slots[j].hash)
		if (hole < j && (k <= hole || k > j)) || (hole > j && k <= hole && k > j) {
			t.slots[hole] = t.slots[j]
			t.slots[j] = tableSlot{}
			hole = j
		}
	}
	t.n--
}
