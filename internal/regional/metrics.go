package regional

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the node's Prometheus series. No label carries a subject or a
// key: policy names come from the loaded configuration (unknown names are
// reported as "unknown"), so every label set is bounded.
type metrics struct {
	decisions     *prometheus.CounterVec   // policy, region, result
	storeLatency  *prometheus.HistogramVec // op
	storeErrors   *prometheus.CounterVec   // kind
	degraded      *prometheus.CounterVec   // policy, region, mode
	retryAfter    *prometheus.HistogramVec // policy
	shares        *prometheus.GaugeVec     // policy, region
	negHits       prometheus.Counter
	replays       prometheus.Counter
	breakerOpens  prometheus.Counter
	breakerOpen   prometheus.Gauge
	reloads       *prometheus.CounterVec // result
	grantsReloads *prometheus.CounterVec // result
	memoryFull    *prometheus.CounterVec // store: primary or local
	// nodeLeases is the number of live node leases; nodeLeaseCalls the
	// lease store calls by op (grant, renew, release).
	nodeLeases     prometheus.Gauge
	nodeLeaseCalls *prometheus.CounterVec
	overflow       *prometheus.CounterVec // policy
	rejected       *prometheus.CounterVec // api
	forbidden      *prometheus.CounterVec // api, action
	bucketOps      *prometheus.CounterVec // api
	callerLimited  *prometheus.CounterVec // api
	policies       prometheus.Gauge
}

// Results of a decision, the "result" label.
const (
	resultAllowed      = "allowed"
	resultDenied       = "denied"
	resultShadowDenied = "shadow_denied"
	resultUnlimited    = "unlimited"
	resultUnknown      = "unknown_policy"
)

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "quota", Subsystem: "regional", Name: "decisions_total",
			Help: "Policy decisions by policy, region and result (allowed, denied, shadow_denied, unlimited, unknown_policy).",
		}, []string{"policy", "region", "result"}),
		storeLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "quota", Subsystem: "regional", Name: "store_latency_seconds",
			Help:    "Latency of bucket store (Redis) calls, by operation, errors included.",
			Buckets: []float64{.0001, .00025, .0005, .001, .002, .005, .01, .025, .05, .1},
		}, []string{"op"}),
		storeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "quota", Subsystem: "regional", Name: "store_errors_total",
			Help: "Bucket store errors by kind (timeout, error, script).",
		}, []string{"kind"}),
		degraded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "quota", Subsystem: "regional", Name: "degraded_decisions_total",
			Help: "Policy decisions made by a failure mode instead of the store, by policy, region and mode.",
		}, []string{"policy", "region", "mode"}),
		retryAfter: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "quota", Subsystem: "regional", Name: "retry_after_seconds",
			Help:    "Retry-after of denials, by policy.",
			Buckets: []float64{.01, .1, .5, 1, 5, 15, 60, 300, 3600},
		}, []string{"policy"}),
		shares: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "quota", Subsystem: "regional", Name: "default_share",
			Help: "The share of each policy's global budget this region enforces for subjects without an override.",
		}, []string{"policy", "region"}),
		negHits: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "quota", Subsystem: "regional", Name: "negative_cache_hits_total",
			Help: "Checks denied by the local negative cache without a store call.",
		}),
		replays: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "quota", Subsystem: "regional", Name: "idempotent_replays_total",
			Help: "Checks answered from the idempotency cache.",
		}),
		breakerOpens: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "quota", Subsystem: "regional", Name: "breaker_opens_total",
			Help: "Times the store circuit breaker opened.",
		}),
		breakerOpen: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "quota", Subsystem: "regional", Name: "breaker_open",
			Help: "Whether the store circuit breaker is open or half-open (1) or closed (0).",
		}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "quota", Subsystem: "regional", Name: "policy_reloads_total",
			Help: "Policy reloads by result (ok, error).",
		}, []string{"result"}),
		grantsReloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "quota", Subsystem: "regional", Name: "grants_reloads_total",
			Help: "Reloads of the grants and tokens files by result (ok, error).",
		}, []string{"result"}),
		memoryFull: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "quota", Subsystem: "regional", Name: "memory_full_total",
			Help: "Checks denied because a store refused to grow: the in-process store (primary or local) at its bucket cap, or Redis at maxmemory (an OOM reply, and new subjects for one breaker cooldown after it).",
		}, []string{"store"}),
		nodeLeases: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "quota", Subsystem: "regional", Name: "node_leases",
			Help: "Hot subjects this node decides in memory from a node lease.",
		}),
		nodeLeaseCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "quota", Subsystem: "regional", Name: "node_lease_calls_total",
			Help: "Node lease calls to the store by op (grant, renew, release).",
		}, []string{"op"}),
		overflow: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "quota", Subsystem: "regional", Name: "subject_overflow_total",
			Help: "Checks of a new subject charged to the policy's shared overflow bucket because the policy held its bound of live subjects on this node.",
		}, []string{"policy"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "quota", Subsystem: "regional", Name: "rejected_requests_total",
			Help: "Requests the node could not decide (bad input) and answered as denied rather than with an error, by API.",
		}, []string{"api"}),
		forbidden: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "quota", Subsystem: "regional", Name: "forbidden_actions_total",
			Help: "Actions a caller was not granted (check, peek, refund, override), by API: refused (own API) or left out of the decision (Envoy API).",
		}, []string{"api", "action"}),
		bucketOps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "quota", Subsystem: "regional", Name: "bucket_operations_total",
			Help: "Bucket operations (one per policy of a check, per descriptor of an Envoy request) requests were admitted to run, by API.",
		}, []string{"api"}),
		callerLimited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "quota", Subsystem: "regional", Name: "caller_limited_total",
			Help: "Requests refused because their caller had too many bucket operations in flight on the node, by API.",
		}, []string{"api"}),
		policies: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "quota", Subsystem: "regional", Name: "policies",
			Help: "Policies in the loaded set.",
		}),
	}
	for _, c := range []prometheus.Collector{m.decisions, m.storeLatency, m.storeErrors, m.degraded,
		m.retryAfter, m.shares, m.negHits, m.replays, m.breakerOpens, m.breakerOpen, m.reloads, m.grantsReloads, m.memoryFull, m.nodeLeases, m.nodeLeaseCalls, m.overflow, m.rejected, m.forbidden,
		m.bucketOps, m.callerLimited, m.policies} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("regional: register metrics: %w", err)
		}
	}
	return m, nil
}
