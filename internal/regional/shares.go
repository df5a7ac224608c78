package regional

// ShareSource tells the share of a policy's global budget this region may
// enforce for a subject. internal/regionsync implements it from etcd;
// Standalone is the single-region answer.
type ShareSource interface {
	// Share returns the region's share f for policy and subject; the
	// bucket enforces f·C and f·r. A share ≤ 0 denies everything.
	Share(policy, subject string) float64
	// Ready reports whether shares are known (with etcd: the first
	// allocations have been read).
	Ready() bool
}

// Standalone is the ShareSource of a node without a coordinator: every
// share is 1 and it is always ready. Its zero value is ready to use.
type Standalone struct{}

// Share returns 1.
func (Standalone) Share(policy, subject string) float64 { return 1 }

// Ready returns true.
func (Standalone) Ready() bool { return true }

// DemandSink receives one record per decided policy of a check: the cost
// offered, whether it was admitted, and whether the subject is pressured
// (denied, or left with less than half of the local capacity).
// internal/demand implements it. Record must be cheap and safe for
// concurrent use.
type DemandSink interface {
	Record(policy, subject string, cost int64, admitted bool, pressured bool)
}
