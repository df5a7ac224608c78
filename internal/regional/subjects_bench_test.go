package regional

import (
	"strconv"
	"testing"
	"time"

	"github.com/quotacoord/quota/bucket"
)

// BenchmarkLiveSubjectsAdmit is the live-subject bound's cost per check:
// admit of a subject that is already live, among 10,000 hashed subjects of
// one policy under the default bound.
func BenchmarkLiveSubjectsAdmit(b *testing.B) {
	s := newSubjectSet(100000, time.Minute)
	subjects := make([]string, 10000)
	now := time.Unix(1_700_000_000, 0)
	for i := range subjects {
		subjects[i] = bucket.HashSubject("bench", strconv.Itoa(i))
		if v, fresh := s.admit(subjects[i], now); v != subjectOwn || !fresh {
			b.Fatalf("subject %d: %v, fresh %v", i, v, fresh)
		}
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if v, _ := s.admit(subjects[i%len(subjects)], now.Add(time.Duration(i)*time.Microsecond)); v != subjectOwn {
			b.Fatal(v)
		}
		i++
	}
}

// BenchmarkLiveSubjectsAdmitExpired is admit of a subject whose entry has
// expired since its last check (a subject seen less often than its TTL,
// as each subject of each of the ten policies of bench-regional.sh's
// 10-descriptor run), among 100,000 hashed subjects of one policy.
func BenchmarkLiveSubjectsAdmitExpired(b *testing.B) {
	const ttl = time.Second
	s := newSubjectSet(200000, ttl)
	subjects := make([]string, 100000)
	now := time.Unix(1_700_000_000, 0)
	for i := range subjects {
		subjects[i] = bucket.HashSubject("bench", strconv.Itoa(i))
		s.admit(subjects[i], now)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		// Each pass over the subjects comes two TTLs after the last.
		at := now.Add(time.Duration(i/len(subjects)+1) * 2 * ttl)
		if v, fresh := s.admit(subjects[i%len(subjects)], at); v != subjectOwn || !fresh {
			b.Fatal(v, fresh)
		}
		i++
	}
}
