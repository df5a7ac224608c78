package regional

import (
	"strconv"
	"testing"
	"time"
)

// TestExpiredSubjectLiveAgainInPlace: a subject checked again after its
// entry expired is live again, fresh (it may hold no bucket any more),
// counted once, and costs no allocation: its entry is reused, not dropped
// and made anew.
func TestExpiredSubjectLiveAgainInPlace(t *testing.T) {
	const ttl = time.Second
	s := newSubjectSet(4, ttl)
	now := time.Unix(1_700_000_000, 0)
	for i := range 4 {
		if v, fresh := s.admit("s"+strconv.Itoa(i), now); v != subjectOwn || !fresh {
			t.Fatalf("new subject %d: %v, fresh %v", i, v, fresh)
		}
	}
	later := now.Add(2 * ttl) // every entry expired
	if v, fresh := s.admit("s0", later); v != subjectOwn || !fresh {
		t.Fatalf("expired subject checked again: %v, fresh %v; want its own bucket, fresh", v, fresh)
	}
	if v, fresh := s.admit("s0", later); v != subjectOwn || fresh {
		t.Fatalf("subject live again, checked once more: %v, fresh %v; want its own bucket, not fresh", v, fresh)
	}
	// The bound still counts every live subject: s0 and three new ones
	// fill it, a fifth overflows.
	for i := 4; i < 7; i++ {
		if v, _ := s.admit("s"+strconv.Itoa(i), later); v != subjectOwn {
			t.Fatalf("new subject %d beside s0: %v", i, v)
		}
	}
	if v, _ := s.admit("s7", later); v != subjectOverflow {
		t.Fatalf("a fifth live subject under a bound of 4: %v, want overflow", v)
	}
	_, sh := s.shard("s0")
	if n := sh.m.len(); n != 4 {
		t.Fatalf("%d entries, want the 4 live subjects (the expired ones dropped)", n)
	}
	i := 0
	allocs := testing.AllocsPerRun(100, func() {
		i++
		s.admit("s0", later.Add(time.Duration(i)*2*ttl))
	})
	if allocs != 0 {
		t.Errorf("checking an expired subject again allocated %.1f times, want 0", allocs)
	}
}

// TestNewSubjectReusesExpiredPlace: a new subject that comes when an
// entry has expired takes the expired entry's place in the shard's slab:
// no allocation, and the shard holds no more entries than live subjects.
func TestNewSubjectReusesExpiredPlace(t *testing.T) {
	const ttl = time.Second
	s := newSubjectSet(4, ttl)
	now := time.Unix(1_700_000_000, 0)
	subjects := make([]string, 200)
	for i := range subjects {
		subjects[i] = "n" + strconv.Itoa(i)
	}
	s.admit("first", now)
	i := 0
	allocs := testing.AllocsPerRun(100, func() {
		i++
		// Each new subject comes after the last one expired.
		if v, fresh := s.admit(subjects[i], now.Add(time.Duration(i)*2*ttl)); v != subjectOwn || !fresh {
			t.Fatalf("new subject %d: %v, fresh %v", i, v, fresh)
		}
	})
	if allocs != 0 {
		t.Errorf("a new subject in an expired one's place allocated %.1f times, want 0", allocs)
	}
	_, sh := s.shard("first")
	if sh.m.len() != 1 || len(sh.entries) > 2 {
		t.Errorf("%d subjects listed in %d entries, want 1 in at most 2", sh.m.len(), len(sh.entries))
	}
}
