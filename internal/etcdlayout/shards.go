package etcdlayout

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"strconv"
	"strings"
)

// Shards is how many records one node's acknowledgement is split into,
// by PolicyShard (two hex digits in the key); a node keeps its table of
// shares by the same shards. A policy always falls in the same shard, so
// a node rewrites only the shards whose epochs changed. An
// acknowledgement holds one epoch per policy, so even at 10,000 policies a
// shard is about 1 KiB.
const Shards = 256

// DemandShards is how many records one node's demand report is split
// into, by PolicyDemandShard (three hex digits in the key). A demand
// record is rewritten whenever the demand of one policy in it moves
// (DemandMoved), and a policy's demand is tens of times larger than its
// epoch (rates and up to 32 pressured subjects), so demand is sharded
// sixteen times finer than acknowledgements: at 10,000 policies a record
// holds about 2.7 policies (about 1 KiB with 4 pressured subjects, 6 KiB
// with 32), and one policy whose demand moves costs its node one such
// record, not a record of 39 policies. A node writes at most DemandShards
// demand records (only the non-empty ones: fewer than its policies when
// it holds fewer than DemandShards).
const DemandShards = 4096

// LegacyDemandShards is the demand layout before DemandShards: Shards
// records by PolicyShard, two hex digits in the key. Readers accept it
// during a rolling upgrade (DemandIn counts a node that has records in
// both layouts once); nodes write only the current layout.
const LegacyDemandShards = Shards

// DemandShardID names one demand record of a node: shard Shard of a
// layout of Of records, DemandShards, or LegacyDemandShards for a record
// of a node not yet upgraded. Keys tell the layouts apart: three hex
// digits for DemandShards, two for LegacyDemandShards.
type DemandShardID struct{ Shard, Of int }

// policyHash is FNV-1a of policy's name, which every shard of it is
// taken from.
func policyHash(policy string) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(policy))
	return h.Sum32()
}

// PolicyShard is the shard of policy's acknowledgement (and of a legacy
// demand record): FNV-1a of the name modulo Shards.
func PolicyShard(policy string) int { return int(policyHash(policy) % Shards) }

// PolicyDemandShard is the shard of policy's demand: FNV-1a of the name
// modulo DemandShards.
func PolicyDemandShard(policy string) int { return int(policyHash(policy) % DemandShards) }

// Holds says policy's demand belongs in record id.
func (id DemandShardID) Holds(policy string) bool {
	return id.Of > 0 && int(policyHash(policy)%uint32(id.Of)) == id.Shard
}

// DemandShardsOf returns the records of one node that may hold policy's
// demand, in the order a reader takes them (DemandIn): the current
// layout's, then the legacy layout's.
func DemandShardsOf(policy string) [2]DemandShardID {
	h := policyHash(policy)
	return [2]DemandShardID{{Shard: int(h % DemandShards), Of: DemandShards}, {Shard: int(h % LegacyDemandShards), Of: LegacyDemandShards}}
}

// DemandIn returns policy's demand at one node whose demand records, by
// DemandShardID, are shards: taken from the first of ids, which is
// DemandShardsOf(policy) (computed once by a caller that asks many
// nodes), that holds it. A node caught in a rolling upgrade, its old
// process's legacy records not yet ended with their lease and its new
// process's records written, is so counted once, by its current records
// wherever they hold the policy.
func DemandIn[V any](shards map[DemandShardID]map[string]V, ids [2]DemandShardID, policy string) (v V, ok bool) {
	for _, id := range ids {
		if v, ok = shards[id][policy]; ok {
			return v, true
		}
	}
	return v, false
}

// shardName is the last key element of acknowledgement shard shard: two
// hex digits.
func shardName(shard int) string { return fmt.Sprintf("%02x", shard) }

// name is the last key element of demand record id: three hex digits in
// the current layout, two in the legacy one.
func (id DemandShardID) name() string {
	if id.Of == LegacyDemandShards {
		return shardName(id.Shard)
	}
	return fmt.Sprintf("%03x", id.Shard)
}

// NodeDemands is the prefix of one node's demand shards,
// demand/{region}/{node}/.
func (l Layout) NodeDemands(region, node string) string {
	return l.DemandPrefix() + region + "/" + node + "/"
}

// DemandShard is the key of one shard of a node's demand report in the
// current layout, demand/{region}/{node}/{shard} with three hex digits.
func (l Layout) DemandShard(region, node string, shard int) string {
	return l.DemandRecord(region, node, DemandShardID{Shard: shard, Of: DemandShards})
}

// DemandRecord is the key of a node's demand record id in its layout
// (DemandShard for the current one).
func (l Layout) DemandRecord(region, node string, id DemandShardID) string {
	return l.NodeDemands(region, node) + id.name()
}

