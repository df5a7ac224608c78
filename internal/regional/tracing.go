package regional

import (
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// traceDecision records on span what a check decided: the policies
// checked, whether the request was admitted, the deciding policy (when
// the API names one) and the failure mode that decided instead of the
// store, if any. Subjects are never recorded, raw or hashed: a trace
// backend is no place for API keys, addresses or tenants.
func traceDecision(span trace.Span, items []item, out outcome, decidedBy string) {
	if !span.IsRecording() {
		return
	}
	names := make([]string, len(items))
	for i := range items {
		names[i] = items[i].label
	}
	attrs := []attribute.KeyValue{attribute.StringSlice("quota.policies", names), attribute.Bool("quota.allowed", out.allowed)}
	if decidedBy != "" {
		attrs = append(attrs, attribute.String("quota.decided_by", decidedBy))
	}
	if out.degraded != "" {
		attrs = append(attrs, attribute.String("quota.degraded", string(out.degraded)))
	}
	span.SetAttributes(attrs...)
}
