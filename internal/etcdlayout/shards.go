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

// Shards is how many records one node's demand report and one node's
// acknowledgement are split into. A policy always falls in the same shard
// (PolicyShard), so a node rewrites only the shards whose policies
// changed, and the largest record holds about 1/Shards of the node's
// policies: at 10,000 policies with 32 pressured subjects each, about 140
// KiB of demand, under a quarter of etcd's default request limit.
const Shards = 256

// PolicyShard is the shard of policy's demand and acknowledgement: FNV-1a
// of the name modulo Shards.
func PolicyShard(policy string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(policy))
	return int(h.Sum32() % Shards)
}

// shardName is the last key element of shard: two hex digits.
func shardName(shard int) string { return fmt.Sprintf("%02x", shard) }

// NodeDemands is the prefix of one node's demand shards,
// demand/{region}/{node}/.
func (l Layout) NodeDemands(region, node string) string {
	return l.DemandPrefix() + region + "/" + node + "/"
}

// DemandShard is the key of one shard of a node's demand report,
// demand/{region}/{node}/{shard}.
func (l Layout) DemandShard(region, node string, shard int) string {
	return l.NodeDemands(region, node) + shardName(shard)
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

// ShardOf splits a shard key below prefix (DemandPrefix or AcksPrefix),
// {prefix}{region}/{node}/{shard}, into region, node and shard. A key of
// the unsharded format, {prefix}{region}/{node}, returns region and node
// with ErrOldFormat; any other key ErrRecord.
func ShardOf(prefix, key string) (region, node string, shard int, err error) {
	parts := strings.Split(Name(prefix, key), "/")
	if len(parts) < 2 || !ValidName(parts[0]) || !ValidName(parts[1]) {
		return "", "", 0, fmt.Errorf("%w: key %q: want %s{region}/{node}/{shard}", ErrRecord, key, prefix)
	}
	region, node = parts[0], parts[1]
	if len(parts) == 2 {
		return region, node, 0, fmt.Errorf("key %q of %s/%s: %w", key, region, node, ErrOldFormat)
	}
	s, perr := strconv.ParseUint(parts[2], 16, 16)
	if len(parts) != 3 || perr != nil || s >= Shards || parts[2] != shardName(int(s)) {
		return "", "", 0, fmt.Errorf("%w: key %q: want %s{region}/{node}/{shard}, shard 00 to %02x", ErrRecord, key, prefix, Shards-1)
	}
	return region, node, int(s), nil
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

// DecodeDemand reads the demand shard stored at key (below DemandPrefix),
// checking like DecodeAck that every policy belongs to the shard.
func (l Layout) DecodeDemand(key string, value []byte) (region, node string, shard int, d DemandReport, err error) {
	if region, node, shard, err = ShardOf(l.DemandPrefix(), key); err != nil {
		return region, node, shard, d, err
	}
	if err = json.Unmarshal(value, &d); err != nil {
		return region, node, shard, d, fmt.Errorf("%w: %s: %w", ErrRecord, key, err)
	}
	for p := range d.Policies {
		if PolicyShard(p) != shard {
			return region, node, shard, DemandReport{}, fmt.Errorf("%w: %s holds policy %q of shard %02x", ErrRecord, key, p, PolicyShard(p))
		}
	}
	return region, node, shard, d, nil
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

// MergeDemand adds one shard's policies to a node's demand report d (made
// when nil) and returns it. Shards hold disjoint policies.
func MergeDemand(d *DemandReport, shard DemandReport) *DemandReport {
	if d == nil {
		d = &DemandReport{Region: shard.Region, Node: shard.Node, At: shard.At, IntervalSeconds: shard.IntervalSeconds}
	}
	if d.Policies == nil {
		d.Policies = make(map[string]PolicyDemand, len(shard.Policies))
	}
	for p, pd := range shard.Policies {
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

// SplitDemand splits a node's demand report into its non-empty shards.
func SplitDemand(d DemandReport) map[int]DemandReport {
	out := map[int]DemandReport{}
	for p, pd := range d.Policies {
		s := PolicyShard(p)
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