// NodeAcks is the prefix of one node's acknowledgement shards,
// acks/{region}/{node}/.
func (l Layout) NodeAcks(region, node string) string {
	return l.AcksPrefix() + region + "/" + node + "/"
}

// AckShard is the key of one shard of a node's acknowledgement,
// acks/{region}/{node}/{shard}.
func (l Layout) AckShard(region, node string, shard int) string {
	return l.NodeAcks(region, node) + shardName(shard)
}

// ErrRecord says a demand or acknowledgement record cannot be used.
var ErrRecord = errors.New("etcdlayout: unusable record")

// ErrOldFormat says a node wrote its whole demand report or
// acknowledgement as one record at {prefix}{region}/{node}, the format
// before records were sharded. Such a node is not counted: its
// acknowledgements never arrive (growth waits for it until the
// acknowledgement deadline) and its demand is left out. Upgrade it.
var ErrOldFormat = fmt.Errorf("%w: one record per node (the format before shards; upgrade the node)", ErrRecord)

// ShardOf splits an acknowledgement shard key below prefix (AcksPrefix),
// {prefix}{region}/{node}/{shard}, into region, node and shard. A key of
// the unsharded format, {prefix}{region}/{node}, returns region and node
// with ErrOldFormat; any other key ErrRecord. Demand keys have their own
// layouts (DemandShardOf).
func ShardOf(prefix, key string) (region, node string, shard int, err error) {
	region, node, last, err := splitShardKey(prefix, key)
	if err != nil {
		return region, node, 0, err
	}
	s, perr := strconv.ParseUint(last, 16, 16)
	if perr != nil || s >= Shards || last != shardName(int(s)) {
		return "", "", 0, fmt.Errorf("%w: key %q: want %s{region}/{node}/{shard}, shard 00 to %02x", ErrRecord, key, prefix, Shards-1)
	}
	return region, node, int(s), nil
}

// DemandShardOf splits a demand record key below prefix (DemandPrefix),
// {prefix}{region}/{node}/{shard}, into region, node and the record: three
// hex digits name a record of the current layout (000 to fff of
// DemandShards), two a record of the legacy one (00 to ff of
// LegacyDemandShards). A key of the unsharded format returns region and
// node with ErrOldFormat; any other key ErrRecord.
func DemandShardOf(prefix, key string) (region, node string, id DemandShardID, err error) {
	region, node, last, err := splitShardKey(prefix, key)
	if err != nil {
		return region, node, id, err
	}
	of := DemandShards
	if len(last) == 2 {
		of = LegacyDemandShards
	}
	s, perr := strconv.ParseUint(last, 16, 16)
	id = DemandShardID{Shard: int(s), Of: of}
	if perr != nil || int(s) >= of || last != id.name() {
		return "", "", DemandShardID{}, fmt.Errorf("%w: key %q: want %s{region}/{node}/{shard}, shard 000 to %03x (or 00 to %02x, the layout before)",
			ErrRecord, key, prefix, DemandShards-1, LegacyDemandShards-1)
	}
	return region, node, id, nil
}

// splitShardKey splits {prefix}{region}/{node}/{last} (ShardOf,
// DemandShardOf); {prefix}{region}/{node} returns ErrOldFormat.
func splitShardKey(prefix, key string) (region, node, last string, err error) {
	parts := strings.Split(Name(prefix, key), "/")
	if len(parts) < 2 || !ValidName(parts[0]) || !ValidName(parts[1]) {
		return "", "", "", fmt.Errorf("%w: key %q: want %s{region}/{node}/{shard}", ErrRecord, key, prefix)
	}
	region, node = parts[0], parts[1]
	switch len(parts) {
	case 2:
		return region, node, "", fmt.Errorf("key %q of %s/%s: %w", key, region, node, ErrOldFormat)
	case 3:
		return region, node, parts[2], nil
	}
	return "", "", "", fmt.Errorf("%w: key %q: want %s{region}/{node}/{shard}", ErrRecord, key, prefix)
}

// DecodeAck reads the acknowledgement shard stored at key (below
// AcksPrefix). It fails when a policy in it does not belong to the shard:
// merging such a record could let it stand for another shard's epochs.
func (l Layout) DecodeAck(key string, value []byte) (region, node string, shard int, a Ack, err error) {
	if region, node, shard, err = ShardOf(l.AcksPrefix(), key); err != nil {
		return region, node, shard, a, err
	}
	if err = json.Unmarshal(value, &a); err != nil {
		return region, node, shard, a, fmt.Errorf("%w: %s: %w", ErrRecord, key, err)
	}
	for p := range a.Epochs {
		if PolicyShard(p) != shard {
			return region, node, shard, Ack{}, fmt.Errorf("%w: %s holds policy %q of shard %02x", ErrRecord, key, p, PolicyShard(p))
		}
	}
	return region, node, shard, a, nil
}

