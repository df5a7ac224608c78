package rebalance

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/hashicorp/go-hclog"
	"github.com/quotacoord/quota/allocator"
	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/policy"
	"github.com/quotacoord/quota/plan"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// mirror is the leader's copy of every record a round reads, each decoded
// once: filled by one read of everything (load), then kept by the events
// of one watch of the deployment's prefix (apply), so that a round reads
// nothing from etcd. A round's snapshot of it is what a read at the
// mirror's revision would have returned: read itself is a mirror filled by
// one read. Its size is bounded like a read: by MaxNodes,
// MaxNodesPerRegion and allocator.MaxRegions for what nodes write; a
// record past a bound is left out and the mirror marked dropped, after
// which every round reads afresh (what was left out depends on the order
// records arrived in, and a read keeps the first in key order).
type mirror struct {
	ly  etcdlayout.Layout
	log hclog.Logger
	// rev is the revision the copy stands at: every event up to it is in.
	// read is the revision of the read that filled it: events up to it
	// were in the read.
	rev, read int64
	// tooMany is set while registrations are over a bound
	// (ErrTooManyRegistrations); dropped while a node's record or a
	// retired region was left out over a bound.
	tooMany error
	dropped bool

	nodes  map[string]map[string]string // region → node → fingerprint
	nnodes int
	demand map[string]*regionDemand
	acks   map[string]map[string]*nodeAcks // region → node
	// nacks and ndemand count the nodes with a record in acks and demand.
	nacks, ndemand int

	controls  map[string]etcdlayout.Control
	docs      map[string]storedDoc
	policies  *policy.Set
	polErrs   []error
	docsDirty bool
	allocs    map[string]*etcdlayout.Allocation
	allocRevs map[string]int64
	retired   map[string]bool
	behind    map[string]plan.Behind
	// ackMoved names the policies whose acknowledgements changed, or
	// every policy after a registration changed, until the metrics look
	// (snapshot.ackMoved); every policy at first.
	ackMoved *dirtySet
}

// storedDoc is one policy document as stored.
type storedDoc struct {
	value []byte
	rev   int64
}

// regionDemand is one region's demand: each node's demand records, and
// their sum per policy (plan.SumPolicyDemand), summed again for the
// policies in stale only. A node holds at most DemandShards +
// LegacyDemandShards records (etcdlayout.DemandShardOf accepts no other
// key), in either layout; its demand for a policy is taken as
// etcdlayout.DemandIn takes it, so a node caught in a rolling upgrade is
// counted once.
type regionDemand struct {
	nodes map[string]map[etcdlayout.DemandShardID]map[string]plan.PolicyDemand // node → record → policy
	// order is the nodes in name order, the order their demand is summed
	// in (nil when a node came or went).
	order []string
	sum   map[string]plan.PolicyDemand
	stale map[string]bool
}

// nodeAcks is one node's acknowledgement: its shards, and the epochs of
// them all (nil when a shard changed since). A merged map is never
// changed once made, as a plan.Leader keeps it (plan.Node.Acked).
type nodeAcks struct {
	shards map[int]map[string]uint64
	merged map[string]uint64
}

func newMirror(ly etcdlayout.Layout, log hclog.Logger) *mirror {
	return &mirror{
		ly: ly, log: log,
		nodes: map[string]map[string]string{}, demand: map[string]*regionDemand{}, acks: map[string]map[string]*nodeAcks{},
		controls: map[string]etcdlayout.Control{}, docs: map[string]storedDoc{}, docsDirty: true,
		allocs: map[string]*etcdlayout.Allocation{}, allocRevs: map[string]int64{},
		retired: map[string]bool{}, behind: map[string]plan.Behind{},
		ackMoved: newDirtySet(),
	}
}

// prefixes are the key prefixes a round reads, in the order load expects
// the responses of a read.
func (m *mirror) prefixes() []string {
	ly := m.ly
	return []string{ly.RegionsPrefix(), ly.DemandPrefix(), ly.AcksPrefix(), ly.ControlPrefix(), ly.PoliciesPrefix(), ly.AllocPrefix(), ly.RetiredPrefix(), ly.BehindPrefix()}
}

// load fills an empty mirror from a read of every prefix, at revision rev.
func (m *mirror) load(rev int64, kvs [][]*mvccpb.KeyValue) {
	for _, rs := range kvs {
		for _, kv := range rs {
			m.put(kv, nil, nil)
		}
	}
	m.rev, m.read = rev, rev
}

// change says what one event changed, for the loop's rounds.
type change int

const (
	changedNothing change = iota
	changedRegistration
	changedDemand
	changedAcks
	changedOther
)

