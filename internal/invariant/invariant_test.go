package invariant

import (
	"encoding/json"
	"fmt"
	"math"
	"testing"

	"github.com/quotacoord/quota/internal/etcdlayout"
)

type ev struct {
	key     string
	value   any
	created bool
	del     bool
}

func alloc(epoch uint64, phase etcdlayout.Phase, def map[string]float64) etcdlayout.Allocation {
	return etcdlayout.Allocation{Policy: "p", Epoch: epoch, Phase: phase, Default: def, Safe: map[string]float64{"a": 0.1, "b": 0.1}}
}

// pAck is the key of the acknowledgement shard of node that holds policy p.
func pAck(region, node string) string {
	return etcdlayout.Layout{}.AckShard(region, node, etcdlayout.PolicyShard("p"))
}

func ack(region string, epoch uint64) etcdlayout.Ack {
	return etcdlayout.Ack{Region: region, Epochs: map[string]uint64{"p": epoch}}
}

// pDoc defines policy p with a minimum share of 0.2 in every region.
const pDoc = `policies:
  - name: p
    capacity: 10
    rate: 10/second
    min_share:
      default: 0.2
`

func TestHistory(t *testing.T) {
	var l etcdlayout.Layout
	reg := func(r string) ev {
		return ev{key: l.Node(r, "n"), value: etcdlayout.Registration{Region: r}, created: true}
	}
	doc := ev{key: l.PolicyDoc("p.yaml"), value: rawDoc(pDoc)}
	ac := func(epoch uint64, def map[string]float64) etcdlayout.Allocation {
		a := alloc(epoch, etcdlayout.PhaseStable, def)
		a.Safe = map[string]float64{"a": 0.2, "c": 0.2}
		return a
	}
	even := alloc(1, etcdlayout.PhaseStable, map[string]float64{"a": 0.5, "b": 0.5})
	shrink := alloc(2, etcdlayout.PhaseShrink, map[string]float64{"a": 0.5, "b": 0.2})
	grown := alloc(3, etcdlayout.PhaseStable, map[string]float64{"a": 0.8, "b": 0.2})
	cases := []struct {
		name   string
		events []ev
		ok     bool
	}{
		{"two-step with acks", []ev{reg("a"), reg("b"), {key: l.Alloc("p"), value: even}, {key: pAck("a", "n"), value: ack("a", 1)}, {key: pAck("b", "n"), value: ack("b", 1)},
			{key: l.Alloc("p"), value: shrink}, {key: pAck("a", "n"), value: ack("a", 2)}, {key: pAck("b", "n"), value: ack("b", 2)}, {key: l.Alloc("p"), value: grown}}, true},
		{"an acknowledgement shard of another policy, written or deleted, keeps p's", []ev{reg("a"), reg("b"), {key: l.Alloc("p"), value: even}, {key: pAck("a", "n"), value: ack("a", 1)}, {key: pAck("b", "n"), value: ack("b", 1)},
			{key: l.Alloc("p"), value: shrink}, {key: pAck("a", "n"), value: ack("a", 2)}, {key: pAck("b", "n"), value: ack("b", 2)},
			{key: l.AckShard("b", "n", etcdlayout.PolicyShard("q")), value: etcdlayout.Ack{Region: "b", Epochs: map[string]uint64{"q": 1}}},
			{key: l.AckShard("b", "n", etcdlayout.PolicyShard("q")), del: true}, {key: l.Alloc("p"), value: grown}}, true},
		{"growth before b acked the shrink", []ev{reg("a"), reg("b"), {key: l.Alloc("p"), value: even}, {key: pAck("a", "n"), value: ack("a", 1)}, {key: pAck("b", "n"), value: ack("b", 1)},
			{key: l.Alloc("p"), value: shrink}, {key: pAck("a", "n"), value: ack("a", 2)}, {key: l.Alloc("p"), value: grown}}, false},
		{"b's lease expired: it counts at its safe share", []ev{reg("a"), reg("b"), {key: l.Alloc("p"), value: even}, {key: pAck("a", "n"), value: ack("a", 1)}, {key: pAck("b", "n"), value: ack("b", 1)},
			{key: l.Alloc("p"), value: shrink}, {key: pAck("a", "n"), value: ack("a", 2)}, {key: pAck("b", "n"), del: true}, {key: l.Node("b", "n"), del: true}, {key: l.Alloc("p"), value: grown}}, true},
		{"region registered late starts at the latest epoch", []ev{reg("a"), {key: l.Alloc("p"), value: alloc(1, etcdlayout.PhaseStable, map[string]float64{"a": 1})},
			{key: pAck("a", "n"), value: ack("a", 1)}, {key: l.Alloc("p"), value: alloc(2, etcdlayout.PhaseShrink, map[string]float64{"a": 0.5, "b": 0})}, {key: pAck("a", "n"), value: ack("a", 2)},
			{key: l.Alloc("p"), value: alloc(3, etcdlayout.PhaseStable, map[string]float64{"a": 0.5, "b": 0.5})}, reg("b")}, true},
		// The reliability failure: b registered (and read no allocation,
		// so it enforces p's minimum 0.2) before the first epoch, which
		// split everything between a and c.
		{"first epoch leaves out a region registered before it", []ev{doc, reg("a"), reg("c"), reg("b"),
			{key: l.Alloc("p"), value: ac(1, map[string]float64{"a": 0.5, "c": 0.5})}}, false},
		{"first epoch covers every registered region", []ev{doc, reg("a"), reg("c"), reg("b"),
			{key: l.Alloc("p"), value: alloc(1, etcdlayout.PhaseStable, map[string]float64{"a": 0.4, "b": 0.2, "c": 0.4})}}, true},
		{"region registered after the first epoch and left out enforces nothing", []ev{doc, reg("a"), reg("c"),
			{key: l.Alloc("p"), value: ac(1, map[string]float64{"a": 0.5, "c": 0.5})}, reg("b")}, true},
		{"a region that acknowledged another policy only is still before p's first epoch", []ev{doc, reg("a"), reg("c"), reg("b"),
			{key: l.AckShard("b", "n", etcdlayout.PolicyShard("q")), value: etcdlayout.Ack{Region: "b", Epochs: map[string]uint64{"q": 3}}},
			{key: l.Alloc("p"), value: ac(1, map[string]float64{"a": 0.5, "c": 0.5})}}, false},
		{"b acknowledged the first epoch: it enforces nothing of p", []ev{doc, reg("a"), reg("c"), reg("b"),
			{key: l.Alloc("p"), value: ac(1, map[string]float64{"a": 0.4, "c": 0.4})},
			{key: pAck("b", "n"), value: ack("b", 1)}, {key: l.Alloc("p"), value: ac(2, map[string]float64{"a": 0.5, "c": 0.5})}}, true},
		{"a region that died before applying the first epoch keeps its minimum", []ev{doc, reg("a"), reg("c"), reg("b"),
			{key: l.Alloc("p"), value: ac(1, map[string]float64{"a": 0.4, "c": 0.4})}, {key: l.Node("b", "n"), del: true},
			{key: l.Alloc("p"), value: ac(2, map[string]float64{"a": 0.5, "c": 0.5})}}, false},
	}
	runHistory(t, l, cases)
}

