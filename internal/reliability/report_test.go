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
