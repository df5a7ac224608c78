package coordtest

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/regionsync"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Region is a fake regional node: it registers under a lease, writes
// demand reports and acknowledges epochs, all as etcdlayout says, under
// its own per-node keys.
type Region struct {
	// Name is the region's name, Node the node's id within it.
	Name string
	Node string
	// Fingerprint is written in the node's registration
	// (etcdlayout.Registration.Fingerprint); set it before Register.
	Fingerprint string

	cli    *clientv3.Client
	layout etcdlayout.Layout

	mu     sync.Mutex
	lease  clientv3.LeaseID
	stopKA context.CancelFunc
	acked  map[string]uint64
	wg     sync.WaitGroup

	// wmu guards the shard writers; every write rewrites all shards.
	wmu    sync.Mutex
	acks   regionsync.ShardWriter[etcdlayout.Ack]
	demand regionsync.ShardWriter[etcdlayout.DemandReport]
}

// DefaultNode is the node id NewRegion gives its single node.
const DefaultNode = "node-0"

// NewRegion returns an unregistered fake region of one node, DefaultNode.
func NewRegion(cli *clientv3.Client, layout etcdlayout.Layout, name string) *Region {
	return NewNode(cli, layout, name, DefaultNode)
}

// NewNode returns an unregistered fake node of region; several nodes of
// one region share its share, each with its own keys.
func NewNode(cli *clientv3.Client, layout etcdlayout.Layout, region, node string) *Region {
	return &Region{Name: region, Node: node, cli: cli, layout: layout, acked: map[string]uint64{}}
}

// Register grants a lease of ttl (etcd rounds it up to its minimum, 2s for
// a test server), keeps it alive and writes the registration under it.
// It starts a goroutine that ends with Stop or Kill.
func (r *Region) Register(ctx context.Context, ttl time.Duration) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopKA != nil {
		return fmt.Errorf("coordtest: node %s/%s already registered", r.Name, r.Node)
	}
	g, err := r.cli.Grant(ctx, int64(max(1, ttl/time.Second)))
	if err != nil {
		return fmt.Errorf("coordtest: grant lease for %s: %w", r.Name, err)
	}
	kctx, cancel := context.WithCancel(context.Background())
	ch, err := r.cli.KeepAlive(kctx, g.ID)
	if err != nil {
		cancel()
		return fmt.Errorf("coordtest: keep lease of %s alive: %w", r.Name, err)
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for range ch {
		}
	}()
	reg := etcdlayout.Registration{Region: r.Name, Node: r.Node, LeaseTTLSeconds: g.TTL, StartedAt: time.Now(), Fingerprint: r.Fingerprint}
	data, err := json.Marshal(reg)
	if err == nil {
		// As regionsync registers: the kept acknowledgements of an
		// earlier incarnation go with the new registration.
		_, err = r.cli.Txn(ctx).Then(clientv3.OpDelete(r.layout.NodeAcks(r.Name, r.Node), clientv3.WithPrefix()),
			clientv3.OpPut(r.layout.Node(r.Name, r.Node), string(data), clientv3.WithLease(g.ID))).Commit()
	}
	if err != nil {
		cancel()
		return fmt.Errorf("coordtest: register %s/%s: %w", r.Name, r.Node, err)
	}
	r.lease, r.stopKA = g.ID, cancel
	r.acked = map[string]uint64{}
	return nil
}

// Kill stops keeping the lease alive, as a region cut off from etcd: its
// registration and demand vanish when the lease expires; its
// acknowledgement is kept until a leader counts it among the vanished. It waits for the keepalive goroutine.
func (r *Region) Kill() {
	r.mu.Lock()
	stop := r.stopKA
	r.stopKA = nil
	r.mu.Unlock()
	if stop != nil {
		stop()
	}
	r.wg.Wait()
}

// Stop revokes the lease, as a region shutting down cleanly.
func (r *Region) Stop(ctx context.Context) error {
	r.mu.Lock()
	id := r.lease
	r.mu.Unlock()
	r.Kill()
	if id == 0 {
		return nil
	}
	if _, err := r.cli.Revoke(ctx, id); err != nil {
		return fmt.Errorf("coordtest: revoke lease of %s: %w", r.Name, err)
	}
	return nil
}

