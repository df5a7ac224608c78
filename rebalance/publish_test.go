package rebalance

import (
	"context"
	"errors"
	"fmt"
	"testing"

	dto "github.com/prometheus/client_model/go"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/quotacoord/quota/internal/etcdlayout"
)

// TestPublishAllBatchesFenced: 300 allocations go out in three fenced
// transactions (at most MaxTxnOps compares each); an allocation that
// changed since the read is left out while the rest of its batch is
// written; a registration written since the read stops every publish.
func TestPublishAllBatchesFenced(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	l, err := New(Config{Client: e.cli, Name: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	s, err := concurrency.NewSession(e.cli, concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	el := concurrency.NewElection(s, e.layout.Election())
	if err := el.Campaign(ctx, "c1"); err != nil {
		t.Fatal(err)
	}
	f := fence{key: el.Key(), rev: el.Rev()}
	pubs := func(epoch uint64, n int, revs map[string]int64) []publication {
		out := make([]publication, n)
		for i := range out {
			p := fmt.Sprintf("p%03d", i)
			out[i] = publication{alloc: &etcdlayout.Allocation{Policy: p, Epoch: epoch, Phase: etcdlayout.PhaseStable, Default: map[string]float64{"a": 1}}, prevRev: revs[p]}
		}
		return out
	}
	allocRevs := func() map[string]int64 {
		resp, err := e.cli.Get(ctx, e.layout.AllocPrefix(), clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]int64{}
		for _, kv := range resp.Kvs {
			out[etcdlayout.Name(e.layout.AllocPrefix(), string(kv.Key))] = kv.ModRevision
		}
		return out
	}
	done, err := l.publishAll(ctx, f, pubs(1, 300, nil), head(t, e))
	if err != nil || countTrue(done) != 300 {
		t.Fatalf("first publish: %d of 300, %v", countTrue(done), err)
	}
	var m dto.Metric
	if err := l.m.publishTxns.Write(&m); err != nil {
		t.Fatal(err)
	}
	if got := m.GetCounter().GetValue(); got != 3 {
		t.Errorf("300 allocations in %v transactions, want 3", got)
	}

	// p007 changes under the round: the other 299 are written.
	revs, read := allocRevs(), head(t, e)
	if _, err := e.cli.Put(ctx, e.layout.Alloc("p007"), `{"policy":"p007","epoch":9}`); err != nil {
		t.Fatal(err)
	}
	done, err = l.publishAll(ctx, f, pubs(2, 300, revs), read)
	if err != nil || countTrue(done) != 299 || done[7] {
		t.Fatalf("publish over a changed allocation: %d of 300 (p007 %v), %v", countTrue(done), done[7], err)
	}
	if got := allocRevs(); len(got) != 300 {
		t.Fatalf("%d allocations stored", len(got))
	}

	// A registration written since the read: nothing is written.
	revs, read = allocRevs(), head(t, e)
	if _, err := e.cli.Put(ctx, e.layout.Node("late", "n"), "{}"); err != nil {
		t.Fatal(err)
	}
	done, err = l.publishAll(ctx, f, pubs(3, 300, revs), read)
	if err != nil || countTrue(done) != 0 {
		t.Fatalf("publish after a registration: %d of 300, %v", countTrue(done), err)
	}
	for p, rev := range allocRevs() {
		if rev != revs[p] {
			t.Fatalf("%s written after a registration changed", p)
		}
	}

	// Deposed: every batch is fenced off.
	if _, err := e.cli.Revoke(ctx, s.Lease()); err != nil {
		t.Fatal(err)
	}
	revs, read = allocRevs(), head(t, e)
	if done, err = l.publishAll(ctx, f, pubs(4, 300, revs), read); !errors.Is(err, ErrNotLeader) || countTrue(done) != 0 {
		t.Fatalf("deposed publish: %d written, %v", countTrue(done), err)
	}
}
