package regional

import (
	"context"
	"sync"
	"testing"
	"time"
)

// TestHotReload: a changed file is picked up; a bad one keeps the last
// good set.
func TestHotReload(t *testing.T) {
	h := startNode(t, Config{}, map[string]string{"p.yaml": "policies:\n  - {name: a, capacity: 1, rate: 1/minute}\n"})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := h.node.WatchPolicies(ctx, h.dir, 20*time.Millisecond); err != nil {
			t.Error(err)
		}
	}()
	defer func() { cancel(); wg.Wait() }()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	time.Sleep(50 * time.Millisecond) // let the watcher start
	if err := writeFile(h.dir, "p.yaml", "policies:\n  - {name: b, capacity: 1, rate: 1/minute}\n"); err != nil {
		t.Fatal(err)
	}
	waitFor("policy b", func() bool { _, ok := h.node.Policies().Get("b"); return ok })
	errsBefore := counterValue(t, h.reg, "quota_regional_policy_reloads_total")
	if err := writeFile(h.dir, "p.yaml", "policies:\n  - {name: c, capacity: -1}\n"); err != nil {
		t.Fatal(err)
	}
	waitFor("a failed reload", func() bool { return counterValue(t, h.reg, "quota_regional_policy_reloads_total") > errsBefore })
	if _, ok := h.node.Policies().Get("b"); !ok {
		t.Fatal("a bad reload dropped the last good policies")
	}
}