// TestHistoryLeaseEndKeepsAckFloor: a lease that ends deletes the node's
// acknowledgement before its registration (etcd deletes a lease's keys in
// key order, and acks/ sorts before regions/). The node still applied
// every epoch up to the one it acknowledged, so it falls back to that
// epoch's safe share, not to what it enforced when it registered. Here a
// registered before p's first epoch (when it enforced p's minimum, 0.2);
// an operator then lowered a's minimum to 0, a acknowledged the epochs
// that published it, and b grew into the whole budget.
func TestHistoryLeaseEndKeepsAckFloor(t *testing.T) {
	var l etcdlayout.Layout
	reg := func(r string) ev {
		return ev{key: l.Node(r, "n"), value: etcdlayout.Registration{Region: r}, created: true}
	}
	at := func(epoch uint64, phase etcdlayout.Phase, a, b, safeA float64) ev {
		al := alloc(epoch, phase, map[string]float64{"a": a, "b": b})
		al.Safe = map[string]float64{"a": safeA, "b": 0.2}
		return ev{key: l.Alloc("p"), value: al}
	}
	acked := func(r string, epoch uint64) ev { return ev{key: pAck(r, "n"), value: ack(r, epoch)} }
	lowered := []ev{{key: l.PolicyDoc("p.yaml"), value: rawDoc(pDoc)}, reg("a"), reg("b"),
		at(1, etcdlayout.PhaseStable, 0.2, 0.8, 0.2), acked("a", 1), acked("b", 1),
		at(2, etcdlayout.PhaseShrink, 0, 0.8, 0), acked("a", 2), acked("b", 2),
		at(3, etcdlayout.PhaseStable, 0, 1, 0), acked("a", 3), acked("b", 3)}
	with := func(evs ...ev) []ev { return append(append([]ev(nil), lowered...), evs...) }
	cases := []struct {
		name   string
		events []ev
		ok     bool
	}{
		{"a's lease ended after it acknowledged the lowered minimum", with(
			ev{key: pAck("a", "n"), del: true}, ev{key: l.Node("a", "n"), del: true}), true},
		{"a came back: it starts at the latest epoch", with(
			ev{key: pAck("a", "n"), del: true}, ev{key: l.Node("a", "n"), del: true}, reg("a"), acked("a", 3)), true},
		// a's lease ended before a applied the lowered minimum: it falls
		// back to the policy's minimum, which epoch 3 did not reserve.
		{"a's lease ended before it acknowledged the lowered minimum", []ev{{key: l.PolicyDoc("p.yaml"), value: rawDoc(pDoc)}, reg("a"), reg("b"),
			at(1, etcdlayout.PhaseStable, 0.2, 0.8, 0.2), acked("b", 1), at(2, etcdlayout.PhaseShrink, 0, 0.8, 0), acked("b", 2),
			ev{key: pAck("a", "n"), del: true}, ev{key: l.Node("a", "n"), del: true}, at(3, etcdlayout.PhaseStable, 0, 1, 0)}, false},
	}
	runHistory(t, l, cases)
}

