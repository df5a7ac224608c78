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
		{Layout{}.DemandShard("eu", "n-1", 10), "/quota/v1/demand/eu/n-1/0a"},
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
