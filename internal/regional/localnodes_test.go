package regional

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/etcdtest"
	"github.com/quotacoord/quota/internal/redistest"
	"github.com/quotacoord/quota/internal/regionsync"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

// TestLocalFallbackDividesShareAmongNodes: region eu runs three nodes
// (this one and two more registered in etcd) at share 0.75 of a policy of
// capacity 40 whose failure mode is local. With Redis down, this node's
// in-process bucket holds 0.75 × 40 / 3 = 10 tokens, so the three nodes
// together admit no more than the region's 30; once one node's
// registration goes, the bucket's limit is 0.75 × 40 / 2 = 15.
func TestLocalFallbackDividesShareAmongNodes(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	lay := etcdlayout.Layout{}
	ctx := ctxT(t)
	for _, other := range []string{"n2", "n3"} {
		reg, _ := json.Marshal(etcdlayout.Registration{Region: "eu", Node: other})
		if _, err := cli.Put(ctx, lay.Node("eu", other), string(reg)); err != nil {
			t.Fatal(err)
		}
	}
	a, _ := json.Marshal(etcdlayout.Allocation{Policy: "flocal", Epoch: 1, Phase: etcdlayout.PhaseStable,
		Default: map[string]float64{"eu": 0.75, "us": 0.25}, Safe: map[string]float64{"eu": 0.1, "us": 0.1}})
	if _, err := cli.Put(ctx, lay.Alloc("flocal"), string(a)); err != nil {
		t.Fatal(err)
	}
	sync := runRegionSync(t, srv, regionsync.Config{Region: "eu", Node: "n1", LeaseTTL: 3 * time.Second})

	rs := redistest.Start(t)
	rc, err := redisClient(rs.Addr, 20*time.Millisecond, bucket.DialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rc.Close() })
	rs.Stop()
	h := startNode(t, Config{Region: "eu", Shares: sync, Store: redisStore(t, rc), StoreTimeout: 100 * time.Millisecond},
		map[string]string{"own.yaml": `
policies:
  - {name: flocal, capacity: 40, rate: 40/hour, failure_mode: local}
`})
	deadline := time.Now().Add(10 * time.Second)
	for !sync.Ready() || sync.Nodes() != 3 || sync.Share("flocal", "") != 0.75 {
		if time.Now().After(deadline) {
			t.Fatalf("region sync not ready at share 0.75 with 3 nodes: ready %v, nodes %d, share %v",
				sync.Ready(), sync.Nodes(), sync.Share("flocal", ""))
		}
		time.Sleep(10 * time.Millisecond)
	}
	subject := redistest.Unique(t)
	check := func() *quotav1.CheckResponse {
		t.Helper()
		r, err := h.adm.Check(ctx, &quotav1.CheckRequest{Subject: subject, Policies: []string{"flocal"}})
		if err != nil {
			t.Fatal(err)
		}
		if r.Degraded != "local" {
			t.Fatalf("with Redis down, check not decided locally: %v", r)
		}
		return r
	}
	admitted := 0
	for range 20 {
		r := check()
		if r.Limit != 10 {
			t.Fatalf("local limit %v with three nodes at share 0.75 of 40, want 10", r.Limit)
		}
		if r.Allowed {
			admitted++
		}
	}
	if admitted != 10 {
		t.Fatalf("the local bucket admitted %d of 20, want 10 (the region's 30 over its 3 nodes)", admitted)
	}

	if _, err := cli.Delete(ctx, lay.Node("eu", "n3")); err != nil {
		t.Fatal(err)
	}
	for sync.Nodes() != 2 {
		if time.Now().After(deadline.Add(5 * time.Second)) {
			t.Fatalf("nodes %d after n3's registration went, want 2", sync.Nodes())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if r := check(); r.Limit != 15 || r.Allowed {
		t.Fatalf("with two nodes: %v, want limit 15 and no tokens added at once", r)
	}
}

// runRegionSync runs a regionsync.Syncer of cfg (its Client dialed to
// srv) until the test ends.
func runRegionSync(t *testing.T, srv *etcdtest.Server, cfg regionsync.Config) *regionsync.Syncer {
	t.Helper()
	c, err := regionsync.Dial(srv.Endpoints)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Client = c
	s, err := regionsync.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("regionsync Run: %v", err)
		}
		_ = c.Close()
	})
	return s
}

// putAllocation publishes a stable allocation of policy with region eu at
// share (us holding the rest, both with safe share 0.1) and waits until
// s enforces it.
func putAllocation(t *testing.T, cli *clientv3.Client, s *regionsync.Syncer, policy string, epoch uint64, share float64) {
	t.Helper()
	a, _ := json.Marshal(etcdlayout.Allocation{Policy: policy, Epoch: epoch, Phase: etcdlayout.PhaseStable,
		Default: map[string]float64{"eu": share, "us": 1 - share}, Safe: map[string]float64{"eu": 0.1, "us": 0.1}})
	if _, err := cli.Put(ctxT(t), etcdlayout.Layout{}.Alloc(policy), string(a)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if e, _ := s.Epoch(policy); e == epoch && s.Ready() && s.Share(policy, "") == share {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("epoch %d of %s (eu at %v) not enforced within 10s", epoch, policy, share)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