// TestHistoryNodes: a region of several nodes may enforce the largest
// share any of them may enforce; growth is safe only once every live node
// acknowledged the shrink.
func TestHistoryNodes(t *testing.T) {
	var l etcdlayout.Layout
	reg := func(r, n string) ev {
		return ev{key: l.Node(r, n), value: etcdlayout.Registration{Region: r, Node: n}, created: true}
	}
	nack := func(r, n string, epoch uint64) ev {
		return ev{key: pAck(r, n), value: etcdlayout.Ack{Region: r, Node: n, Epochs: map[string]uint64{"p": epoch}}}
	}
	even := alloc(1, etcdlayout.PhaseStable, map[string]float64{"a": 0.5, "b": 0.5})
	shrink := alloc(2, etcdlayout.PhaseShrink, map[string]float64{"a": 0.5, "b": 0.2})
	grown := alloc(3, etcdlayout.PhaseStable, map[string]float64{"a": 0.8, "b": 0.2})
	start := []ev{reg("a", "1"), reg("b", "1"), reg("b", "2"), {key: l.Alloc("p"), value: even},
		nack("a", "1", 1), nack("b", "1", 1), nack("b", "2", 1), {key: l.Alloc("p"), value: shrink}, nack("a", "1", 2)}
	with := func(evs ...ev) []ev { return append(append([]ev(nil), start...), evs...) }
	cases := []struct {
		name   string
		events []ev
		ok     bool
	}{
		{"both nodes of b acked the shrink", with(nack("b", "1", 2), nack("b", "2", 2), ev{key: l.Alloc("p"), value: grown}), true},
		{"one node of b acked the shrink", with(nack("b", "1", 2), ev{key: l.Alloc("p"), value: grown}), false},
		{"the other node of b acked the shrink", with(nack("b", "2", 2), ev{key: l.Alloc("p"), value: grown}), false},
		{"b's second node left (lease gone): it is at its safe share", with(nack("b", "1", 2),
			ev{key: pAck("b", "2"), del: true}, ev{key: l.Node("b", "2"), del: true}, ev{key: l.Alloc("p"), value: grown}), true},
		{"a node of b registered during the shrink starts at it", with(nack("b", "1", 2), nack("b", "2", 2), reg("b", "3"),
			ev{key: l.Alloc("p"), value: grown}), true},
		{"nodes of a region are not summed", []ev{reg("a", "1"), reg("a", "2"), reg("a", "3"), reg("b", "1"),
			{key: l.Alloc("p"), value: even}}, true},
	}
	runHistory(t, l, cases)
}

