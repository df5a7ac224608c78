package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRunWritesDeterministicReport(t *testing.T) {
	var outs [2][]byte
	for i := range outs {
		dir := t.TempDir()
		var stdout, stderr bytes.Buffer
		args := []string{"-scenario", "hot-tenant", "-scenario", "../../sim/scenarios/steady.json", "-intervals", "1s,15s",
			"-duration", "90s", "-subjects", "100", "-seed", "3", "-out", dir}
		if err := run(context.Background(), args, &stdout, &stderr); err != nil {
			t.Fatal(err, stderr.String())
		}
		if stderr.Len() != 0 {
			t.Errorf("progress bar written to a non-terminal: %q", stderr.String())
		}
		if !strings.Contains(stdout.String(), "hot-tenant") {
			t.Errorf("table misses the scenario:\n%s", stdout.String())
		}
		for _, f := range []string{"report.csv", "report.md", "overshoot.svg", "under_admission.svg", "series-steady.svg", "series-hot-tenant.svg"} {
			if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
				t.Error(err)
			}
		}
		data, err := os.ReadFile(filepath.Join(dir, "report.json"))
		if err != nil {
			t.Fatal(err)
		}
		var runs []map[string]any
		if err := json.Unmarshal(data, &runs); err != nil {
			t.Fatal(err)
		}
		if len(runs) != 8 {
			t.Fatalf("%d runs, want 2 scenarios × 2 intervals × 2 protocols", len(runs))
		}
		for _, k := range []string{"scenario", "rebalance_interval_s", "protocol", "overshoot_1s", "overshoot_10s", "overshoot_60s", "under_admission", "admitted", "ideal_admitted", "offered"} {
			if _, ok := runs[0][k]; !ok {
				t.Errorf("report.json lacks %q", k)
			}
		}
		outs[i] = data
	}
	if !bytes.Equal(outs[0], outs[1]) {
		t.Error("same seed, different report.json")
	}
}

func TestRunErrors(t *testing.T) {
	for _, args := range [][]string{
		{"-scenario", "no-such-scenario"},
		{"-intervals", "soon"},
		{"-algorithm", "lottery"},
		{"-protocol", "gossip", "-duration", "10s", "-scenario", "steady"},
		{"stray"},
		{"-share-rules", "maybe"},
	} {
		if err := run(context.Background(), append(args, "-out", t.TempDir()), &bytes.Buffer{}, &bytes.Buffer{}); err == nil {
			t.Errorf("run(%q) succeeded", args)
		}
	}
}

func TestRunCPUProfile(t *testing.T) {
	dir := t.TempDir()
	prof := filepath.Join(dir, "cpu.prof")
	args := []string{"-scenario", "steady", "-intervals", "5s", "-protocol", "two-step", "-duration", "30s", "-subjects", "50", "-out", dir, "-cpuprofile", prof}
	if err := run(context.Background(), args, &bytes.Buffer{}, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(prof); err != nil || st.Size() == 0 {
		t.Errorf("profile not written: %v", err)
	}
	args[len(args)-1] = filepath.Join(dir, "no", "such", "dir", "cpu.prof")
	if err := run(context.Background(), args, &bytes.Buffer{}, &bytes.Buffer{}); err == nil {
		t.Error("an unwritable -cpuprofile was accepted")
	}
}

// TestRunShareRules: -share-rules both runs tenant-move with and without
// the nodes' rules on shares that grew; without them the moving tenant
// overshoots, with them it does not.
func TestRunShareRules(t *testing.T) {
	var out bytes.Buffer
	args := []string{"-scenario", "tenant-move", "-intervals", "5s", "-protocol", "two-step", "-subjects", "300", "-share-rules", "both", "-out", t.TempDir()}
	if err := run(context.Background(), args, &out, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	var with, without []string
	for _, line := range strings.Split(out.String(), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) > 5 && f[2] == "two-step":
			with = f
		case len(f) > 5 && f[2] == "two-step-norules":
			without = f
		}
	}
	if with == nil || without == nil {
		t.Fatalf("rows with and without the rules missing:\n%s", out.String())
	}
	if with[5] != "0.0000" || without[5] == "0.0000" {
		t.Errorf("overshoot(60 s) %s with the rules, %s without; want 0 and above 0", with[5], without[5])
	}
}
