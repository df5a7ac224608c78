package regionsync

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/etcdtest"
)

// heldGate is a LeaseGate with one lease of policy p taken at share 0.7,
// held until released.
type heldGate struct{ released atomic.Bool }

func (g *heldGate) HeldAbove(policy string, share func(string) float64) time.Time {
	if policy != "p" || g.released.Load() || share("x") >= 0.7 {
		return time.Time{}
	}
	return time.Now().Add(time.Hour)
}

// TestAckWaitsForLeases: a shrink is not acknowledged while a lease taken
// above the new share lives, and is once it has ended; a growth (or the
// share the lease was taken at) is not held back.
func TestAckWaitsForLeases(t *testing.T) {
	srv := etcdtest.Start(t)
	c := srv.Client(t)
	safe := map[string]float64{"eu": 0.1, "us": 0.1}
	putJSON(t, c, lay.Alloc("p"), alloc("p", 1, map[string]float64{"eu": 0.7, "us": 0.3}, safe, nil))
	gate := &heldGate{}
	s, _ := start(t, srv, Config{LeaseTTL: 3 * time.Second, Leases: gate})
	acked := func(epoch uint64) func() bool {
		return func() bool {
			var a etcdlayout.Ack
			found, _ := getAck(t, c, "eu", testNode, &a)
			return found && a.Epochs["p"] == epoch
		}
	}
	waitFor(t, 5*time.Second, "epoch 1 (the lease's own share) not acked", acked(1))

	shrink := alloc("p", 2, map[string]float64{"eu": 0.4, "us": 0.3}, safe, nil)
	shrink.Phase = etcdlayout.PhaseShrink
	putJSON(t, c, lay.Alloc("p"), shrink)
	waitFor(t, 3*time.Second, "epoch 2 not applied", func() bool { return s.Share("p", "x") == 0.4 })
	time.Sleep(300 * time.Millisecond)
	if acked(2)() {
		t.Fatal("epoch 2 acknowledged while a lease taken at 0.7 lives")
	}
	gate.released.Store(true)
	took := waitFor(t, 3*time.Second, "epoch 2 not acked after the lease ended", acked(2))
	t.Logf("epoch 2 acknowledged %v after the lease ended", took)
}
