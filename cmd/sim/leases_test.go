package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestRunLeases(t *testing.T) {
	var stdout bytes.Buffer
	args := []string{"-leases", "envoys-moving", "-lease-ttls", "2s,4s", "-lease-intervals", "1s", "-lease-consumers", "3,6", "-lease-duration", "40s"}
	if err := run(context.Background(), args, &stdout, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	out := stdout.String()
	for _, want := range []string{"overshoot", "under-admission", "envoys-moving  3", "envoys-moving  6", "skipped: ttl 2s ≤ interval 1s + margin 1s", "worst overshoot 0.0000"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "envoys-moving"); n != 2 {
		t.Errorf("%d rows, want 2 (3 and 6 consumers at TTL 4s):\n%s", n, out)
	}
}

// TestRunLeasesNodes: -lease-nodes sweeps the nodes serving the
// consumers; a point with more nodes than consumers is skipped.
func TestRunLeasesNodes(t *testing.T) {
	var stdout bytes.Buffer
	args := []string{"-leases", "envoys-two-nodes", "-lease-consumers", "2", "-lease-nodes", "1,2,3", "-lease-duration", "40s"}
	if err := run(context.Background(), args, &stdout, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	out := stdout.String()
	for _, want := range []string{"nodes", "envoys-two-nodes  2          1", "envoys-two-nodes  2          2", "skipped: 3 nodes > 2 consumers", "worst overshoot 0.0000"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestRunLeasesErrors(t *testing.T) {
	for _, args := range [][]string{
		{"-leases", "nope"},
		{"-leases", "envoys-moving", "-lease-ttls", "soon"},
		{"-leases", "envoys-moving", "-lease-consumers", "0"},
		{"-leases", "envoys-moving", "-lease-nodes", "x"},
		{"-leases", "envoys-moving", "-lease-ttls", "1s"},
		{"-intervals", ""},
	} {
		if err := run(context.Background(), args, &bytes.Buffer{}, &bytes.Buffer{}); err == nil {
			t.Errorf("run(%q) succeeded", args)
		}
	}
}
