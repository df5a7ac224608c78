package regionsync

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/etcdtest"
)

// TestNodeIDTakenWaitsForTheHolder: a second process with a node id that
// is registered does not register (it would share the first's keys and
// acknowledgements): it gets ErrNodeIDTaken until the first's lease ends.
func TestNodeIDTakenWaitsForTheHolder(t *testing.T) {
	srv := etcdtest.Start(t)
	c := srv.Client(t)
	putJSON(t, c, lay.Alloc("p"), alloc("p", 1, map[string]float64{"eu": 0.5}, map[string]float64{"eu": 0.1}, nil))
	first, stopFirst := start(t, srv, Config{Node: "n1", LeaseTTL: 3 * time.Second})
	waitFor(t, 5*time.Second, "n1 to register", func() bool { return first.Ready() })
	_, lease := getJSON(t, c, lay.Node("eu", "n1"), &etcdlayout.Registration{})

	second, err := New(Config{Region: "eu", Node: "n1", Client: c, LeaseTTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := second.establish(ctx); !errors.Is(err, ErrNodeIDTaken) {
		t.Fatalf("second process with node id n1 registered: %v", err)
	}
	if _, held := getJSON(t, c, lay.Node("eu", "n1"), &etcdlayout.Registration{}); held != lease {
		t.Fatalf("n1's registration moved from lease %x to %x", lease, held)
	}
	stopFirst() // revokes the first's lease
	id, err := second.establish(ctx)
	if err != nil {
		t.Fatalf("after the first stopped: %v", err)
	}
	if _, held := getJSON(t, c, lay.Node("eu", "n1"), &etcdlayout.Registration{}); held != int64(id) {
		t.Fatalf("n1's registration under lease %x, want the second's %x", held, id)
	}
	_, _ = c.Revoke(ctx, id)
}

// TestRegistrationDeletedIsALostLease: when a node's registration is
// deleted under its live lease (an operator, another process), the
// coordinator may count its region without it, so the node treats it as
// a lost lease: safe shares at once, and a new registration.
func TestRegistrationDeletedIsALostLease(t *testing.T) {
	srv := etcdtest.Start(t)
	c := srv.Client(t)
	putJSON(t, c, lay.Alloc("p"), alloc("p", 1, map[string]float64{"eu": 0.5}, map[string]float64{"eu": 0.1}, nil))
	s, _ := start(t, srv, Config{Node: "n1", LeaseTTL: 10 * time.Second})
	waitFor(t, 5*time.Second, "n1 to enforce epoch 1", func() bool { return s.Ready() && s.Share("p", "x") == 0.5 })
	_, before := getJSON(t, c, lay.Node("eu", "n1"), &etcdlayout.Registration{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.Delete(ctx, lay.Node("eu", "n1")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the deletion to count as a lost lease", func() bool { return s.Losses() >= 1 })
	waitFor(t, 8*time.Second, "a new registration under a new lease", func() bool {
		found, after := getJSON(t, c, lay.Node("eu", "n1"), &etcdlayout.Registration{})
		return found && after != before && s.Ready()
	})
}

// TestRegistrationCarriesTheFingerprint: the registration holds the
// node's fingerprint and is rewritten when it changes (a policy reload),
// under the same lease.
func TestRegistrationCarriesTheFingerprint(t *testing.T) {
	srv := etcdtest.Start(t)
	c := srv.Client(t)
	var fp atomic.Value
	fp.Store("aaaa")
	s, _ := start(t, srv, Config{Node: "n1", LeaseTTL: 10 * time.Second, Fingerprint: func() string { return fp.Load().(string) }})
	var reg etcdlayout.Registration
	var lease int64
	waitFor(t, 5*time.Second, "the registration with the first fingerprint", func() bool {
		var found bool
		found, lease = getJSON(t, c, lay.Node("eu", "n1"), &reg)
		return found && reg.Fingerprint == "aaaa"
	})
	fp.Store("bbbb")
	waitFor(t, 5*time.Second, "the registration with the new fingerprint", func() bool {
		found, l := getJSON(t, c, lay.Node("eu", "n1"), &reg)
		return found && reg.Fingerprint == "bbbb" && l == lease
	})
	if s.Losses() != 0 {
		t.Errorf("%d losses while rewriting the registration", s.Losses())
	}
}