func runHistory(t *testing.T, l etcdlayout.Layout, cases []struct {
	name   string
	events []ev
	ok     bool
}) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := NewHistory(l)
			for i, e := range c.events {
				if e.del {
					h.Delete(e.key)
				} else if raw, ok := e.value.(rawDoc); ok {
					if err := h.Put(e.key, []byte(raw), e.created); err != nil {
						t.Fatal(err)
					}
				} else {
					data, _ := json.Marshal(e.value)
					if err := h.Put(e.key, data, e.created); err != nil {
						t.Fatal(err)
					}
				}
				h.Check(int64(i + 1))
			}
			rep := h.Report()
			if rep.OK() != c.ok {
				t.Fatalf("OK() = %v, want %v: %v", rep.OK(), c.ok, rep.Violations)
			}
		})
	}
}

// rawDoc is a value put as is (a policy document), not as JSON.
type rawDoc string

func TestHistoryRejectsGarbage(t *testing.T) {
	var l etcdlayout.Layout
	if err := NewHistory(l).Put(l.Alloc("p"), []byte("{"), false); err == nil {
		t.Fatal("garbage allocation accepted")
	}
}

// TestHistoryFoldsDeadNodes: nodes that come and go (a new id per process)
// do not grow the history without bound, and a folded node still counts at
// its safe share.
func TestHistoryFoldsDeadNodes(t *testing.T) {
	var l etcdlayout.Layout
	h := NewHistory(l)
	put := func(key string, v any, created bool) {
		t.Helper()
		data, _ := json.Marshal(v)
		if err := h.Put(key, data, created); err != nil {
			t.Fatal(err)
		}
	}
	a := alloc(1, etcdlayout.PhaseStable, map[string]float64{"a": 0.9, "b": 0.1})
	a.Safe = map[string]float64{"a": 0.05, "b": 0.1}
	put(l.Alloc("p"), a, true)
	for i := range MaxDeadNodes + 10 {
		n := fmt.Sprintf("n%d", i)
		put(l.Node("b", n), etcdlayout.Registration{Region: "b", Node: n}, true)
		h.Delete(l.Node("b", n))
	}
	if len(h.nodes) > MaxDeadNodes {
		t.Fatalf("%d nodes tracked, bound %d", len(h.nodes), MaxDeadNodes)
	}
	put(l.Node("a", "1"), etcdlayout.Registration{Region: "a", Node: "1"}, true)
	h.Check(1)
	if rep := h.Report(); !rep.OK() || math.Abs(rep.MaxSum-1) > 1e-9 {
		t.Fatalf("want Σ 0.9 + b's safe 0.1 = 1, got %+v", rep)
	}
	// a grows past what b's folded safe share leaves: a violation.
	g := alloc(2, etcdlayout.PhaseStable, map[string]float64{"a": 0.95, "b": 0.05})
	g.Safe = a.Safe
	put(l.Alloc("p"), g, false)
	h.Check(2)
	if rep := h.Report(); rep.OK() {
		t.Fatal("folded dead nodes of b were forgotten")
	}
}