// DecodeDemand reads the demand record stored at key (below
// DemandPrefix), in either layout (DemandShardOf), checking like
// DecodeAck that every policy belongs to the record.
func (l Layout) DecodeDemand(key string, value []byte) (region, node string, id DemandShardID, d DemandReport, err error) {
	if region, node, id, err = DemandShardOf(l.DemandPrefix(), key); err != nil {
		return region, node, id, d, err
	}
	if err = json.Unmarshal(value, &d); err != nil {
		return region, node, id, d, fmt.Errorf("%w: %s: %w", ErrRecord, key, err)
	}
	for p := range d.Policies {
		if !id.Holds(p) {
			return region, node, id, DemandReport{}, fmt.Errorf("%w: %s holds policy %q of shard %03x", ErrRecord, key, p, PolicyDemandShard(p))
		}
	}
	return region, node, id, d, nil
}

// MergeAck adds one shard's epochs to a node's acknowledgement a (made
// when nil) and returns it. Shards hold disjoint policies.
func MergeAck(a *Ack, shard Ack) *Ack {
	if a == nil {
		a = &Ack{Region: shard.Region, Node: shard.Node, Epochs: make(map[string]uint64, len(shard.Epochs))}
	}
	if a.Epochs == nil {
		a.Epochs = make(map[string]uint64, len(shard.Epochs))
	}
	for p, e := range shard.Epochs {
		a.Epochs[p] = e
	}
	if shard.At.After(a.At) {
		a.At = shard.At
	}
	return a
}

// MergeDemand adds record id's policies to a node's demand report d
// (made when nil) and returns it. Records of one layout hold disjoint
// policies; a policy of a legacy record never replaces one merged
// already, so that, whatever the order, a node with records in both
// layouts reports each policy as DemandIn takes it.
func MergeDemand(d *DemandReport, id DemandShardID, shard DemandReport) *DemandReport {
	if d == nil {
		d = &DemandReport{Region: shard.Region, Node: shard.Node, At: shard.At, IntervalSeconds: shard.IntervalSeconds}
	}
	if d.Policies == nil {
		d.Policies = make(map[string]PolicyDemand, len(shard.Policies))
	}
	for p, pd := range shard.Policies {
		if _, merged := d.Policies[p]; merged && id.Of == LegacyDemandShards {
			continue
		}
		d.Policies[p] = pd
	}
	if shard.At.After(d.At) {
		d.At, d.IntervalSeconds = shard.At, shard.IntervalSeconds
	}
	return d
}

// SplitAck splits a node's acknowledgement into its non-empty shards.
func SplitAck(a Ack) map[int]Ack {
	out := map[int]Ack{}
	for p, e := range a.Epochs {
		s := PolicyShard(p)
		sh, ok := out[s]
		if !ok {
			sh = Ack{Region: a.Region, Node: a.Node, At: a.At, Epochs: map[string]uint64{}}
		}
		sh.Epochs[p] = e
		out[s] = sh
	}
	return out
}

// SplitDemand splits a node's demand report into its non-empty records of
// the current layout, by PolicyDemandShard.
func SplitDemand(d DemandReport) map[int]DemandReport {
	out := map[int]DemandReport{}
	for p, pd := range d.Policies {
		s := PolicyDemandShard(p)
		sh, ok := out[s]
		if !ok {
			sh = DemandReport{Region: d.Region, Node: d.Node, At: d.At, IntervalSeconds: d.IntervalSeconds, Policies: map[string]PolicyDemand{}}
		}
		sh.Policies[p] = pd
		out[s] = sh
	}
	return out
}

// DemandTolerance is how far, relative to the larger of the two, a
// reported rate may move before it counts as moved (DemandMoved): a node
// rewrites the demand shard that holds it, and the leader plans its
// policy again. The leader then plans on rates at most 5% off what the
// node measured, about the noise of a rate counted over one report
// interval (and halved again by the planner's smoothing); in exchange the
// bytes a node writes and the policies a round plans follow the policies
// whose demand moved, not all of them.
const DemandTolerance = 0.05

// DemandMoved says one policy's demand moved past DemandTolerance from
// old to new: a pressured subject came, went or changed whether it was
// denied, or a rate moved by more than the tolerance.
func DemandMoved(old, new PolicyDemand) bool {
	if moved(old.Offered, new.Offered) || moved(old.Admitted, new.Admitted) || len(old.Pressured) != len(new.Pressured) {
		return true
	}
	for i, ns := range new.Pressured {
		os := old.Pressured[i]
		if os.Subject != ns.Subject || os.Denied != ns.Denied || moved(os.Offered, ns.Offered) || moved(os.Admitted, ns.Admitted) {
			return true
		}
	}
	return false
}

// moved says rate b is more than DemandTolerance away from a.
func moved(a, b float64) bool {
	return math.Abs(a-b) > DemandTolerance*math.Max(math.Abs(a), math.Abs(b)) || math.IsNaN(a) != math.IsNaN(b)
}
