package etcdtest

import (
	"context"
	"testing"
	"time"
)

// TestClusterSurvivesLeaderKill: a three-member cluster elects a leader,
// keeps what was written when that leader is killed, elects another among
// the two left, and serves reads and writes to a client of all three
// endpoints.
func TestClusterSurvivesLeaderKill(t *testing.T) {
	c := StartCluster(t)
	cli := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "k", "before"); err != nil {
		t.Fatal(err)
	}
	lead, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	k := time.Now()
	c.Kill(lead)
	t.Logf("kill took %v", time.Since(k))
	next, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if next == lead {
		t.Fatalf("member %d still leads after it was killed", lead)
	}
	if _, err := cli.Put(ctx, "k", "after"); err != nil {
		t.Fatalf("put after the leader's kill: %v", err)
	}
	r, err := cli.Get(ctx, "k")
	if err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "after" {
		t.Fatalf("get after the leader's kill: %v, %v", r, err)
	}
	if v := r.Kvs[0].Version; v != 2 {
		t.Fatalf("k has version %d, want 2 (the write before the kill kept)", v)
	}
}
