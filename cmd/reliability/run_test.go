package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	dir := t.TempDir()
	report := filepath.Join(dir, "r.jsonl")
	lines := `{"kind":"fault","name":"redis killed","injected":true,"survived":true,"decisions":{"open":3,"closed":2},"lost":0,"invariant_checks":8}
{"kind":"load","name":"soak","injected":true,"survived":true,"before":{"node_heap":1048576,"redis_keys":1},"after":{"node_heap":2097152,"redis_keys":0}}
`
	if err := os.WriteFile(report, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	fuzzLog := filepath.Join(dir, "f.log")
	os.WriteFile(fuzzLog, []byte("fuzz: elapsed: 3s, execs: 100 (33/sec)\nfuzz: elapsed: 6s, execs: 2500 (800/sec)\nPASS\n"), 0o644)
	var out bytes.Buffer
	ctx := context.Background()
	if err := run(ctx, []string{"fuzz", "-report", report, "-name", "policy.FuzzParse", "-log", fuzzLog}, &out); err != nil {
		t.Fatal(err)
	}
	if err := run(ctx, []string{"table", "-report", report}, &out); err != nil {
		t.Fatalf("table: %v\n%s", err, out.String())
	}
	for _, want := range []string{"faults injected / survived:      1 / 1", "closed=2 open=3", "2500 over 1 targets", "lost decisions:                  0", "verdict:                         PASS", "node_heap 1.0MiB→2.0MiB", "redis_keys 1→0"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
	// A failing fuzz run and a lost decision turn the verdict.
	os.WriteFile(fuzzLog, []byte("--- FAIL: FuzzParse\n"), 0o644)
	run(ctx, []string{"fuzz", "-report", report, "-name", "bad", "-log", fuzzLog, "-exit", "1"}, &out)
	out.Reset()
	if err := run(ctx, []string{"table", "-report", report}, &out); !errors.Is(err, errFailed) || !strings.Contains(out.String(), "fuzz/bad") {
		t.Fatalf("table with a failed fuzz run: %v\n%s", err, out.String())
	}
	for _, args := range [][]string{nil, {"table"}, {"nope", "-report", report}, {"fuzz", "-report", report}, {"table", "-report", filepath.Join(dir, "missing")}} {
		if err := run(ctx, args, &out); err == nil {
			t.Errorf("run(%q) succeeded", args)
		}
	}
}
