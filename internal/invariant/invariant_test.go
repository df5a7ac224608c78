package invariant

import (
	"encoding/json"
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

func ack(region string, epoch uint64) etcdlayout.Ack {
	return etcdlayout.Ack{Region: region, Epochs: map[string]uint64{"p": epoch}}
}

func TestHistory(t *testing.T) {
	var l etcdlayout.Layout
	reg := func(r string) ev {
		return ev{key: l.Region(r), value: etcdlayout.Registration{Region: r}, created: true}
	}
	even := alloc(1, etcdlayout.PhaseStable, map[string]float64{"a": 0.5, "b": 0.5})
	shrink := alloc(2, etcdlayout.PhaseShrink, map[string]float64{"a": 0.5, "b": 0.2})
	grown := alloc(3, etcdlayout.PhaseStable, map[string]float64{"a": 0.8, "b": 0.2})
	cases := []struct {
		name   string
		events []ev
		ok     bool
	}{
		{"two-step with acks", []ev{reg("a"), reg("b"), {key: l.Alloc("p"), value: even}, {key: l.Ack("a"), value: ack("a", 1)}, {key: l.Ack("b"), value: ack("b", 1)},
			{key: l.Alloc("p"), value: shrink}, {key: l.Ack("a"), value: ack("a", 2)}, {key: l.Ack("b"), value: ack("b", 2)}, {key: l.Alloc("p"), value: grown}}, true},
		{"growth before b acked the shrink", []ev{reg("a"), reg("b"), {key: l.Alloc("p"), value: even}, {key: l.Ack("a"), value: ack("a", 1)}, {key: l.Ack("b"), value: ack("b", 1)},
			{key: l.Alloc("p"), value: shrink}, {key: l.Ack("a"), value: ack("a", 2)}, {key: l.Alloc("p"), value: grown}}, false},
		{"b's lease expired: it counts at its safe share", []ev{reg("a"), reg("b"), {key: l.Alloc("p"), value: even}, {key: l.Ack("a"), value: ack("a", 1)}, {key: l.Ack("b"), value: ack("b", 1)},
			{key: l.Alloc("p"), value: shrink}, {key: l.Ack("a"), value: ack("a", 2)}, {key: l.Ack("b"), del: true}, {key: l.Region("b"), del: true}, {key: l.Alloc("p"), value: grown}}, true},
		{"region registered late starts at the latest epoch", []ev{reg("a"), {key: l.Alloc("p"), value: alloc(1, etcdlayout.PhaseStable, map[string]float64{"a": 1})},
			{key: l.Ack("a"), value: ack("a", 1)}, {key: l.Alloc("p"), value: alloc(2, etcdlayout.PhaseShrink, map[string]float64{"a": 0.5, "b": 0})}, {key: l.Ack("a"), value: ack("a", 2)},
			{key: l.Alloc("p"), value: alloc(3, etcdlayout.PhaseStable, map[string]float64{"a": 0.5, "b": 0.5})}, reg("b")}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := NewHistory(l)
			for i, e := range c.events {
				if e.del {
					h.Delete(e.key)
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

func TestHistoryRejectsGarbage(t *testing.T) {
	var l etcdlayout.Layout
	if err := NewHistory(l).Put(l.Alloc("p"), []byte("{"), false); err == nil {
		t.Fatal("garbage allocation accepted")
	}
}