// apply brings the mirror past one watch event (pre as in put) and
// marks in ds the policies whose demand (etcdlayout.DemandMoved) or
// acknowledged epochs it changed. It returns what changed and, for a
// registration or demand shard, its region. An event the mirror already
// holds (at or below the revision of the read that filled it) changes
// nothing in it, but is still told (kindOf): a node that registered and
// vanished before that read must still make its region's growth wait.
func (m *mirror) apply(ev *clientv3.Event, pre any, ds *dirtySet) (change, string) {
	if ev.Kv.ModRevision <= m.read {
		return m.kindOf(string(ev.Kv.Key))
	}
	m.rev = max(m.rev, ev.Kv.ModRevision)
	if ev.Type == clientv3.EventTypeDelete {
		return m.remove(string(ev.Kv.Key), ds)
	}
	return m.put(ev.Kv, pre, ds)
}

// kindOf is what an event of key would change, and its region, without
// changing anything.
func (m *mirror) kindOf(key string) (change, string) {
	ly := m.ly
	if region, _, ok := etcdlayout.NodeOf(ly.RegionsPrefix(), key); ok {
		return changedRegistration, region
	}
	if region, _, _, err := etcdlayout.DemandShardOf(ly.DemandPrefix(), key); err == nil {
		return changedDemand, region
	}
	if region, _, _, err := etcdlayout.ShardOf(ly.AcksPrefix(), key); err == nil {
		return changedAcks, region
	}
	return changedNothing, ""
}

// shardRecord is a demand or acknowledgement shard as decoded
// (decodeShard): epochs for an acknowledgement, demand for a demand
// report (each made when empty), or the reason it cannot be used.
type shardRecord struct {
	region, node string
	shard        int
	demandID     etcdlayout.DemandShardID
	demand       map[string]plan.PolicyDemand
	epochs       map[string]uint64
	err          error
}

// decodeShard decodes kv when it is a demand or acknowledgement shard,
// the records a round's copy holds most of: the watch's goroutine decodes
// them as they arrive (queueWatch), off the rounds. Any other record is
// decoded when applied.
func decodeShard(ly etcdlayout.Layout, kv *mvccpb.KeyValue) (rec shardRecord) {
	key := string(kv.Key)
	if len(etcdlayout.Name(ly.AcksPrefix(), key)) > 0 {
		var a etcdlayout.Ack
		rec.region, rec.node, rec.shard, a, rec.err = ly.DecodeAck(key, kv.Value)
		if rec.epochs = a.Epochs; rec.epochs == nil {
			rec.epochs = map[string]uint64{}
		}
		return rec
	}
	var d etcdlayout.DemandReport
	rec.region, rec.node, rec.demandID, d, rec.err = ly.DecodeDemand(key, kv.Value)
	if rec.demand = d.Policies; rec.demand == nil {
		rec.demand = map[string]plan.PolicyDemand{}
	}
	return rec
}

// prepareShard is what the watch's goroutine does with an event before
// the lead applies it: decode a shard put (decodeShard); nil for any
// other event.
func prepareShard(ly etcdlayout.Layout, ev *clientv3.Event) any {
	key := string(ev.Kv.Key)
	if ev.Type != clientv3.EventTypePut || len(etcdlayout.Name(ly.DemandPrefix(), key)) == 0 && len(etcdlayout.Name(ly.AcksPrefix(), key)) == 0 {
		return nil
	}
	return decodeShard(ly, ev.Kv)
}

