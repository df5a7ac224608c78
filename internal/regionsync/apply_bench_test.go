package regionsync

import (
	"encoding/json"
	"runtime"
	"strconv"
	"testing"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/quotacoord/quota/internal/etcdlayout"
)

// holding returns an unstarted Syncer that applied an allocation of each
// of policies policies, and the event that gives policy 7 epoch epoch.
func holding(tb testing.TB, policies int) (*Syncer, func(epoch uint64) *clientv3.Event) {
	tb.Helper()
	s, err := New(Config{Region: "eu", Client: &clientv3.Client{}, MaxPolicies: policies})
	if err != nil {
		tb.Fatal(err)
	}
	var ly etcdlayout.Layout
	value := func(p string, epoch uint64) []byte {
		raw, _ := json.Marshal(alloc(p, epoch, map[string]float64{"eu": 0.5, "us": 0.5}, map[string]float64{"eu": 0.1, "us": 0.1}, nil))
		return raw
	}
	kvs := make([]*mvccpb.KeyValue, policies)
	for i := range kvs {
		kvs[i] = &mvccpb.KeyValue{Key: []byte(ly.Alloc(policyName(i))), Value: value(policyName(i), 1)}
	}
	s.applyAllocSnapshot(kvs)
	return s, func(epoch uint64) *clientv3.Event {
		return &clientv3.Event{Type: clientv3.EventTypePut, Kv: &mvccpb.KeyValue{Key: kvs[7].Key, Value: value(policyName(7), epoch)}}
	}
}

// TestApplyOneAllocationCopiesLittle: with 10,000 policies held, applying
// one policy's new epoch allocates a small part of what the policies take
// (the shard it falls in, not a copy of every policy's entry).
func TestApplyOneAllocationCopiesLittle(t *testing.T) {
	s, event := holding(t, 10000)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	const applies = 10
	for i := range applies {
		s.applyAllocEvents([]*clientv3.Event{event(uint64(i + 2))})
	}
	runtime.ReadMemStats(&after)
	if per := (after.TotalAlloc - before.TotalAlloc) / applies; per > 64<<10 {
		t.Fatalf("one allocation applied over 10,000 held allocated %d KiB, want at most 64 KiB", per>>10)
	}
	if e, _ := s.Epoch(policyName(7)); e != applies+1 {
		t.Fatalf("epoch of %s = %d, want %d", policyName(7), e, applies+1)
	}
}

// BenchmarkApplyOneAllocation: a node holding 1,000 or 10,000 policies
// applies one policy's new epoch from the allocation watch and works out
// which acknowledgement shards changed, as the ack loop does before
// writing. The cost should not grow with the policies held.
func BenchmarkApplyOneAllocation(b *testing.B) {
	for _, policies := range []int{1000, 10000} {
		b.Run(strconv.Itoa(policies), func(b *testing.B) {
			s, event := holding(b, policies)
			written := s.ackShards(s.tab.Load())
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				s.applyAllocEvents([]*clientv3.Event{event(uint64(i + 2))})
				changed := 0
				for sh, a := range s.ackShards(s.tab.Load()) {
					if ackChanged(written[sh], a) {
						written[sh] = a
						changed++
					}
				}
				if changed != 1 {
					b.Fatalf("%d acknowledgement shards changed, want 1", changed)
				}
			}
		})
	}
}
