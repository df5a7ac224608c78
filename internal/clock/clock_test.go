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
	if got := m.Mono(); got != 1500*time.Millisecond {
		t.Fatalf("Mono after Advance = %v, want 1.5s", got)
	}
	m.Set(start)
	if got := m.Now(); !got.Equal(start) {
		t.Fatalf("after Set, Now = %v, want %v", got, start)
	}
	if got := m.Advance(-time.Hour); !got.Equal(start.Add(-time.Hour)) {
		t.Fatalf("Advance back = %v", got)
	}
	if got := m.Mono(); got != 1500*time.Millisecond {
		t.Fatalf("Mono after the wall clock stepped back = %v, want 1.5s (unmoved)", got)
	}
	var r Real
	if r.Now().IsZero() {
		t.Fatal("Real.Now is zero")
	}
	a := r.Mono()
	time.Sleep(time.Millisecond)
	if b := r.Mono(); b <= a {
		t.Fatalf("Real.Mono went %v -> %v", a, b)
	}
	if got := MonotonicOf(m); got != Monotonic(m) {
		t.Fatal("MonotonicOf(Manual) is not the Manual clock")
	}
}