// Report writes a demand report for the given policies.
func (r *Region) Report(ctx context.Context, interval time.Duration, policies map[string]etcdlayout.PolicyDemand) error {
	r.mu.Lock()
	id := r.lease
	r.mu.Unlock()
	rep := etcdlayout.DemandReport{Region: r.Name, Node: r.Node, At: time.Now(), IntervalSeconds: interval.Seconds(), Policies: policies}
	return writeAll(ctx, r, "demand report", &r.demand, regionsync.Owner{Lease: id}, func(s int) string { return r.layout.DemandShard(r.Name, r.Node, s) }, etcdlayout.SplitDemand(rep))
}

// Ack records that the region applied epoch of policy and writes the
// acknowledgement of everything it applied.
func (r *Region) Ack(ctx context.Context, policy string, epoch uint64) error {
	r.mu.Lock()
	r.acked[policy] = epoch
	r.mu.Unlock()
	return r.writeAck(ctx)
}

func (r *Region) writeAck(ctx context.Context) error {
	r.mu.Lock()
	a := etcdlayout.Ack{Region: r.Name, Node: r.Node, Epochs: make(map[string]uint64, len(r.acked)), At: time.Now()}
	for p, e := range r.acked {
		a.Epochs[p] = e
	}
	id := r.lease
	r.mu.Unlock()
	owner := regionsync.Owner{Lease: id, Registration: r.layout.Node(r.Name, r.Node)}
	return writeAll(ctx, r, "acknowledgement", &r.acks, owner, func(s int) string { return r.layout.AckShard(r.Name, r.Node, s) }, etcdlayout.SplitAck(a))
}

// writeAll writes every shard of one of r's records at key(shard) for
// owner, and deletes the shards it wrote before that are absent now.
func writeAll[V any](ctx context.Context, r *Region, what string, w *regionsync.ShardWriter[V], owner regionsync.Owner, key func(int) string, shards map[int]V) error {
	r.wmu.Lock()
	defer r.wmu.Unlock()
	if _, err := w.Write(ctx, r.cli, owner, key, shards, func(_, _ V) bool { return true }); err != nil {
		return fmt.Errorf("coordtest: %s of %s/%s: %w", what, r.Name, r.Node, err)
	}
	return nil
}

// AckLatest reads every allocation and acknowledges its epoch. It returns
// the allocations read.
func (r *Region) AckLatest(ctx context.Context) (map[string]etcdlayout.Allocation, error) {
	allocs, err := Allocations(ctx, r.cli, r.layout)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	for p, a := range allocs {
		r.acked[p] = a.Epoch
	}
	r.mu.Unlock()
	if len(allocs) == 0 {
		return allocs, nil
	}
	return allocs, r.writeAck(ctx)
}

// AutoAck acknowledges every new allocation as soon as it is published,
// until ctx ends. It starts a goroutine and returns a function that waits
// for it.
func (r *Region) AutoAck(ctx context.Context) (wait func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		w := r.cli.Watch(ctx, r.layout.AllocPrefix(), clientv3.WithPrefix())
		_, _ = r.AckLatest(ctx)
		for resp := range w {
			if resp.Err() != nil {
				return
			}
			_, _ = r.AckLatest(ctx)
		}
	}()
	return func() { <-done }
}

// Allocations reads every published allocation.
func Allocations(ctx context.Context, cli *clientv3.Client, layout etcdlayout.Layout) (map[string]etcdlayout.Allocation, error) {
	resp, err := cli.Get(ctx, layout.AllocPrefix(), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("coordtest: read allocations: %w", err)
	}
	out := make(map[string]etcdlayout.Allocation, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var a etcdlayout.Allocation
		if err := json.Unmarshal(kv.Value, &a); err != nil {
			return nil, fmt.Errorf("coordtest: decode %s: %w", kv.Key, err)
		}
		out[a.Policy] = a
	}
	return out, nil
}

// PutPolicy stores a policy document as the operator API would.
func PutPolicy(ctx context.Context, cli *clientv3.Client, layout etcdlayout.Layout, doc string, data []byte) error {
	if _, err := cli.Put(ctx, layout.PolicyDoc(doc), string(data)); err != nil {
		return fmt.Errorf("coordtest: put policy %s: %w", doc, err)
	}
	return nil
}
