package policy

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quotacoord/quota/bucket"
)

func TestParseOwnExample(t *testing.T) {
	s, err := Load("../../examples/policies/policies.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range s.Policies() {
		names = append(names, p.Name)
	}
	if got, want := strings.Join(names, ","), "api-global,api-requests,exports,logins"; got != want {
		t.Fatalf("names = %s, want %s", got, want)
	}
	p, ok := s.Get("exports")
	if !ok {
		t.Fatal("exports missing")
	}
	want := bucket.Limits{Algorithm: bucket.TokenBucket, Capacity: 50, RefillPerSecond: 1000.0 / 60, IdleTTL: time.Minute}
	if p.Limits != want {
		t.Errorf("exports limits = %+v, want %+v", p.Limits, want)
	}
	if p.FailureMode != FailLocal || p.LocalScale != 0.5 || p.Subject != "tenant" || p.HashSubject {
		t.Errorf("exports = %+v", p)
	}
	if p.MinShareFor("eu-west") != 0.2 || p.MinShareFor("us-east") != 0.1 {
		t.Errorf("min shares: eu-west %v, us-east %v", p.MinShareFor("eu-west"), p.MinShareFor("us-east"))
	}
	api, _ := s.Get("api-requests")
	if !api.HashSubject || api.Limits.Algorithm != bucket.SlidingWindow || api.Limits.Capacity != 6000 ||
		api.Limits.Window != time.Minute || api.Limits.IdleTTL != 2*time.Minute {
		t.Errorf("api-requests = %+v", api)
	}
	global, _ := s.Get("api-global")
	if global.Limits.Shards != 4 || global.Limits.Capacity != 10000 || global.Limits.RefillPerSecond != 10000 {
		t.Errorf("api-global = %+v", global)
	}
	logins, _ := s.Get("logins")
	if logins.Limits.IdleTTL != time.Hour || logins.FailureMode != FailClosed || !logins.HashSubject {
		t.Errorf("logins = %+v", logins)
	}
}

