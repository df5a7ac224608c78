package etcdlayout

import "testing"

func TestKeys(t *testing.T) {
	for _, c := range []struct {
		got, want string
	}{
		{Layout{}.Node("eu", "n-1"), "/quota/v1/regions/eu/n-1"},
		{Layout{Prefix: "/x"}.Node("eu", "n-1"), "/x/regions/eu/n-1"},
		{Layout{}.RegionNodes("eu"), "/quota/v1/regions/eu/"},
		{Layout{}.NodeDemand("eu", "n-1"), "/quota/v1/demand/eu/n-1"},
		{Layout{}.NodeAck("eu", "n-1"), "/quota/v1/acks/eu/n-1"},
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
		{l.RegionsPrefix() + "eu", "", "", false},                    // a region without a node
		{l.NodeAck("eu", "host.a_b-C9"), "eu", "host.a_b-C9", false}, // not below the regions prefix
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
	if r, n, ok := NodeOf(l.AcksPrefix(), l.NodeAck("eu", "n")); !ok || r != "eu" || n != "n" {
		t.Errorf("ack key: %q %q %v", r, n, ok)
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