// put stores one record, pre its decoding when the watch's goroutine
// made it (prepare); ds (nil while loading) is marked as in apply.
func (m *mirror) put(kv *mvccpb.KeyValue, pre any, ds *dirtySet) (change, string) {
	ly, key := m.ly, string(kv.Key)
	switch {
	case len(etcdlayout.Name(ly.RegionsPrefix(), key)) > 0:
		region, node, ok := etcdlayout.NodeOf(ly.RegionsPrefix(), key)
		if !ok {
			m.log.Warn("key with an invalid region or node ignored", "key", key)
			return changedNothing, ""
		}
		var v etcdlayout.Registration
		m.warn(key, json.Unmarshal(kv.Value, &v))
		m.register(region, node, v.Fingerprint)
		m.ackMoved.everything()
		return changedRegistration, region
	case len(etcdlayout.Name(ly.DemandPrefix(), key)) > 0, len(etcdlayout.Name(ly.AcksPrefix(), key)) > 0:
		rec, ok := pre.(shardRecord)
		if !ok {
			rec = decodeShard(ly, kv)
		}
		if rec.err != nil {
			m.warn(key, rec.err)
			return m.remove(key, ds)
		}
		if rec.epochs != nil {
			m.putAcks(rec.region, rec.node, rec.shard, rec.epochs, ds)
			return changedAcks, rec.region
		}
		m.putDemand(rec.region, rec.node, rec.demandID, rec.demand, ds)
		return changedDemand, rec.region
	case len(etcdlayout.Name(ly.ControlPrefix(), key)) > 0:
		// Kept even when undecodable, as far as it decoded.
		var v etcdlayout.Control
		m.warn(key, json.Unmarshal(kv.Value, &v))
		m.controls[etcdlayout.Name(ly.ControlPrefix(), key)] = v
	case len(etcdlayout.Name(ly.PoliciesPrefix(), key)) > 0:
		m.docs[etcdlayout.Name(ly.PoliciesPrefix(), key)] = storedDoc{value: kv.Value, rev: kv.ModRevision}
		m.docsDirty = true
	case len(etcdlayout.Name(ly.AllocPrefix(), key)) > 0:
		name := etcdlayout.Name(ly.AllocPrefix(), key)
		v := &etcdlayout.Allocation{}
		m.warn(key, json.Unmarshal(kv.Value, v))
		m.allocs[name], m.allocRevs[name] = v, kv.ModRevision
	case len(etcdlayout.Name(ly.RetiredPrefix(), key)) > 0:
		name := etcdlayout.Name(ly.RetiredPrefix(), key)
		switch {
		case !etcdlayout.ValidName(name) || m.retired[name]:
		case len(m.retired) >= allocator.MaxRegions:
			m.dropped = true
		default:
			m.retired[name] = true
		}
	case len(etcdlayout.Name(ly.BehindPrefix(), key)) > 0:
		// Written by leaders, which keep at most plan.MaxBehind nodes
		// (snapshot counts them).
		name := etcdlayout.Name(ly.BehindPrefix(), key)
		var v etcdlayout.Behind
		if err := json.Unmarshal(kv.Value, &v); err != nil || !etcdlayout.ValidName(name) {
			m.warn(key, err)
			delete(m.behind, name)
			break
		}
		m.behind[name] = v
	default:
		return changedNothing, ""
	}
	return changedOther, ""
}

// warn logs a record that could not be used.
func (m *mirror) warn(key string, err error) {
	switch {
	case errors.Is(err, etcdlayout.ErrOldFormat):
		m.log.Error("record of a node in the old one-record format ignored: the node is not counted (its acknowledgements never arrive, its demand is left out); upgrade it",
			"key", key, "error", err)
	case err != nil:
		m.log.Warn("unreadable record ignored", "key", key, "error", err)
	}
}

// register records a node's registration, or that registrations are over
// a bound (which no round publishes past: they cannot be dropped, as the
// plan would neither reserve the node's share nor wait for its
// acknowledgement).
func (m *mirror) register(region, node, fingerprint string) {
	ns := m.nodes[region]
	if _, ok := ns[node]; ok {
		ns[node] = fingerprint
		return
	}
	switch {
	case m.nnodes >= MaxNodes:
		m.tooMany = fmt.Errorf("%w: more than %d registered nodes", ErrTooManyRegistrations, MaxNodes)
	case ns == nil && len(m.nodes) >= allocator.MaxRegions:
		m.tooMany = fmt.Errorf("%w: more than %d registered regions", ErrTooManyRegistrations, allocator.MaxRegions)
	case len(ns) >= MaxNodesPerRegion:
		m.tooMany = fmt.Errorf("%w: region %q has more than %d registered nodes", ErrTooManyRegistrations, region, MaxNodesPerRegion)
	default:
		setIn(m.nodes, region, node, fingerprint)
		m.nnodes++
		return
	}
	m.dropped = true
}

// roomFor says whether the record of a node not yet kept may join n
// others, inRegion of them in its region: at most MaxNodes in all and
// MaxNodesPerRegion in one region. It marks the mirror dropped when not.
func (m *mirror) roomFor(n, inRegion int) bool {
	if n >= MaxNodes || inRegion >= MaxNodesPerRegion {
		m.dropped = true
		return false
	}
	return true
}

