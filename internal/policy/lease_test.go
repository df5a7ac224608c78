package policy

import (
	"strings"
	"testing"
	"time"
)

// TestParseNodeLease checks the lease setting in both file formats: what
// is accepted and normalized, and a clear error for each bad value.
func TestParseNodeLease(t *testing.T) {
	own := func(extra string) string {
		return "policies:\n  - name: x\n    capacity: 60\n    rate: 30/s\n" + extra
	}
	envoy := func(rl string) string {
		return "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: " + rl + "\n"
	}
	tests := []struct {
		name, file string
		want       *NodeLease
		err        string
	}{
		{"own none", own(""), nil, ""},
		{"own lease", own("    lease: {fraction: 0.5, ttl: 2s}\n"), &NodeLease{Fraction: 0.5, TTL: 2 * time.Second}, ""},
		{"own fraction 0", own("    lease: {fraction: 0, ttl: 2s}\n"), nil, "lease.fraction"},
		{"own fraction above 1", own("    lease: {fraction: 1.5, ttl: 2s}\n"), nil, "lease.fraction"},
		{"own ttl missing", own("    lease: {fraction: 0.5}\n"), nil, "lease.ttl: missing"},
		{"own ttl too short", own("    lease: {fraction: 0.5, ttl: 1ms}\n"), nil, "lease.ttl"},
		{"own ttl beyond idle ttl", own("    idle_ttl: 1m\n    lease: {fraction: 0.5, ttl: 59s}\n"), nil, "lease.ttl"},
		{"own window", "policies:\n  - name: x\n    algorithm: fixed_window\n    capacity: 60\n    window: 1s\n    lease: {fraction: 0.5, ttl: 2s}\n", nil, "only token buckets"},
		{"envoy lease", envoy("{unit: second, requests_per_unit: 30, burst: 60, lease: {fraction: 1, ttl: 3s}}"), &NodeLease{Fraction: 1, TTL: 3 * time.Second}, ""},
		{"envoy without burst", envoy("{unit: second, requests_per_unit: 30, lease: {fraction: 1, ttl: 3s}}"), nil, "needs rate_limit.burst"},
		{"envoy bad ttl", envoy("{unit: second, requests_per_unit: 30, burst: 60, lease: {fraction: 1, ttl: soon}}"), nil, "lease.ttl"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Parse("p.yaml", []byte(tt.file))
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want one containing %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			p := s.Policies()[0]
			switch {
			case tt.want == nil && p.Lease != nil:
				t.Fatalf("lease = %+v, want none", *p.Lease)
			case tt.want != nil && (p.Lease == nil || *p.Lease != *tt.want):
				t.Fatalf("lease = %+v, want %+v", p.Lease, *tt.want)
			}
		})
	}
}
