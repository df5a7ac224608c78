package coordinator

import (
	"testing"

	"github.com/quotacoord/quota/internal/etcdlayout"
)

func TestRegionAck(t *testing.T) {
	ack := func(e uint64) etcdlayout.Ack { return etcdlayout.Ack{Epochs: map[string]uint64{"p": e}} }
	for _, c := range []struct {
		name  string
		nodes map[string]string
		acks  map[string]etcdlayout.Ack
		want  uint64
	}{
		{"one node", map[string]string{"n1": ""}, map[string]etcdlayout.Ack{"n1": ack(4)}, 4},
		{"the slowest node", map[string]string{"n1": "", "n2": ""}, map[string]etcdlayout.Ack{"n1": ack(4), "n2": ack(3)}, 3},
		{"a node without an ack", map[string]string{"n1": "", "n2": ""}, map[string]etcdlayout.Ack{"n1": ack(4)}, 0},
		{"a stale ack of a node gone is ignored", map[string]string{"n1": ""}, map[string]etcdlayout.Ack{"n1": ack(4), "old": ack(1)}, 4},
		{"no node: the stored acks", nil, map[string]etcdlayout.Ack{"n1": ack(4), "n2": ack(5)}, 4},
		{"nothing", nil, nil, 0},
	} {
		if got := regionAck(c.nodes, c.acks, "p"); got != c.want {
			t.Errorf("%s: regionAck = %d, want %d", c.name, got, c.want)
		}
	}
}
