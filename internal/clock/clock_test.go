package clock

import (
	"testing"
	"time"
)

func TestManual(t *testing.T) {
	start := time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)
	m := NewManual(start)
	if got := m.Now(); !got.Equal(start) {
		t.Fatalf("Now = %v, want %v", got, start)
	}
	if got := m.Advance(1500 * time.Millisecond); !got.Equal(start.Add(1500 * time.Millisecond)) {
		t.Fatalf("Advance = %v", got)
	}
	m.Set(start)
	if got := m.Now(); !got.Equal(start) {
		t.Fatalf("after Set, Now = %v, want %v", got, start)
	}
	var r Real
	if r.Now().IsZero() {
		t.Fatal("Real.Now is zero")
	}
}
