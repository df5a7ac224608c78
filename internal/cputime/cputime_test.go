package cputime_test

import (
	"testing"
	"time"

	"github.com/quotacoord/quota/internal/cputime"
)

func TestProcessGrowsWithWork(t *testing.T) {
	before := cputime.Process()
	if before <= 0 {
		t.Fatalf("Process() = %v before any work, want > 0 on this platform", before)
	}
	x := 0
	for start := time.Now(); time.Since(start) < 30*time.Millisecond; {
		x++
	}
	if after := cputime.Process(); after <= before {
		t.Fatalf("Process() %v after 30 ms of spinning (%d loops), %v before", after, x, before)
	}
}