// putDemand stores one demand record of a node.
func (m *mirror) putDemand(region, node string, shard etcdlayout.DemandShardID, v map[string]plan.PolicyDemand, ds *dirtySet) {
	rd := m.demand[region]
	if rd == nil || rd.nodes[node] == nil {
		n := 0
		if rd != nil {
			n = len(rd.nodes)
		}
		if !m.roomFor(m.ndemand, n) {
			return
		}
		if rd == nil {
			rd = &regionDemand{nodes: map[string]map[etcdlayout.DemandShardID]map[string]plan.PolicyDemand{}, sum: map[string]plan.PolicyDemand{}, stale: map[string]bool{}}
			m.demand[region] = rd
		}
		rd.nodes[node] = map[etcdlayout.DemandShardID]map[string]plan.PolicyDemand{}
		rd.order = nil
		m.ndemand++
	}
	old := rd.nodes[node][shard]
	rd.nodes[node][shard] = v
	rd.staleOf(old, v)
	if ds != nil {
		markChanged(ds, old, v, func(a, b plan.PolicyDemand) bool { return !etcdlayout.DemandMoved(a, b) })
	}
}

// staleOf marks the policies of a shard before and after a change for
// summing again.
func (rd *regionDemand) staleOf(before, after map[string]plan.PolicyDemand) {
	for p := range before {
		rd.stale[p] = true
	}
	for p := range after {
		rd.stale[p] = true
	}
}

// putAcks stores one acknowledgement shard of a node.
func (m *mirror) putAcks(region, node string, shard int, v map[string]uint64, ds *dirtySet) {
	na := m.acks[region][node]
	if na == nil {
		if !m.roomFor(m.nacks, len(m.acks[region])) {
			return
		}
		na = &nodeAcks{shards: map[int]map[string]uint64{}}
		setIn(m.acks, region, node, na)
		m.nacks++
	}
	old := na.shards[shard]
	na.shards[shard], na.merged = v, nil
	m.acksChanged(ds, old, v)
}

// acksChanged marks, in ds (nil: none) and in ackMoved, the policies
// whose acknowledged epoch differs between a node's shard before and
// after.
func (m *mirror) acksChanged(ds *dirtySet, before, after map[string]uint64) {
	same := func(a, b uint64) bool { return a == b }
	if ds != nil {
		markChanged(ds, before, after, same)
	}
	markChanged(m.ackMoved, before, after, same)
}

// remove deletes the record at key, as a delete event or a value that
// no longer decodes does.
func (m *mirror) remove(key string, ds *dirtySet) (change, string) {
	ly := m.ly
	switch {
	case len(etcdlayout.Name(ly.RegionsPrefix(), key)) > 0:
		region, node, ok := etcdlayout.NodeOf(ly.RegionsPrefix(), key)
		if _, held := m.nodes[region][node]; !ok || !held {
			// A node over the bounds went: the registrations may fit
			// again, which only a read tells.
			return changedRegistration, region
		}
		delete(m.nodes[region], node)
		if len(m.nodes[region]) == 0 {
			delete(m.nodes, region)
		}
		m.nnodes--
		m.ackMoved.everything()
		return changedRegistration, region
	case len(etcdlayout.Name(ly.DemandPrefix(), key)) > 0:
		region, node, shard, err := etcdlayout.DemandShardOf(ly.DemandPrefix(), key)
		rd := m.demand[region]
		if err != nil || rd == nil || rd.nodes[node] == nil {
			return changedNothing, ""
		}
		old, ok := rd.nodes[node][shard]
		if !ok {
			return changedNothing, ""
		}
		delete(rd.nodes[node], shard)
		rd.staleOf(old, nil)
		if ds != nil {
			markChanged(ds, old, nil, func(a, b plan.PolicyDemand) bool { return !etcdlayout.DemandMoved(a, b) })
		}
		if len(rd.nodes[node]) == 0 {
			delete(rd.nodes, node)
			rd.order = nil
			m.ndemand--
			if len(rd.nodes) == 0 {
				delete(m.demand, region)
			}
		}
		return changedDemand, region
	case len(etcdlayout.Name(ly.AcksPrefix(), key)) > 0:
		region, node, shard, err := etcdlayout.ShardOf(ly.AcksPrefix(), key)
		na := m.acks[region][node]
		if err != nil || na == nil {
			return changedNothing, ""
		}
		old, ok := na.shards[shard]
		if !ok {
			return changedNothing, ""
		}
		delete(na.shards, shard)
		na.merged = nil
		m.acksChanged(ds, old, nil)
		if len(na.shards) == 0 {
			delete(m.acks[region], node)
			m.nacks--
			if len(m.acks[region]) == 0 {
				delete(m.acks, region)
			}
		}
		return changedAcks, region
	case len(etcdlayout.Name(ly.ControlPrefix(), key)) > 0:
		delete(m.controls, etcdlayout.Name(ly.ControlPrefix(), key))
	case len(etcdlayout.Name(ly.PoliciesPrefix(), key)) > 0:
		delete(m.docs, etcdlayout.Name(ly.PoliciesPrefix(), key))
		m.docsDirty = true
	case len(etcdlayout.Name(ly.AllocPrefix(), key)) > 0:
		name := etcdlayout.Name(ly.AllocPrefix(), key)
		delete(m.allocs, name)
		delete(m.allocRevs, name)
	case len(etcdlayout.Name(ly.RetiredPrefix(), key)) > 0:
		delete(m.retired, etcdlayout.Name(ly.RetiredPrefix(), key))
	case len(etcdlayout.Name(ly.BehindPrefix(), key)) > 0:
		delete(m.behind, etcdlayout.Name(ly.BehindPrefix(), key))
	default:
		return changedNothing, ""
	}
	return changedOther, ""
}

