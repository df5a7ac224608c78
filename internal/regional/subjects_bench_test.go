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
