package rebalance

import (
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/plan"
)

// BenchmarkKeptDemand is the leader's cost of nodes' demand records in
// the current 4,096-record layout and the 256-record layout before:
// 10,000 policies with 4 pressured subjects at 6 nodes of 3 regions.
// "read" decodes and keeps every record and sums every policy, as a
// read of the copy does; "turn" applies the records one turn of 100
// policies' demand rewrites at every node and sums what changed, as a
// round does. b.SetBytes is the bytes of the records read or applied.
func BenchmarkKeptDemand(b *testing.B) {
	const policies, moving = 10000, 100
	var ly etcdlayout.Layout
	nodes := [][2]string{{"r0", "n0"}, {"r0", "n1"}, {"r1", "n0"}, {"r1", "n1"}, {"r2", "n0"}, {"r2", "n1"}}
	demand := func(offered float64) plan.PolicyDemand {
		d := plan.PolicyDemand{Offered: offered, Admitted: offered}
		for s := range 4 {
			d.Pressured = append(d.Pressured, plan.SubjectDemand{Subject: "t" + strconv.Itoa(s), Offered: 200, Denied: true})
		}
		return d
	}
	// records returns every node's records in layout of, with the first
	// moving policies at offered moved; only the records holding them
	// when changedOnly.
	records := func(of int, moved float64, changedOnly bool) (kvs []*mvccpb.KeyValue, bytes int64) {
		for _, rn := range nodes {
			byID := map[etcdlayout.DemandShardID]map[string]plan.PolicyDemand{}
			changed := map[etcdlayout.DemandShardID]bool{}
			for i := range policies {
				p := "p" + strconv.Itoa(i)
				id := etcdlayout.DemandShardsOf(p)[0]
				if of == etcdlayout.LegacyDemandShards {
					id = etcdlayout.DemandShardsOf(p)[1]
				}
				if byID[id] == nil {
					byID[id] = map[string]plan.PolicyDemand{}
				}
				byID[id][p] = demand(10000)
				if i < moving {
					byID[id][p] = demand(moved)
					changed[id] = true
				}
			}
			for id, ps := range byID {
				if changedOnly && !changed[id] {
					continue
				}
				v, _ := json.Marshal(etcdlayout.DemandReport{Region: rn[0], Node: rn[1], At: time.Unix(100, 0), IntervalSeconds: 1, Policies: ps})
				kv := &mvccpb.KeyValue{Key: []byte(ly.DemandRecord(rn[0], rn[1], id)), Value: v, ModRevision: 2}
				kvs = append(kvs, kv)
				bytes += int64(len(kv.Key) + len(kv.Value))
			}
		}
		return kvs, bytes
	}
	var regs []*mvccpb.KeyValue
	for _, rn := range nodes {
		regs = append(regs, &mvccpb.KeyValue{Key: []byte(ly.Node(rn[0], rn[1])), Value: []byte("{}")})
	}
	for _, of := range []int{etcdlayout.LegacyDemandShards, etcdlayout.DemandShards} {
		all, allBytes := records(of, 1000, false)
		turn, turnBytes := records(of, 5000, true)
		b.Run("read/"+strconv.Itoa(of), func(b *testing.B) {
			b.SetBytes(allBytes)
			for b.Loop() {
				m := newMirror(ly, hclog.NewNullLogger())
				m.load(1, [][]*mvccpb.KeyValue{regs, all})
				if _, err := m.snapshot(); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("turn/"+strconv.Itoa(of), func(b *testing.B) {
			m := newMirror(ly, hclog.NewNullLogger())
			m.load(1, [][]*mvccpb.KeyValue{regs, all})
			if _, err := m.snapshot(); err != nil {
				b.Fatal(err)
			}
			evs := make([]*clientv3.Event, len(turn))
			for i, kv := range turn {
				evs[i] = &clientv3.Event{Type: clientv3.EventTypePut, Kv: kv}
			}
			b.SetBytes(turnBytes)
			rev := int64(2)
			for b.Loop() {
				ds := newDirtySet()
				ds.planned(false)
				for _, ev := range evs {
					rev++
					ev.Kv.ModRevision = rev
					m.apply(ev, prepareShard(ly, ev), ds)
				}
				if _, err := m.snapshot(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
