package regionsync

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/quotacoord/quota/internal/etcdlayout"
)

// ShardWriter keeps one node's sharded record, its demand report
// (etcdlayout.DemandShards records) or its acknowledgement (Shards), in
// step with etcd for the node's lease: a Write puts only the shards whose
// value changed since the last write etcd accepted for the same lease,
// and deletes the shards that emptied. The zero value writes every shard
// on its first Write. It is not safe for concurrent use.
type ShardWriter[V any] struct {
	lease   clientv3.LeaseID
	written map[int]V
}

// Owner is the node a ShardWriter writes for.
type Owner struct {
	// Lease is the node's lease.
	Lease clientv3.LeaseID
	// Registration, when set, is the node's registration key, and the
	// shards outlive the lease: they are put without it, each transaction
	// only while Registration is held under Lease (else ErrNotRegistered).
	// Acknowledgements are kept this way, so that a leader that did not
	// see the node go still reads the epochs it may enforce when cut off;
	// the leader deletes them once it keeps the node among the vanished
	// ones. Without Registration the shards are put under Lease and end
	// with it (demand reports).
	Registration string
}

// ErrNotRegistered is a kept write refused because the node's
// registration is no longer held under its lease.
var ErrNotRegistered = errors.New("regionsync: registration not held under the lease")

// Written is what one Write sent to etcd.
type Written struct {
	Puts, Deletes, Bytes, Txns int
}

// Write makes etcd hold shards for owner at key(shard): a shard is put
// when it was not written for owner's lease before or changed(old, new)
// says it moved, and a shard written before that is absent from shards is
// deleted. Operations go out in transactions within etcdlayout.MaxTxnOps
// and MaxTxnBytes; a shard is remembered as written only once its
// transaction succeeded, so a failed Write is repeated by the next one.
func (w *ShardWriter[V]) Write(ctx context.Context, kv clientv3.KV, owner Owner, key func(shard int) string,
	shards map[int]V, changed func(old, new V) bool) (Written, error) {
	lease := owner.Lease
	if lease != w.lease || w.written == nil {
		w.lease, w.written = lease, map[int]V{}
	}
	put := []clientv3.OpOption{clientv3.WithLease(lease)}
	var held []clientv3.Cmp
	if owner.Registration != "" {
		put = nil
		held = []clientv3.Cmp{clientv3.Compare(clientv3.LeaseValue(owner.Registration), "=", lease)}
	}
	type op struct {
		shard int
		put   bool
		value []byte
	}
	var ops []op
	for _, s := range slices.Sorted(maps.Keys(shards)) {
		v := shards[s]
		if old, ok := w.written[s]; ok && !changed(old, v) {
			continue
		}
		b, err := json.Marshal(v)
		if err != nil {
			return Written{}, fmt.Errorf("encode %s: %w", key(s), err)
		}
		ops = append(ops, op{shard: s, put: true, value: b})
	}
	for _, s := range slices.Sorted(maps.Keys(w.written)) {
		if _, ok := shards[s]; !ok {
			ops = append(ops, op{shard: s})
		}
	}
	sizes := make([]int, len(ops))
	for i, o := range ops {
		sizes[i] = len(key(o.shard)) + len(o.value)
	}
	var out Written
	start := 0
	for _, end := range etcdlayout.Batches(sizes, etcdlayout.MaxTxnOps, etcdlayout.MaxTxnBytes) {
		batch := make([]clientv3.Op, 0, end-start)
		for _, o := range ops[start:end] {
			if o.put {
				batch = append(batch, clientv3.OpPut(key(o.shard), string(o.value), put...))
			} else {
				batch = append(batch, clientv3.OpDelete(key(o.shard)))
			}
		}
		resp, err := kv.Txn(ctx).If(held...).Then(batch...).Commit()
		if err != nil {
			return out, fmt.Errorf("write %d shards from %s for lease %x: %w", end-start, key(ops[start].shard), lease, err)
		}
		if !resp.Succeeded {
			return out, fmt.Errorf("write %d shards from %s: %w: %s, lease %x", end-start, key(ops[start].shard), ErrNotRegistered, owner.Registration, lease)
		}
		out.Txns++
		for i, o := range ops[start:end] {
			out.Bytes += sizes[start+i]
			if o.put {
				out.Puts++
				w.written[o.shard] = shards[o.shard]
			} else {
				out.Deletes++
				delete(w.written, o.shard)
			}
		}
		start = end
	}
	return out, nil
}

// ackChanged says an acknowledgement shard holds other epochs than old.
// The same map (a table's shard that did not change, sharedShares) is
// told at once, without comparing its epochs.
func ackChanged(old, new etcdlayout.Ack) bool {
	if len(old.Epochs) == len(new.Epochs) && reflect.ValueOf(old.Epochs).UnsafePointer() == reflect.ValueOf(new.Epochs).UnsafePointer() {
		return false
	}
	return !maps.Equal(old.Epochs, new.Epochs)
}

// DemandTolerance is how far, relative to the larger of the two, a
// reported rate may move before a node rewrites the demand shard that
// holds it (etcdlayout.DemandTolerance).
const DemandTolerance = etcdlayout.DemandTolerance

// demandChanged says a demand shard moved past DemandTolerance: a policy
// came or went, or one moved (etcdlayout.DemandMoved).
func demandChanged(old, new etcdlayout.DemandReport) bool {
	if len(old.Policies) != len(new.Policies) {
		return true
	}
	for p, n := range new.Policies {
		if o, ok := old.Policies[p]; !ok || etcdlayout.DemandMoved(o, n) {
			return true
		}
	}
	return false
}
