package reliability

import (
	"bytes"
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

func TestFuzzExecs(t *testing.T) {
	for _, tc := range []struct {
		out  string
		want int64
		err  error
	}{
		{"fuzz: elapsed: 0s, gathering baseline coverage: 0/3 completed\nfuzz: elapsed: 3s, execs: 1200 (400/sec), new interesting: 2 (total: 5)\nfuzz: elapsed: 5s, execs: 2100 (450/sec), new interesting: 2 (total: 5)\nPASS\n", 2100, nil},
		{"ok  \tpkg\t0.1s\n", 0, ErrNoFuzzRun},
	} {
		got, err := FuzzExecs(tc.out)
		if got != tc.want || !errors.Is(err, tc.err) {
			t.Errorf("FuzzExecs(%q) = %d, %v; want %d, %v", tc.out, got, err, tc.want, tc.err)
		}
	}
}

func TestRecorderRoundTripAndSummary(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r.jsonl")
	r := NewRecorder(path)
	in := []Entry{
		{Kind: KindFault, Name: "a", Injected: true, Survived: true, Decisions: map[string]int64{"open": 2}, InvariantChecks: 3},
		{Kind: KindFault, Name: "b", Injected: true, Survived: false, Lost: 1},
		{Kind: KindFuzz, Name: "f", Injected: true, Survived: true, FuzzExecs: 10},
	}
	for _, e := range in {
		if err := r.Record(e); err != nil {
			t.Fatal(err)
		}
	}
	var zero *Recorder
	if err := zero.Record(in[0]); err != nil {
		t.Fatalf("nil recorder: %v", err)
	}
	out, err := ReadEntries(strings.NewReader(mustRead(t, path)))
	if err != nil || len(out) != 3 {
		t.Fatalf("ReadEntries = %d entries, %v", len(out), err)
	}
	s := Summarize(out)
	if s.Attacks != 0 {
		t.Fatalf("attacks %d without a security row", s.Attacks)
	}
	if s.FaultsInjected != 2 || s.FaultsSurvived != 1 || s.Lost != 1 || s.FuzzExecs != 10 || s.InvariantChecks != 3 || s.OK() {
		t.Fatalf("summary %+v", s)
	}
	var b bytes.Buffer
	if err := s.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "verdict:                         FAIL") || !strings.Contains(b.String(), "failed:                          fault/b") {
		t.Fatalf("table:\n%s", b.String())
	}
	if _, err := ReadEntries(strings.NewReader("{not json\n")); err == nil {
		t.Fatal("bad line accepted")
	}
}

// TestSecurityTable: security rows add up to the security table, and one
// limit lifted or one fail-open decision fails the verdict even when
// every row says it survived.
func TestSecurityTable(t *testing.T) {
	clean := []Entry{
		{Kind: KindSecurity, Name: "attack: long value", Injected: true, Survived: true, Requests: 10},
		{Kind: KindSecurity, Name: "attack: flood", Injected: true, Survived: true, Requests: 1000},
		{Kind: KindFault, Name: "redis down", Injected: true, Survived: true},
	}
	s := Summarize(clean)
	if s.Attacks != 2 || s.Requests != 1010 || s.LimitsLifted != 0 || s.FailOpen != 0 || !s.OK() {
		t.Fatalf("summary %+v", s)
	}
	var b bytes.Buffer
	if err := s.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ATTACK", "attack: flood", "attacks tried:                   2 (1010 requests)",
		"limits lifted:                   0 (must be 0)", "fail-open decisions by input:    0 (must be 0)", "verdict:                         PASS"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
	for _, bad := range []Entry{
		{Kind: KindSecurity, Name: "lifted", Injected: true, Survived: true, Requests: 5, LimitsLifted: 1},
		{Kind: KindSecurity, Name: "fail open", Injected: true, Survived: true, Requests: 5, FailOpen: 1},
	} {
		s := Summarize(append(append([]Entry(nil), clean...), bad))
		b.Reset()
		if err := s.WriteTable(&b); err != nil {
			t.Fatal(err)
		}
		if s.OK() || !strings.Contains(b.String(), "verdict:                         FAIL") {
			t.Errorf("%s: verdict passes:\n%s", bad.Name, b.String())
		}
	}
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	var b bytes.Buffer
	f, err := openFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := b.ReadFrom(f); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestBoundRows: the randomized live runs' rows add up to the bound
// lines of the table (runs, decisions and windows checked, windows over
// the bound), and one window over the bound fails the verdict even when
// every row says it survived.
func TestBoundRows(t *testing.T) {
	rows := []Entry{
		{Kind: KindBound, Name: "e2e random run E2E_SEED=1", Injected: true, Survived: true, BoundDecisions: 1200, BoundWindows: 5000},
		{Kind: KindBound, Name: "e2e random run E2E_SEED=2", Injected: true, Survived: true, BoundDecisions: 800, BoundWindows: 3000},
	}
	s := Summarize(rows)
	if s.BoundRuns != 2 || s.BoundDecisions != 2000 || s.BoundWindows != 8000 || s.BoundViolations != 0 || !s.OK() {
		t.Fatalf("summary %+v", s)
	}
	var b bytes.Buffer
	if err := s.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"1200 decisions, 5000 windows (0 violations)",
		"bound runs (live, randomized):   2\n",
		"decisions checked against bound: 2000\n",
		"windows checked against bound:   8000\n",
		"windows over the bound:          0 (must be 0)\n",
		"verdict:                         PASS",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
	rows[1].Violations = 1
	if s := Summarize(rows); s.BoundViolations != 1 || s.OK() {
		t.Fatalf("a window over the bound: summary %+v", s)
	}
}
