package policy_test

import (
	"fmt"

	"github.com/quotacoord/quota/internal/policy"
)

func ExampleParse() {
	own, err := policy.Parse("policies.yaml", []byte(`
policies:
  - name: exports
    subject: tenant
    capacity: 50
    rate: 1000/minute
`))
	if err != nil {
		panic(err)
	}
	p, _ := own.Get("exports")
	fmt.Printf("%s: capacity %d, refill %.2f/s, idle TTL %v, failure mode %s\n",
		p.Name, p.Limits.Capacity, p.Limits.RefillPerSecond, p.Limits.IdleTTL, p.FailureMode)

	_, err = policy.Parse("policies.yaml", []byte(`
policies:
  - name: exports
    capacity: 0
    rate: 1000/minute
`))
	fmt.Println(err)
	// Output:
	// exports: capacity 50, refill 16.67/s, idle TTL 1m0s, failure mode local
	// policy: invalid: policies.yaml: policy "exports": capacity: must be > 0, got 0
}

func ExampleSet_MatchDescriptors() {
	envoy, err := policy.Parse("ratelimit.yaml", []byte(`
domain: edge
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 600}
    descriptors:
      - key: path
        value: /api/export*
        rate_limit: {unit: hour, requests_per_unit: 100}
`))
	if err != nil {
		panic(err)
	}
	matches, err := envoy.MatchDescriptors("edge", [][]policy.Entry{
		{{Key: "tenant", Value: "acme"}},
		{{Key: "tenant", Value: "acme"}, {Key: "path", Value: "/api/exports/7"}},
		{{Key: "region", Value: "eu"}},
	})
	if err != nil {
		panic(err)
	}
	for _, m := range matches {
		if m.Policy == nil {
			fmt.Println("no limit")
			continue
		}
		fmt.Printf("%d per %s\n", m.Policy.Limits.Capacity, m.Policy.Envoy.Unit)
	}
	// Output:
	// 600 per minute
	// 100 per hour
	// no limit
}