func TestParseOwnDefaults(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want bucket.Limits
	}{
		{"refill_per_second", "capacity: 10\n    refill_per_second: 0.5",
			bucket.Limits{Algorithm: bucket.TokenBucket, Capacity: 10, RefillPerSecond: 0.5, IdleTTL: time.Minute}},
		{"ttl covers slow refill", "capacity: 1000\n    rate: 1000/hour",
			bucket.Limits{Algorithm: bucket.TokenBucket, Capacity: 1000, RefillPerSecond: 1000.0 / 3600, IdleTTL: time.Hour}},
		{"ttl rounds up", "capacity: 7\n    rate: 3/s",
			bucket.Limits{Algorithm: bucket.TokenBucket, Capacity: 7, RefillPerSecond: 3, IdleTTL: time.Minute}},
		{"rate with duration", "algorithm: fixed_window\n    rate: 100/90s",
			bucket.Limits{Algorithm: bucket.FixedWindow, Capacity: 100, Window: 90 * time.Second, IdleTTL: 90 * time.Second}},
		{"capacity and window", "algorithm: sliding_log\n    capacity: 5\n    window: 2d",
			bucket.Limits{Algorithm: bucket.SlidingLog, Capacity: 5, Window: 48 * time.Hour, IdleTTL: 48 * time.Hour}},
		{"overcommit", "capacity: 1\n    rate: 1/day\n    overcommit: 0.1",
			bucket.Limits{Algorithm: bucket.TokenBucket, Capacity: 1, RefillPerSecond: 1.0 / 86400, IdleTTL: 24 * time.Hour, Overcommit: 0.1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Parse("p.yaml", []byte("policies:\n  - name: x\n    "+tt.yaml+"\n"))
			if err != nil {
				t.Fatal(err)
			}
			p, _ := s.Get("x")
			if p.Limits != tt.want {
				t.Errorf("limits = %+v, want %+v", p.Limits, tt.want)
			}
			if p.Version != 1 || p.FailureMode != DefaultFailureMode || p.LocalScale != 1 || p.Source != "p.yaml" {
				t.Errorf("defaults = %+v", p)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		file string
		want string
	}{
		{"empty", "", "p.yaml: empty file"},
		{"not yaml", "policies: [", "p.yaml: "},
		{"neither", "foo: 1", `no "policies" or "domain"`},
		{"both", "policies: []\ndomain: x", `both "policies" and "domain"`},
		{"scalar top", "- 1", "top level must be a mapping"},
		{"empty list", "policies: []", "policies: the list is empty"},
		{"capacity zero", "policies:\n  - name: exports\n    capacity: 0\n    rate: 1/s",
			`p.yaml: policy "exports": capacity: must be > 0`},
		{"capacity missing", "policies:\n  - name: exports\n    rate: 1/s", `policy "exports": capacity: missing`},
		{"no name", "policies:\n  - capacity: 1\n    rate: 1/s", "policy #1: name: missing"},
		{"bad name", "policies:\n  - name: a/b\n    capacity: 1\n    rate: 1/s", `policy "a/b": name:`},
		{"typo field", "policies:\n  - name: exports\n    capacty: 5\n    rate: 1/s", `policy "exports": line 3: field capacty not found`},
		{"typo second policy", "policies:\n  - name: a\n    capacity: 1\n    rate: 1/s\n  - name: b\n    rat: 1/s", `policy "b": line 6: field rat not found`},
		{"wrong type", "policies:\n  - name: exports\n    capacity: lots\n    rate: 1/s", `policy "exports": line 3: cannot unmarshal`},
		{"both rates", "policies:\n  - name: e\n    capacity: 1\n    rate: 1/s\n    refill_per_second: 1", "rate: give rate or refill_per_second, not both"},
		{"no rate", "policies:\n  - name: e\n    capacity: 1", "rate: missing"},
		{"bad rate", "policies:\n  - name: e\n    capacity: 1\n    rate: fast", `rate: "fast": want COUNT/UNIT`},
		{"bad unit", "policies:\n  - name: e\n    capacity: 1\n    rate: 1/fortnight", "unit must be"},
		{"negative rate", "policies:\n  - name: e\n    capacity: 1\n    rate: -1/s", "count must be a number > 0"},
		{"zero refill", "policies:\n  - name: e\n    capacity: 1\n    refill_per_second: 0", "refill: must be > 0"},
		{"refill too slow", "policies:\n  - name: e\n    capacity: 1000000\n    refill_per_second: 0.000001", "a full refill takes"},
		{"window on token bucket", "policies:\n  - name: e\n    capacity: 1\n    rate: 1/s\n    window: 1m", "window: only for"},
		{"window missing", "policies:\n  - name: e\n    algorithm: fixed_window\n    capacity: 1", "window: missing"},
		{"window bad", "policies:\n  - name: e\n    algorithm: fixed_window\n    capacity: 1\n    window: soon", `window: "soon": not a duration`},
		{"window zero", "policies:\n  - name: e\n    algorithm: fixed_window\n    capacity: 1\n    window: 0s", "window: 0s must be between"},
		{"fractional window rate", "policies:\n  - name: e\n    algorithm: fixed_window\n    rate: 1.5/s", "whole number"},
		{"rate and capacity on window", "policies:\n  - name: e\n    algorithm: fixed_window\n    capacity: 1\n    rate: 1/s", "not both"},
		{"refill on window", "policies:\n  - name: e\n    algorithm: fixed_window\n    refill_per_second: 1", "refill_per_second: only for token_bucket"},
		{"algorithm", "policies:\n  - name: e\n    algorithm: leaky\n    capacity: 1\n    rate: 1/s", `algorithm: "leaky"`},
		{"failure mode", "policies:\n  - name: e\n    capacity: 1\n    rate: 1/s\n    failure_mode: maybe", `failure_mode: "maybe"`},
		{"local scale", "policies:\n  - name: e\n    capacity: 1\n    rate: 1/s\n    local_scale: 0", "local_scale: 0 must be in (0, 1]"},
		{"short ttl", "policies:\n  - name: e\n    capacity: 100\n    rate: 1/s\n    idle_ttl: 30s", "idle_ttl: 30s is shorter than 1m40s"},
		{"overcommit", "policies:\n  - name: e\n    capacity: 1\n    rate: 1/s\n    overcommit: 2", "overcommit: 2 must be in [0, 1]"},
		{"min share range", "policies:\n  - name: e\n    capacity: 1\n    rate: 1/s\n    min_share: {eu: 1.5}", "min_share.eu: 1.5"},
		{"min share sum", "policies:\n  - name: e\n    capacity: 1\n    rate: 1/s\n    min_share: {eu: 0.6, us: 0.6}", "add up to 1.2"},
		{"min share region", "policies:\n  - name: e\n    capacity: 1\n    rate: 1/s\n    min_share: {\"e u\": 0.1}", `region "e u"`},
		{"version zero", "policies:\n  - name: e\n    version: 0\n    capacity: 1\n    rate: 1/s", "version: must be >= 1"},
		{"subject", "policies:\n  - name: e\n    subject: Tenant!\n    capacity: 1\n    rate: 1/s", "subject:"},
		{"duplicate", "policies:\n  - name: e\n    capacity: 1\n    rate: 1/s\n  - name: e\n    capacity: 1\n    rate: 1/s", `duplicate: policy "e"`},
		{"capacity huge", "policies:\n  - name: e\n    capacity: 9000000000000000000\n    rate: 1/s", "capacity: 9000000000000000000 is more than"},
		{"capacity above the store bound", "policies:\n  - name: e\n    capacity: 600000000\n    rate: 1000000/s", "capacity: 600000000 is more than 500000000"},
		{"envoy empty domain", "domain: \"\"", "domain: must not be empty"},
		{"envoy unknown field", "domain: d\ndescriptors:\n  - key: a\n    limit: 1", "field limit not found"},
		{"envoy empty key", "domain: d\ndescriptors:\n  - value: a", `descriptor "#1": key: must not be empty`},
		{"envoy bad unit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}",
			`domain "d": descriptor "a": rate_limit.unit: "fortnight"`},
		{"envoy unit with unlimited", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, unlimited: true}", "must not be set when unlimited"},
		{"envoy zero rpu", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 0}", "requests_per_unit: must be > 0"},
		{"envoy duplicate", "domain: d\ndescriptors:\n  - key: a\n    value: b\n  - key: a\n    value: b", `descriptor "a_b": duplicate`},
		{"envoy nested duplicate", "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n      - key: b", `descriptor "a.b": duplicate`},
		{"envoy empty replaces", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: \"\"}]}", "replaces[0].name: must not be empty"},
		{"envoy self replaces", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, name: n, replaces: [{name: n}]}", "own name"},
		{"envoy share threshold", "domain: d\ndescriptors:\n  - key: a\n    share_threshold: true", "share_threshold: only for wildcard"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Parse("p.yaml", []byte(tt.file))
			if err == nil {
				t.Fatalf("no error, set %v", s.Policies())
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error %v does not wrap ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q\nwant it to contain %q", err, tt.want)
			}
		})
	}
}

func TestParseEnvoyPolicies(t *testing.T) {
	s, err := Load("../../examples/policies/envoy-ratelimit.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		unlimited bool
		shadow    bool
		capacity  int64
		window    time.Duration
		limitName string
	}{
		{name: "edge.remote_address", capacity: 100, window: time.Second},
		{name: "edge.tenant", capacity: 600, window: time.Minute},
		{name: "edge.tenant.path", capacity: 300, window: time.Minute},
		{name: envoyPolicyName("edge", "tenant.path_/api/export*"), capacity: 100, window: time.Hour},
		{name: envoyPolicyName("edge", "tenant.path_/api/health"), unlimited: true},
		{name: "edge.tenant_internal.path", unlimited: true},
		{name: "edge.client_id", capacity: 60, window: time.Minute, limitName: "per_client"},
		{name: "edge.client_tier_gold", capacity: 6000, window: time.Minute},
		{name: envoyPolicyName("edge", "user_agent_curl*"), capacity: 2, window: time.Second, shadow: true},
	}
	if s.Len() != len(tests) {
		t.Errorf("%d policies, want %d", s.Len(), len(tests))
	}
	for _, tt := range tests {
		p, ok := s.Get(tt.name)
		if !ok {
			t.Errorf("policy %q missing", tt.name)
			continue
		}
		if p.Unlimited != tt.unlimited || p.Shadow != tt.shadow || p.Envoy.LimitName != tt.limitName {
			t.Errorf("%s: unlimited %v shadow %v name %q", tt.name, p.Unlimited, p.Shadow, p.Envoy.LimitName)
		}
		if !tt.unlimited && (p.Limits.Algorithm != bucket.FixedWindow || p.Limits.Capacity != tt.capacity || p.Limits.Window != tt.window) {
			t.Errorf("%s: limits %+v", tt.name, p.Limits)
		}
		if validateName(p.Name) != nil {
			t.Errorf("%s: invalid name", p.Name)
		}
	}
	if got := s.Domains(); len(got) != 1 || got[0] != "edge" {
		t.Errorf("domains = %v", got)
	}
}

func TestEnvoyPolicyName(t *testing.T) {
	long := strings.Repeat("k", 80)
	tests := []struct{ domain, path, want string }{
		{"edge", "remote_address", "edge.remote_address"},
		{"edge", "tenant.path", "edge.tenant.path"},
		{"edge", "path_/a", "edge.path__a.bcd8546e6be6"},
		{"edge", long, "edge." + strings.Repeat("k", 46) + ".1be1f2d3a6f5"},
	}
	for _, tt := range tests {
		got := envoyPolicyName(tt.domain, tt.path)
		if validateName(got) != nil {
			t.Errorf("%q: invalid %q", tt.path, got)
		}
		if !strings.HasPrefix(got, tt.want[:len(tt.want)-12]) || len(got) != len(tt.want) {
			t.Errorf("envoyPolicyName(%q, %q) = %q, want the shape of %q", tt.domain, tt.path, got, tt.want)
		}
	}
	if envoyPolicyName("edge", "path_/a") == envoyPolicyName("edge", "path_:a") {
		t.Error("distinct paths share a name")
	}
}

func TestKeyVersion(t *testing.T) {
	base := &Policy{Name: "p", Version: 1, Limits: bucket.Limits{Algorithm: bucket.TokenBucket, Capacity: 10, RefillPerSecond: 1, IdleTTL: time.Minute}}
	same := *base
	same.Limits.IdleTTL = time.Hour
	same.Limits.Overcommit = 0.5
	same.FailureMode = FailOpen
	if base.KeyVersion() != same.KeyVersion() {
		t.Error("idle TTL, overcommit or failure mode changed the key version")
	}
	changes := map[string]func(p *Policy){
		"version":   func(p *Policy) { p.Version = 2 },
		"capacity":  func(p *Policy) { p.Limits.Capacity = 11 },
		"refill":    func(p *Policy) { p.Limits.RefillPerSecond = 2 },
		"window":    func(p *Policy) { p.Limits.Window = time.Second },
		"algorithm": func(p *Policy) { p.Limits.Algorithm = bucket.SlidingLog },
		"shards":    func(p *Policy) { p.Limits.Shards = 4 },
	}
	for name, change := range changes {
		p := *base
		change(&p)
		if p.KeyVersion() == base.KeyVersion() {
			t.Errorf("changing %s kept key version %d", name, p.KeyVersion())
		}
	}
}

func TestLoadDirectoryAndMerge(t *testing.T) {
	s, err := Load("../../examples/policies")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Get("exports"); !ok {
		t.Error("own policy missing from directory load")
	}
	if _, ok := s.Get("edge.tenant"); !ok {
		t.Error("Envoy policy missing from directory load")
	}
	ps := s.Policies()
	for i := 1; i < len(ps); i++ {
		if ps[i-1].Name >= ps[i].Name {
			t.Fatalf("not sorted: %q before %q", ps[i-1].Name, ps[i].Name)
		}
	}

	dir := t.TempDir()
	own := "policies:\n  - name: exports\n    capacity: 1\n    rate: 1/s\n"
	if err := os.WriteFile(filepath.Join(dir, "a.yaml"), []byte(own), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "b.yml"), []byte(own), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ignored.txt"), []byte("not yaml ["), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Load(dir)
	if !errors.Is(err, ErrDuplicate) || !strings.Contains(err.Error(), "a.yaml and in ") {
		t.Errorf("duplicate across files: %v", err)
	}

	e1, err := Parse("one.yaml", []byte("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	e2, err := Parse("two.yaml", []byte("domain: d\ndescriptors:\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Merge(e1, e2); !errors.Is(err, ErrDuplicate) || !strings.Contains(err.Error(), `Envoy domain "d" in one.yaml and in two.yaml`) {
		t.Errorf("duplicate domain: %v", err)
	}
	m, err := Merge(e1, nil, &Set{})
	if err != nil || m.Len() != 1 {
		t.Errorf("Merge with nil and zero sets: %v, %d policies", err, m.Len())
	}
	if _, err := Load(filepath.Join(dir, "missing.yaml")); err == nil {
		t.Error("missing file loaded")
	}
	big := make([]byte, MaxFileBytes+1)
	if _, err := Parse("big.yaml", big); !errors.Is(err, ErrInvalid) {
		t.Errorf("oversize file: %v", err)
	}
}

func TestZeroSet(t *testing.T) {
	var s *Set
	if s.Len() != 0 || len(s.Policies()) != 0 {
		t.Error("nil set not empty")
	}
	if _, ok := s.Get("x"); ok {
		t.Error("nil set found a policy")
	}
	m, err := s.MatchDescriptors("d", [][]Entry{{{Key: "a", Value: "b"}}})
	if err != nil || len(m) != 1 || m[0].Policy != nil {
		t.Errorf("nil set matched %+v, %v", m, err)
	}
	var z Set
	if _, ok := z.Get("x"); ok || z.Len() != 0 {
		t.Error("zero set not empty")
	}
}

func TestParseShards(t *testing.T) {
	parse := func(extra string) (*Policy, error) {
		s, err := Parse("p.yaml", []byte("policies:\n  - name: api\n    capacity: 10000\n    rate: 10000/s\n"+extra))
		if err != nil {
			return nil, err
		}
		p, _ := s.Get("api")
		return p, nil
	}
	for _, tc := range []struct {
		extra string
		want  int
	}{
		{"", 0},
		{"    shards: 1\n", 0},
		{"    shards: 6\n", 6},
		{"    shards: 16\n", 16},
		{"    shards: auto\n", 5}, // 10,000/s at 2,000/s a sub-bucket
	} {
		p, err := parse(tc.extra)
		if err != nil {
			t.Fatalf("%q: %v", tc.extra, err)
		}
		if p.Limits.Shards != tc.want {
			t.Errorf("%q: shards %d, want %d", tc.extra, p.Limits.Shards, tc.want)
		}
	}
	s, err := Parse("w.yaml", []byte("policies:\n  - name: w\n    algorithm: fixed_window\n    rate: 100/s\n    shards: auto\n"))
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := s.Get("w"); p.Limits.Shards != 0 {
		t.Errorf("fixed window of 100/s with shards auto: %d sub-buckets, want one bucket", p.Limits.Shards)
	}
	for _, bad := range []string{"0", "17", "-2", "many", "2.5"} {
		_, err := parse("    shards: " + bad + "\n")
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), `policy "api": shards:`) {
			t.Errorf("shards: %s: got %v, want an ErrInvalid naming the policy and field", bad, err)
		}
	}
}

// TestParseEnvoyBurst checks the burst extension: a token bucket at
// requests_per_unit per unit with room for leases, and its errors.
func TestParseEnvoyBurst(t *testing.T) {
	s, err := Parse("e.yaml", []byte("domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 600, burst: 50}\n"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.MatchDescriptors("edge", [][]Entry{{{Key: "tenant", Value: "acme"}}})
	if err != nil {
		t.Fatal(err)
	}
	l := m[0].Policy.Limits
	want := bucket.Limits{Algorithm: bucket.TokenBucket, Capacity: 50, RefillPerSecond: 10, IdleTTL: time.Minute + LeaseHeadroom} // the least idle TTL is a minute
	if l != want {
		t.Fatalf("limits %+v, want %+v", l, want)
	}
	if bucket.MaxLeaseFor(l) < LeaseHeadroom {
		t.Fatalf("MaxLeaseFor %v, want at least %v", bucket.MaxLeaseFor(l), LeaseHeadroom)
	}
	if _, err := Parse("e.yaml", []byte("domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unlimited: true, burst: 5}\n")); err == nil {
		t.Fatal("burst with unlimited accepted")
	}
}
