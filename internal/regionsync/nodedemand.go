package regionsync

import (
	"context"
	"errors"
	"math"
	"sync"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/quotacoord/quota/internal/etcdlayout"
)

// DemandPart returns this node's part of its region's demand for policy
// and subject, in [0, 1]: the rate the subject was offered here over the
// rate offered at all the region's nodes, as their last demand reports
// in etcd say (the pressured subjects each node reports, the same
// records the coordinator reads). ok is false when this node's own last
// report does not name the subject (it was not pressured here, or no
// report was read yet); the caller then splits evenly (1/Nodes()).
//
// A node leasing part of the region's bucket sizes its part by it, so
// that the region's rate goes where its subject is checked. The parts
// are a guide, not a bound: the region's bucket never leases more than
// its refill in total (package bucket), whatever the nodes ask. Safe for
// concurrent use.
func (s *Syncer) DemandPart(policy, subject string) (part float64, ok bool) {
	d := s.demands
	if d == nil {
		return 0, false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	var own, all float64
	ids := etcdlayout.DemandShardsOf(policy)
	for node, shards := range d.nodes {
		subjects, _ := etcdlayout.DemandIn(shards, ids, policy)
		v := subjects[subject]
		all += v
		if node == s.cfg.Node {
			own, ok = v, v > 0
		}
	}
	if !ok || all <= 0 {
		return 0, false
	}
	return own / all, true
}

// maxDemandSubjects bounds the pressured subjects kept per node and
// policy (a node reports at most demand.MaxTopK).
const maxDemandSubjects = 1024

// nodeDemands follows the demand reports of this node's region's nodes
// for DemandPart: per node, per demand record (at most
// etcdlayout.DemandShards + LegacyDemandShards, the keys DemandShardOf
// accepts), the pressured subjects' offered rates by policy, read as
// etcdlayout.DemandIn says. Its follow goroutine writes, DemandPart
// reads, under mu. At most MaxPolicies nodes are kept.
type nodeDemands struct {
	s     *Syncer
	mu    sync.Mutex
	nodes map[string]map[etcdlayout.DemandShardID]map[string]map[string]float64
}

// readable reports whether this node may read its region's demand
// reports. A node whose etcd credential is its own (etcdauth.NodeRole)
// may not: it says so once and its DemandPart has no answer (the region's
// buckets are split evenly among its nodes). Any other error is left to
// the follow loop, which retries.
func (d *nodeDemands) readable(ctx context.Context) bool {
	cctx, cancel := context.WithTimeout(ctx, d.s.requestTimeout())
	_, err := d.s.cfg.Client.Get(cctx, d.prefix(), clientv3.WithPrefix(), clientv3.WithLimit(1), clientv3.WithKeysOnly())
	cancel()
	if errors.Is(err, rpctypes.ErrPermissionDenied) {
		d.s.log.Info("this node's etcd credential cannot read its region's demand reports: node leases and RLQS assignments split the region's buckets evenly among its nodes")
		return false
	}
	return ctx.Err() == nil
}

func (d *nodeDemands) prefix() string { return d.s.cfg.Layout.DemandPrefix() + d.s.cfg.Region + "/" }

func (d *nodeDemands) snapshot(kvs []*mvccpb.KeyValue) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.nodes = make(map[string]map[etcdlayout.DemandShardID]map[string]map[string]float64)
	for _, kv := range kvs {
		d.put(kv)
	}
}

func (d *nodeDemands) events(evs []*clientv3.Event) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, ev := range evs {
		if ev.Type == clientv3.EventTypeDelete {
			_, node, shard, err := etcdlayout.DemandShardOf(d.s.cfg.Layout.DemandPrefix(), string(ev.Kv.Key))
			if err != nil {
				continue
			}
			if shards := d.nodes[node]; shards != nil {
				delete(shards, shard)
				if len(shards) == 0 {
					delete(d.nodes, node)
				}
			}
			continue
		}
		d.put(ev.Kv)
	}
}

// put replaces the shard stored at kv; d.mu is held. A record that does
// not decode is skipped (the coordinator logs it).
func (d *nodeDemands) put(kv *mvccpb.KeyValue) {
	_, node, shard, rep, err := d.s.cfg.Layout.DecodeDemand(string(kv.Key), kv.Value)
	if err != nil {
		return
	}
	shards := d.nodes[node]
	if shards == nil {
		if len(d.nodes) >= d.s.cfg.MaxPolicies {
			return
		}
		shards = make(map[etcdlayout.DemandShardID]map[string]map[string]float64)
		d.nodes[node] = shards
	}
	byPolicy := make(map[string]map[string]float64, min(len(rep.Policies), d.s.cfg.MaxPolicies))
	for p, pd := range rep.Policies {
		if len(pd.Pressured) == 0 || len(byPolicy) >= d.s.cfg.MaxPolicies {
			continue
		}
		subjects := make(map[string]float64, min(len(pd.Pressured), maxDemandSubjects))
		for _, sd := range pd.Pressured {
			if len(subjects) >= maxDemandSubjects {
				break
			}
			if sd.Offered > 0 && !math.IsInf(sd.Offered, 0) {
				subjects[sd.Subject] = sd.Offered
			}
		}
		byPolicy[p] = subjects
	}
	shards[shard] = byPolicy
}
