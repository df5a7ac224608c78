package rebalance

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestFakeRegistrationsRefuseTheRound: one region holding more than
// MaxNodesPerRegion registrations (a node credential writing fake ones)
// makes the round refuse to publish, with ErrTooManyRegistrations and a
// "refused" round in the metrics; once they are gone the round publishes.
func TestFakeRegistrationsRefuseTheRound(t *testing.T) {
	e := newEnv(t, "a", "b")
	ctx := context.Background()
	l, _ := startLoop(t, Config{Client: e.cli, Name: "c1"})
	waitLeader(t, l)
	for i := 0; i < MaxNodesPerRegion; i++ {
		if _, err := e.cli.Put(ctx, e.layout.Node("a", fmt.Sprintf("fake-%d", i)), "{}"); err != nil {
			t.Fatal(err)
		}
	}
	before := e.alloc(t)
	_, err := l.RebalanceNow(ctx)
	if !errors.Is(err, ErrTooManyRegistrations) {
		t.Fatalf("round with %d+1 registrations in region a: %v, want ErrTooManyRegistrations", MaxNodesPerRegion, err)
	}
	if got := refusedRounds(t, l); got < 1 {
		t.Errorf("refused rounds counted %v, want at least 1", got)
	}
	if after := e.alloc(t); after.Epoch != before.Epoch {
		t.Errorf("a refused round published epoch %d (was %d)", after.Epoch, before.Epoch)
	}
	if _, err := e.cli.Delete(ctx, e.layout.RegionNodes("a")+"fake-", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	if _, err := l.RebalanceNow(ctx); err != nil {
		t.Fatalf("round after the fake registrations were removed: %v", err)
	}
}

// refusedRounds reads the rounds counter labelled result="refused".
func refusedRounds(t *testing.T, l *Loop) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	if err := reg.Register(l.m.rounds); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "result" && lp.GetValue() == "refused" {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}