// epochs returns the node's acknowledged epochs over every shard.
func (na *nodeAcks) epochs() map[string]uint64 {
	if na.merged == nil {
		n := 0
		for _, s := range na.shards {
			n += len(s)
		}
		na.merged = make(map[string]uint64, n)
		for _, s := range na.shards {
			maps.Copy(na.merged, s)
		}
	}
	return na.merged
}

// sums returns the region's demand per policy, summing again the
// policies whose demand changed since the last call.
func (rd *regionDemand) sums() map[string]plan.PolicyDemand {
	if len(rd.stale) == 0 {
		return rd.sum
	}
	if rd.order == nil {
		rd.order = slices.Sorted(maps.Keys(rd.nodes))
	}
	var per []plan.PolicyDemand
	for p := range rd.stale {
		per = per[:0]
		ids := etcdlayout.DemandShardsOf(p)
		for _, n := range rd.order {
			if d, ok := etcdlayout.DemandIn(rd.nodes[n], ids, p); ok {
				per = append(per, d)
			}
		}
		if len(per) == 0 {
			delete(rd.sum, p)
		} else {
			rd.sum[p] = plan.SumPolicyDemand(per, MaxOverridesLimit)
		}
	}
	clear(rd.stale)
	return rd.sum
}

// snapshot returns what a round plans on, at the mirror's revision. The
// view's demand maps are the mirror's, valid until the next apply; the
// rest is the snapshot's own.
func (m *mirror) snapshot() (*snapshot, error) {
	if m.tooMany != nil {
		return nil, m.tooMany
	}
	snap := &snapshot{
		rev: m.rev,
		view: &plan.View{Regions: make(map[string]map[string]plan.Node, len(m.nodes)), Demand: map[string]map[string]plan.PolicyDemand{},
			Retired: maps.Clone(m.retired), Behind: map[string]plan.Behind{}},
		storedBehind: map[string]plan.Behind{},
		keptAcks:     map[string][]string{},
		controls:     maps.Clone(m.controls),
		allocs:       maps.Clone(m.allocs),
		allocRevs:    maps.Clone(m.allocRevs),
		docs:         len(m.docs),
		ackMoved:     m.ackMoved,
	}
	for region, ns := range m.nodes {
		live := make(map[string]plan.Node, len(ns))
		for n, fp := range ns {
			var epochs map[string]uint64
			if na := m.acks[region][n]; na != nil {
				epochs = na.epochs()
			}
			live[n] = plan.Node{Acked: epochs, Fingerprint: fp}
		}
		snap.view.Regions[region] = live
		if rd := m.demand[region]; rd != nil {
			snap.view.Demand[region] = rd.sums()
		}
	}
	behind := 0
	for _, name := range slices.Sorted(maps.Keys(m.behind)) {
		v := m.behind[name]
		if behind+len(v) > plan.MaxBehind {
			m.log.Warn("vanished nodes over the bound not counted: their region's old safe share may be released while they are away",
				"key", m.ly.Behind(name), "nodes", len(v), "bound", plan.MaxBehind)
			continue
		}
		snap.storedBehind[name] = v
		behind += len(v)
	}
	acks := make(map[string]map[string]map[string]uint64, len(m.acks))
	for region, ns := range m.acks {
		for n, na := range ns {
			if _, live := m.nodes[region][n]; !live {
				setIn(acks, region, n, na.epochs())
			}
		}
	}
	snap.keepVanished(acks)
	if m.docsDirty {
		docs := make(map[string][]byte, len(m.docs))
		for name, d := range m.docs {
			docs[name] = d.value
		}
		m.policies, m.polErrs = policy.LoadStored(docs)
		m.docsDirty = false
	}
	for _, d := range m.docs {
		snap.docsRev = max(snap.docsRev, d.rev)
	}
	snap.policies, snap.policyErrs = m.policies, m.polErrs
	return snap, nil
}
