package regionsync

import (
	"testing"
	"time"

	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/etcdtest"
)

// TestStalledAllocationWatchFallsBack: a node whose keepalives work but
// whose watch of the allocations delivers nothing would enforce its
// shares forever, and the leader would wait for its acknowledgement
// forever. With an acknowledgement deadline in etcd's settings the node
// falls back to its safe share once its watch has been silent that long,
// and takes the published share again once the watch delivers. An idle
// watch with nothing to deliver is kept current by progress
// notifications and does not fall back.
func TestStalledAllocationWatchFallsBack(t *testing.T) {
	srv := etcdtest.Start(t)
	c := srv.Client(t)
	const deadline = time.Second
	putJSON(t, c, lay.Settings(), etcdlayout.Settings{LeaseTTLSeconds: 10, AckDeadlineSeconds: deadline.Seconds()})
	putJSON(t, c, lay.Alloc("p"), alloc("p", 1, map[string]float64{"eu": 0.6}, map[string]float64{"eu": 0.1}, nil))
	s, _ := start(t, srv, Config{Node: "n1", LeaseTTL: 10 * time.Second})
	waitFor(t, 5*time.Second, "the published share", func() bool { return s.Ready() && s.Share("p", "x") == 0.6 })

	// Idle for three deadlines: progress notifications keep it current.
	for end := time.Now().Add(3 * deadline); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if got := s.Share("p", "x"); got != 0.6 || s.Losses() != 0 {
			t.Fatalf("an idle but healthy watch fell back: share %v, %d losses", got, s.Losses())
		}
	}

	s.holdAllocWatch.Store(true)
	took := waitFor(t, 4*deadline, "the safe share after the watch went silent", func() bool { return s.Share("p", "x") == 0.1 })
	if took > deadline+time.Second {
		t.Errorf("fell back %v after the watch went silent, want within the deadline %v", took, deadline)
	}
	s.holdAllocWatch.Store(false)
	waitFor(t, 10*time.Second, "the published share once the watch delivers again", func() bool { return s.Ready() && s.Share("p", "x") == 0.6 })
}

// TestFallbackNeverRaisesAShare: a node that loses its lease enforces the
// lower of its safe share and the share it held, so a safe share above
// the held one (a raised minimum not yet granted by a growth) is not
// taken on top of what the other regions hold.
func TestFallbackNeverRaisesAShare(t *testing.T) {
	srv := etcdtest.Start(t)
	c := srv.Client(t)
	putJSON(t, c, lay.Alloc("p"), alloc("p", 1, map[string]float64{"eu": 0.1}, map[string]float64{"eu": 0.3},
		map[string]map[string]float64{"hot": {"eu": 0.5}}))
	s, _ := start(t, srv, Config{Node: "n1", LeaseTTL: 10 * time.Second})
	waitFor(t, 5*time.Second, "the published shares", func() bool { return s.Ready() && s.Share("p", "x") == 0.1 })
	srv.Stop() // closing etcd deletes the registration: a lost lease
	waitFor(t, 5*time.Second, "the fallback", s.Lost)
	if got := s.Share("p", "x"); got != 0.1 {
		t.Errorf("fallback share of a subject held at 0.1 with safe share 0.3: %v, want 0.1", got)
	}
	if got := s.Share("p", "hot"); got != 0.3 {
		t.Errorf("fallback share of a subject held at 0.5 with safe share 0.3: %v, want 0.3", got)
	}
}
