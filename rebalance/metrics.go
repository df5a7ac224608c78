package rebalance

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/quotacoord/quota/plan"
)

// metrics has no per-subject label: policies and regions are bounded.
type metrics struct {
	leader      prometheus.Gauge
	rounds      *prometheus.CounterVec
	duration    prometheus.Histogram
	planned     *prometheus.HistogramVec
	epochs      *prometheus.CounterVec
	share       *prometheus.GaugeVec
	regions     prometheus.Gauge
	ackLag      *prometheus.GaugeVec
	publishErr  prometheus.Counter
	publishTxns prometheus.Counter
	acksMissed  *prometheus.CounterVec
	mismatch    *prometheus.GaugeVec
	resyncs     prometheus.Counter

	// shown is the allocation each policy's share series show (observe).
	shown map[string]*plan.Allocation
	// lagOf is, per policy shown, each region's acknowledgement lag (how
	// many epochs its slowest registered node is behind), and lag their
	// sums per region with the number of policies counted in each: the
	// gauge is kept by the policies whose allocation, acknowledgements
	// or regions' nodes changed, not every allocation × node each round.
	lagOf map[string]map[string]uint64
	lag   map[string]regionLag
}

// regionLag is one region's acknowledgement lag summed over policies,
// and how many policies' allocations name the region while it has a
// registered node (the gauge shows the region while any does).
type regionLag struct {
	epochs   uint64
	policies int
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		shown: map[string]*plan.Allocation{},
		lagOf: map[string]map[string]uint64{},
		lag:   map[string]regionLag{},
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "quota_coordinator_leader", Help: "1 while this coordinator leads, else 0.",
		}),
		rounds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quota_coordinator_rebalance_rounds_total", Help: "Rebalance rounds by kind (full, acks) and result (ok, error, refused: more registrations than the bounds allow, nothing published).",
		}, []string{"kind", "result"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "quota_coordinator_rebalance_round_seconds", Help: "Duration of a rebalance round.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}),
		planned: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "quota_coordinator_round_policies_planned", Help: "Policies a rebalance round planned, by kind (full: on changed inputs, or every policy every FullEvery rounds; acks: the policies a shrink or a new region involves).",
			Buckets: prometheus.ExponentialBuckets(1, 4, 9),
		}, []string{"kind"}),
		epochs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quota_coordinator_epochs_published_total", Help: "Allocations published, by policy and phase.",
		}, []string{"policy", "phase"}),
		share: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "quota_coordinator_share", Help: "Published default share per policy and region (fraction of the global budget).",
		}, []string{"policy", "region"}),
		regions: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "quota_coordinator_regions_live", Help: "Regions holding a registration lease.",
		}),
		ackLag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "quota_coordinator_ack_lag_epochs", Help: "Per region, epochs published but not yet acknowledged, summed over policies.",
		}, []string{"region"}),
		publishErr: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "quota_coordinator_publish_conflicts_total", Help: "Fenced publishes that etcd refused (lost lead or concurrent change).",
		}),
		publishTxns: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "quota_coordinator_publish_txns_total", Help: "Fenced publish transactions sent to etcd; each carries up to 126 allocations.",
		}),
		resyncs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "quota_coordinator_record_reads_total", Help: "Reads of every record by the leader: when it starts leading, every FullEvery-th full round, and when its watch of the records was compacted, fell behind its own write, or left records out over a bound. Other rounds plan on the records the watch kept.",
		}),
		mismatch: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "quota_coordinator_region_config_mismatch", Help: "1 for a live region not counted because a node of it reports other policies or subject naming than most nodes (the fingerprint of its registration), else 0.",
		}, []string{"region"}),
		acksMissed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quota_coordinator_acks_missed_total", Help: "Nodes whose acknowledgement a growth stopped waiting for at the acknowledgement deadline (they fell back to their safe shares), by region.",
		}, []string{"region"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.leader, m.rounds, m.duration, m.planned, m.epochs, m.share, m.regions, m.ackLag, m.publishErr, m.publishTxns, m.acksMissed, m.mismatch, m.resyncs} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// observe updates the gauges that describe a snapshot. The share series
// of an allocation are rewritten when the allocation is not the one they
// show (a snapshot keeps an allocation's value until it changes), and its
// acknowledgement lag counted again when, besides, snap.ackMoved names it
// (its acknowledgements changed) or says every policy (registrations
// changed, or the records were read again): a round's cost follows the
// allocations and acknowledgements that changed, not every policy times
// every region and node. observe consumes snap.ackMoved.
func (m *metrics) observe(snap *snapshot) {
	m.regions.Set(float64(len(snap.view.Regions)))
	for p, a := range m.shown {
		if snap.allocs[p] == nil {
			for r := range a.Default {
				m.share.DeleteLabelValues(p, r)
			}
			delete(m.shown, p)
			m.setLag(p, nil)
		}
	}
	moved := snap.ackMoved
	every := moved == nil || moved.all
	for p, a := range snap.allocs {
		was := m.shown[p]
		if was != a {
			if was != nil {
				for r := range was.Default {
					if _, ok := a.Default[r]; !ok {
						m.share.DeleteLabelValues(p, r)
					}
				}
			}
			for r, s := range a.Default {
				m.share.WithLabelValues(p, r).Set(s)
			}
			m.shown[p] = a // bounded by the allocations
		}
		if was != a || every || moved.policies[p] {
			m.setLag(p, ackLag(snap.view, p, a))
		}
	}
	if moved != nil {
		moved.all = false
		clear(moved.policies)
	}
	m.mismatch.Reset()
	for _, r := range snap.view.Mismatched() {
		m.mismatch.WithLabelValues(r).Set(1)
	}
	m.ackLag.Reset()
	for r, l := range m.lag {
		m.ackLag.WithLabelValues(r).Set(float64(l.epochs))
	}
}

// ackLag is, per region of a with a registered node, how many epochs of
// policy the region's slowest node has not acknowledged.
func ackLag(v *plan.View, policy string, a *plan.Allocation) map[string]uint64 {
	out := make(map[string]uint64, len(a.Default))
	for r := range a.Default {
		if nodes, ok := v.Regions[r]; ok {
			worst := uint64(0)
			for _, n := range nodes {
				if got := n.Acked[policy]; got < a.Epoch {
					worst = max(worst, a.Epoch-got)
				}
			}
			out[r] = worst
		}
	}
	return out
}

// setLag replaces policy's acknowledgement lag per region (nil: the
// policy has no allocation) in the sums per region.
func (m *metrics) setLag(policy string, lag map[string]uint64) {
	for r, e := range m.lagOf[policy] {
		l := m.lag[r]
		l.epochs -= e
		l.policies--
		if l.policies == 0 {
			delete(m.lag, r)
		} else {
			m.lag[r] = l
		}
	}
	if lag == nil {
		delete(m.lagOf, policy)
		return
	}
	for r, e := range lag {
		l := m.lag[r]
		l.epochs += e
		l.policies++
		m.lag[r] = l // bounded by the regions of the allocations
	}
	m.lagOf[policy] = lag // bounded by the allocations
}
