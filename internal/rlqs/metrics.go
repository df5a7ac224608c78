package rlqs

import "github.com/prometheus/client_golang/prometheus"

// metrics are the server's Prometheus metrics, without per-bucket labels.
type metrics struct {
	streams, buckets, leased                 prometheus.Gauge
	reports, changes, abandoned, leaseDenied prometheus.Counter
	unsupported, overflow, refused, dropped  prometheus.Counter
	kept                                     prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	g := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "quota", Subsystem: "rlqs", Name: name, Help: help})
	}
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "quota", Subsystem: "rlqs", Name: name, Help: help})
	}
	m := &metrics{
		streams:     g("streams", "RLQS streams held."),
		buckets:     g("buckets", "Buckets subscribed over all streams."),
		leased:      g("leased_tokens_per_second", "Refill leased to Envoys, in tokens per second, summed over buckets."),
		reports:     c("usage_reports_total", "Bucket usage reports handled."),
		changes:     c("assignment_changes_total", "Assignments sent that differ from the bucket's previous one (the filter starts a new, full bucket)."),
		abandoned:   c("abandoned_buckets_total", "Buckets abandoned for idleness (abandon_action)."),
		leaseDenied: c("lease_denials_total", "Leases the region's bucket could not grant (answered DENY_ALL)."),
		unsupported: c("unsupported_buckets_total", "Bucket ids matching no leasable policy (no assignment is sent)."),
		overflow:    c("bucket_overflow_total", "Buckets left without assignment: the stream's or the bucket's consumer bound was reached."),
		refused:     c("refused_streams_total", "Streams refused at the stream bound."),
		dropped:     c("dropped_responses_total", "Responses not queued because the stream did not read its previous ones."),
		kept:        c("kept_leases_total", "Lease renewals kept above a shrunk share for a stalled stream (the shrink's acknowledgement waits)."),
	}
	if reg != nil {
		for _, col := range []prometheus.Collector{m.streams, m.buckets, m.leased, m.reports, m.changes, m.abandoned,
			m.leaseDenied, m.unsupported, m.overflow, m.refused, m.dropped, m.kept} {
			if err := reg.Register(col); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}
