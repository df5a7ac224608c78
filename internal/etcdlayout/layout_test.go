package etcdlayout

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
)

func TestKeys(t *testing.T) {
	for _, c := range []struct {
		got, want string
	}{
		{Layout{}.Node("eu", "n-1"), "/quota/v1/regions/eu/n-1"},
		{Layout{Prefix: "/x"}.Node("eu", "n-1"), "/x/regions/eu/n-1"},
		{Layout{}.RegionNodes("eu"), "/quota/v1/regions/eu/"},
		{Layout{}.DemandShard("eu", "n-1", 10), "/quota/v1/demand/eu/n-1/00a"},
		{Layout{}.DemandShard("eu", "n-1", DemandShards-1), "/quota/v1/demand/eu/n-1/fff"},
		{Layout{}.DemandRecord("eu", "n-1", DemandShardID{Shard: 10, Of: LegacyDemandShards}), "/quota/v1/demand/eu/n-1/0a"},
		{Layout{}.AckShard("eu", "n-1", 255), "/quota/v1/acks/eu/n-1/ff"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

func TestNodeOf(t *testing.T) {
	var l Layout
	for _, c := range []struct {
		key          string
		region, node string
		ok           bool
	}{
		{l.Node("eu", "n-1"), "eu", "n-1", true},
		{l.RegionsPrefix() + "eu", "", "", false},                       // a region without a node
		{l.AcksPrefix() + "eu/host.a_b-C9", "eu", "host.a_b-C9", false}, // not below the regions prefix
		{l.RegionsPrefix() + "eu/", "", "", false},
		{l.RegionsPrefix() + "eu/n/x", "", "", false},
		{l.RegionsPrefix() + "e u/n", "", "", false},
		{l.RegionsPrefix(), "", "", false},
		{"/other/regions/eu/n", "", "", false},
	} {
		r, n, ok := NodeOf(l.RegionsPrefix(), c.key)
		if ok != c.ok || ok && (r != c.region || n != c.node) {
			t.Errorf("NodeOf(%q) = %q, %q, %v; want %q, %q, %v", c.key, r, n, ok, c.region, c.node, c.ok)
		}
	}
}

func TestValidName(t *testing.T) {
	long := make([]byte, MaxNameLen+1)
	for i := range long {
		long[i] = 'a'
	}
	for _, c := range []struct {
		s  string
		ok bool
	}{
		{"eu-west-1", true}, {"node_1.example", true}, {string(long[:MaxNameLen]), true},
		{"", false}, {string(long), false}, {"a/b", false}, {"a b", false}, {"ü", false},
	} {
		if got := ValidName(c.s); got != c.ok {
			t.Errorf("ValidName(%q) = %v, want %v", c.s, got, c.ok)
		}
	}
}

func TestShardOf(t *testing.T) {
	var l Layout
	s := PolicyShard("exports")
	if s < 0 || s >= Shards || PolicyShard("exports") != s {
		t.Fatalf("PolicyShard(exports) = %d", s)
	}
	for _, c := range []struct {
		key          string
		region, node string
		shard        int
		err          error
	}{
		{l.AckShard("eu", "n-1", s), "eu", "n-1", s, nil},
		{l.AckShard("eu", "n-1", Shards-1), "eu", "n-1", Shards - 1, nil},
		{l.AcksPrefix() + "eu/n-1", "eu", "n-1", 0, ErrOldFormat},
		{l.AcksPrefix() + "eu/n-1/100", "", "", 0, ErrRecord},
		{l.AcksPrefix() + "eu/n-1/0a/x", "", "", 0, ErrRecord},
		{l.AcksPrefix() + "eu/n-1/A", "", "", 0, ErrRecord},
		{l.AcksPrefix() + "eu/n-1/0A", "", "", 0, ErrRecord},
		{l.AcksPrefix() + "eu", "", "", 0, ErrRecord},
		{l.AcksPrefix() + "e u/n/00", "", "", 0, ErrRecord},
	} {
		r, n, sh, err := ShardOf(l.AcksPrefix(), c.key)
		if !errors.Is(err, c.err) || r != c.region || n != c.node || sh != c.shard {
			t.Errorf("ShardOf(%q) = %q, %q, %d, %v; want %q, %q, %d, %v", c.key, r, n, sh, err, c.region, c.node, c.shard, c.err)
		}
	}
}

// TestDemandShardOf: a demand key of three hex digits names a record of
// the current layout, of two a record of the legacy 256-record layout;
// the one-record format is ErrOldFormat and anything else ErrRecord.
func TestDemandShardOf(t *testing.T) {
	var l Layout
	cur := func(s int) DemandShardID { return DemandShardID{Shard: s, Of: DemandShards} }
	old := func(s int) DemandShardID { return DemandShardID{Shard: s, Of: LegacyDemandShards} }
	for _, c := range []struct {
		key          string
		region, node string
		id           DemandShardID
		err          error
	}{
		{l.DemandShard("eu", "n-1", 0), "eu", "n-1", cur(0), nil},
		{l.DemandShard("eu", "n-1", 0xabc), "eu", "n-1", cur(0xabc), nil},
		{l.DemandShard("eu", "n-1", DemandShards-1), "eu", "n-1", cur(DemandShards - 1), nil},
		{l.DemandPrefix() + "eu/n-1/0a", "eu", "n-1", old(10), nil},
		{l.DemandPrefix() + "eu/n-1/ff", "eu", "n-1", old(255), nil},
		{l.DemandPrefix() + "eu/n-1", "eu", "n-1", DemandShardID{}, ErrOldFormat},
		{l.DemandPrefix() + "eu/n-1/1000", "", "", DemandShardID{}, ErrRecord},
		{l.DemandPrefix() + "eu/n-1/0fff", "", "", DemandShardID{}, ErrRecord},
		{l.DemandPrefix() + "eu/n-1/a", "", "", DemandShardID{}, ErrRecord},
		{l.DemandPrefix() + "eu/n-1/ABC", "", "", DemandShardID{}, ErrRecord},
		{l.DemandPrefix() + "eu/n-1/", "", "", DemandShardID{}, ErrRecord},
		{l.DemandPrefix() + "eu/n-1/00a/x", "", "", DemandShardID{}, ErrRecord},
		{l.DemandPrefix() + "e u/n/000", "", "", DemandShardID{}, ErrRecord},
	} {
		r, n, id, err := DemandShardOf(l.DemandPrefix(), c.key)
		if !errors.Is(err, c.err) || r != c.region || n != c.node || id != c.id {
			t.Errorf("DemandShardOf(%q) = %q, %q, %+v, %v; want %q, %q, %+v, %v", c.key, r, n, id, err, c.region, c.node, c.id, c.err)
		}
	}
}

// TestSplitAndMergeDemand: a report split into records of the current
// layout decodes back whole, each record holding only its own policies;
// a record holding another record's policy is refused, in either
// layout; and merging a node's records in both layouts, in any order,
// takes each policy from its current record where one holds it.
func TestSplitAndMergeDemand(t *testing.T) {
	var l Layout
	d := DemandReport{Region: "eu", Node: "n", IntervalSeconds: 1, Policies: map[string]PolicyDemand{}}
	for i := range 10000 {
		d.Policies[fmt.Sprintf("policy-%d", i)] = PolicyDemand{Offered: float64(i)}
	}
	shards := SplitDemand(d)
	if len(shards) < DemandShards*9/10 {
		t.Fatalf("10,000 policies in %d of %d records: the hash does not spread", len(shards), DemandShards)
	}
	most := 0
	var merged *DemandReport
	for s, sh := range shards {
		most = max(most, len(sh.Policies))
		b, _ := json.Marshal(sh)
		_, _, id, dec, err := l.DecodeDemand(l.DemandShard("eu", "n", s), b)
		if err != nil || id != (DemandShardID{Shard: s, Of: DemandShards}) {
			t.Fatalf("record %03x: %+v, %v", s, id, err)
		}
		merged = MergeDemand(merged, id, dec)
	}
	if most > 16 || !maps.Equal(policyRates(merged.Policies), policyRates(d.Policies)) {
		t.Fatalf("merged records differ from the report, or a record holds %d policies", most)
	}
	p := "policy-1"
	b, _ := json.Marshal(shards[PolicyDemandShard(p)])
	if _, _, _, _, err := l.DecodeDemand(l.DemandShard("eu", "n", (PolicyDemandShard(p)+1)%DemandShards), b); !errors.Is(err, ErrRecord) {
		t.Fatalf("demand at another record: %v", err)
	}
	if _, _, _, _, err := l.DecodeDemand(l.DemandRecord("eu", "n", DemandShardID{Shard: (PolicyShard(p) + 1) % LegacyDemandShards, Of: LegacyDemandShards}), b); !errors.Is(err, ErrRecord) {
		t.Fatalf("demand at another legacy record: %v", err)
	}

	cur := DemandReport{Policies: map[string]PolicyDemand{p: {Offered: 5}}}
	old := DemandReport{Policies: map[string]PolicyDemand{p: {Offered: 7}, "policy-2": {Offered: 2}}}
	curID := DemandShardsOf(p)[0]
	oldID := DemandShardsOf(p)[1]
	if curID != (DemandShardID{Shard: PolicyDemandShard(p), Of: DemandShards}) || oldID != (DemandShardID{Shard: PolicyShard(p), Of: LegacyDemandShards}) {
		t.Fatalf("DemandShardsOf(%s) = %+v, want the current record first, then the legacy one", p, DemandShardsOf(p))
	}
	for _, order := range [][]bool{{true, false}, {false, true}} {
		var m *DemandReport
		for _, current := range order {
			if current {
				m = MergeDemand(m, curID, cur)
			} else {
				m = MergeDemand(m, oldID, old)
			}
		}
		if m.Policies[p].Offered != 5 || m.Policies["policy-2"].Offered != 2 {
			t.Errorf("merged current first %v: %v, want %s from the current record and policy-2 from the legacy one", order[0], m.Policies, p)
		}
	}
}

// policyRates is each policy's offered rate, comparable with maps.Equal.
func policyRates(ps map[string]PolicyDemand) map[string]float64 {
	out := make(map[string]float64, len(ps))
	for p, d := range ps {
		out[p] = d.Offered
	}
	return out
}

func TestSplitAndMergeAck(t *testing.T) {
	var l Layout
	a := Ack{Region: "eu", Node: "n", Epochs: map[string]uint64{}}
	for i := range 1000 {
		a.Epochs[fmt.Sprintf("policy-%d", i)] = uint64(i + 1)
	}
	shards := SplitAck(a)
	if len(shards) < Shards/2 {
		t.Fatalf("1000 policies in %d shards: the hash does not spread", len(shards))
	}
	var merged *Ack
	for s, sh := range shards {
		b, _ := json.Marshal(sh)
		_, _, got, dec, err := l.DecodeAck(l.AckShard("eu", "n", s), b)
		if err != nil || got != s {
			t.Fatalf("shard %d: %v", s, err)
		}
		merged = MergeAck(merged, dec)
	}
	if !maps.Equal(merged.Epochs, a.Epochs) {
		t.Fatalf("merged shards differ from the acknowledgement")
	}
	// A record at the wrong shard is refused: it would stand for epochs
	// of policies its shard does not hold.
	b, _ := json.Marshal(shards[PolicyShard("policy-1")])
	if _, _, _, _, err := l.DecodeAck(l.AckShard("eu", "n", (PolicyShard("policy-1")+1)%Shards), b); !errors.Is(err, ErrRecord) {
		t.Fatalf("ack at another shard: %v", err)
	}
}

func TestBatches(t *testing.T) {
	for _, c := range []struct {
		sizes []int
		want  []int
	}{
		{nil, nil},
		{[]int{1, 1, 1, 1, 1}, []int{2, 4, 5}},
		{[]int{5, 2, 1}, []int{1, 3}},
		{[]int{20, 1}, []int{1, 2}},
		{[]int{3, 3, 4}, []int{2, 3}},
	} {
		if got := Batches(c.sizes, 2, 6); !slices.Equal(got, c.want) {
			t.Errorf("Batches(%v) = %v, want %v", c.sizes, got, c.want)
		}
	}
}
