package client

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Outcomes of quota_client_local_decisions_total.
const (
	OutcomeLocalAllowed = "local_allowed" // the emergency bucket admitted
	OutcomeLocalDenied  = "local_denied"  // the emergency bucket denied
	OutcomeOpen         = "open"          // UnreachableOpen admitted
	OutcomeClosed       = "closed"        // UnreachableClosed denied
)

// localDecisions counts the decisions a client made without its node:
// quota_client_local_decisions_total{outcome}. The zero value counts
// nothing (no registerer given).
type localDecisions struct {
	allowed, denied, open, closed prometheus.Counter
}

// newLocalDecisions registers the counter with reg, or reuses the one
// another client registered there: clients sharing a registry share the
// series.
func newLocalDecisions(reg prometheus.Registerer) (localDecisions, error) {
	if reg == nil {
		return localDecisions{}, nil
	}
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quota_client_local_decisions_total",
		Help: "Checks this client decided without its node, by outcome: its emergency bucket admitted (local_allowed) or denied (local_denied), or the unreachable mode admitted (open) or denied (closed).",
	}, []string{"outcome"})
	if err := reg.Register(vec); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			return localDecisions{}, fmt.Errorf("%w: register metrics: %w", ErrInvalidConfig, err)
		}
		existing, ok := are.ExistingCollector.(*prometheus.CounterVec)
		if !ok {
			return localDecisions{}, fmt.Errorf("%w: register metrics: another collector is called quota_client_local_decisions_total", ErrInvalidConfig)
		}
		vec = existing
	}
	return localDecisions{
		allowed: vec.WithLabelValues(OutcomeLocalAllowed),
		denied:  vec.WithLabelValues(OutcomeLocalDenied),
		open:    vec.WithLabelValues(OutcomeOpen),
		closed:  vec.WithLabelValues(OutcomeClosed),
	}, nil
}

// count records d, a decision the client made itself.
func (m *localDecisions) count(d *Decision) {
	var c prometheus.Counter
	switch {
	case d.Degraded == DegradedClientLocal && d.Allowed:
		c = m.allowed
	case d.Degraded == DegradedClientLocal:
		c = m.denied
	case d.Degraded == DegradedClientOpen:
		c = m.open
	case d.Degraded == DegradedClientClosed:
		c = m.closed
	}
	if c != nil {
		c.Inc()
	}
}
