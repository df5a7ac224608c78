package policy

import (
	"errors"
	"strings"
	"testing"

	"github.com/quotacoord/quota/bucket"
)

func e(kv ...string) []Entry {
	out := make([]Entry, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

// TestMatchDescriptorsEnvoy decides the example Envoy configuration (nested
// descriptors, wildcards, defaults, unlimited, shadow mode, replaces) the
// way github.com/envoyproxy/ratelimit does.
func TestMatchDescriptorsEnvoy(t *testing.T) {
	s, err := Load("../../examples/policies/envoy-ratelimit.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// The keys this test reads subjects of; every other value is hashed.
	plain := EnvoySubjects{Salt: "salt", PlainKeys: []string{"tenant", "path", "client_id", "client_tier"}}
	exportRule := envoyPolicyName("edge", "tenant.path_/api/export*")
	healthRule := envoyPolicyName("edge", "tenant.path_/api/health")
	curlRule := envoyPolicyName("edge", "user_agent_curl*")
	type want struct {
		policy    string // "" for no match
		subject   string // "" to skip, "hash" for a hashed subject
		unlimited bool
		shadow    bool
		replaced  bool
	}
	tests := []struct {
		name   string
		domain string
		descs  [][]Entry
		want   []want
	}{
		{"key-only default, each address its own bucket", "edge",
			[][]Entry{e("remote_address", "10.0.0.1"), e("remote_address", "10.0.0.2")},
			[]want{{policy: "edge.remote_address", subject: "hash"}, {policy: "edge.remote_address", subject: "hash"}}},
		{"deeper request than a leaf rule matches nothing", "edge",
			[][]Entry{e("remote_address", "10.0.0.1", "path", "/x")}, []want{{}}},
		{"first level default", "edge",
			[][]Entry{e("tenant", "acme")}, []want{{policy: "edge.tenant", subject: "acme"}}},
		{"nested wildcard beats nested default", "edge",
			[][]Entry{e("tenant", "acme", "path", "/api/exports/2024")}, []want{{policy: exportRule, subject: "hash"}}},
		{"wildcard needs the prefix", "edge",
			[][]Entry{e("tenant", "acme", "path", "/api/expor")}, []want{{policy: "edge.tenant.path", subject: "hash"}}},
		{"nested exact value beats wildcard and default: unlimited", "edge",
			[][]Entry{e("tenant", "acme", "path", "/api/health")}, []want{{policy: healthRule, unlimited: true}}},
		{"nested default", "edge",
			[][]Entry{e("tenant", "acme", "path", "other")}, []want{{policy: "edge.tenant.path", subject: "acme_other"}}},
		{"exact first level leads to its own children", "edge",
			[][]Entry{e("tenant", "internal", "path", "/api/exports/1")}, []want{{policy: "edge.tenant_internal.path", unlimited: true}}},
		{"exact first level without a rate limit limits nothing", "edge",
			[][]Entry{e("tenant", "internal")}, []want{{}}},
		{"more entries than the tree is deep", "edge",
			[][]Entry{e("tenant", "acme", "path", "other", "method", "GET")}, []want{{}}},
		{"unknown key", "edge", [][]Entry{e("colour", "red")}, []want{{}}},
		{"top-level wildcard, shadow", "edge",
			[][]Entry{e("user_agent", "curl/8.5")}, []want{{policy: curlRule, subject: "hash", shadow: true}}},
		{"top-level wildcard without default", "edge", [][]Entry{e("user_agent", "wget")}, []want{{}}},
		{"replaces removes the named limit", "edge",
			[][]Entry{e("client_id", "abc"), e("client_tier", "gold")},
			[]want{{policy: "edge.client_id", subject: "abc", replaced: true}, {policy: "edge.client_tier_gold", subject: "gold"}}},
		{"without the replacing rule the limit holds", "edge",
			[][]Entry{e("client_id", "abc"), e("client_tier", "silver")},
			[]want{{policy: "edge.client_id", subject: "abc"}, {}}},
		{"unknown domain matches nothing", "other",
			[][]Entry{e("tenant", "acme"), e("remote_address", "1")}, []want{{}, {}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := s.Match(tt.domain, tt.descs, plain)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("%d matches, want %d", len(got), len(tt.want))
			}
			for i, w := range tt.want {
				g := got[i]
				name := ""
				if g.Policy != nil {
					name = g.Policy.Name
				}
				if name != w.policy || g.Unlimited != w.unlimited || g.Shadow != w.shadow || g.Replaced != w.replaced {
					t.Errorf("descriptor %d: got %q unlimited=%v shadow=%v replaced=%v, want %+v", i, name, g.Unlimited, g.Shadow, g.Replaced, w)
				}
				switch w.subject {
				case "":
				case "hash":
					if !strings.HasPrefix(g.Subject, "h-") {
						t.Errorf("descriptor %d: subject %q, want a hash", i, g.Subject)
					}
				default:
					if g.Subject != w.subject {
						t.Errorf("descriptor %d: subject %q, want %q", i, g.Subject, w.subject)
					}
				}
				if g.Policy != nil && !g.Unlimited {
					if err := bucket.ValidateSubject(g.Subject); err != nil {
						t.Errorf("descriptor %d: %v", i, err)
					}
				}
			}
		})
	}
}

func TestMatchSubjects(t *testing.T) {
	s, err := Parse("w.yaml", []byte(`domain: w
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: ua
    value: "curl/7*"
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: ua
    value: "curl*"
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: shared
    value: "bot*"
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 3}
`))
	if err != nil {
		t.Fatal(err)
	}
	match := func(d ...[]Entry) []DescriptorMatch {
		t.Helper()
		m, err := s.Match("w", d, EnvoySubjects{PlainKeys: []string{"k", "ua", "shared"}})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	subject := func(kv ...string) string { return match(e(kv...))[0].Subject }

	if got := match(e("ua", "curl/7.1"))[0].Policy.Limits.Capacity; got != 1 {
		t.Errorf("first wildcard in file order should win, capacity %d", got)
	}
	if got := match(e("ua", "curl/8.1"))[0].Policy.Limits.Capacity; got != 2 {
		t.Errorf("second wildcard, capacity %d", got)
	}
	distinct := []string{
		subject("k", "a"), subject("k", "b"), subject("k", "a_b"), subject("k", "a.b"), subject("k", ""),
		subject("k", strings.Repeat("x", 97)), subject("k", "h-abc"),
	}
	seen := map[string]bool{}
	for _, s := range distinct {
		if seen[s] {
			t.Errorf("subject %q derived twice from different values", s)
		}
		seen[s] = true
		if err := bucket.ValidateSubject(s); err != nil {
			t.Error(err)
		}
	}
	if first, again := subject("k", "a.b"), subject("k", "a.b"); subject("k", "a") != "a" || first != again {
		t.Error("subjects not readable or not deterministic")
	}
	if !strings.HasPrefix(subject("k", "h-abc"), "h-") || subject("k", "h-abc") == "h-abc" {
		t.Error("a value that looks like a hash must be hashed")
	}
	if subject("shared", "bot1") != subject("shared", "bot2") {
		t.Error("share_threshold wildcard values should share one subject")
	}
	if subject("ua", "curl/8.1") == subject("ua", "curl/8.2") {
		t.Error("wildcard values without share_threshold should get their own subjects")
	}
}

// TestEnvoySubjectsHashUntrustedValues: descriptor values are untrusted,
// so every one is hashed (salted) unless the operator lists its key as not
// secret, and no raw value is ever a subject by default.
func TestEnvoySubjectsHashUntrustedValues(t *testing.T) {
	s, err := Parse("d.yaml", []byte(`domain: d
descriptors:
  - key: api_key
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 5}
    descriptors:
      - key: api_key
        rate_limit: {unit: second, requests_per_unit: 5}
`))
	if err != nil {
		t.Fatal(err)
	}
	subject := func(subj EnvoySubjects, kv ...string) string {
		t.Helper()
		m, err := s.Match("d", [][]Entry{e(kv...)}, subj)
		if err != nil {
			t.Fatal(err)
		}
		if m[0].Policy == nil {
			t.Fatalf("%v matched no rule", kv)
		}
		if err := bucket.ValidateSubject(m[0].Subject); err != nil {
			t.Fatal(err)
		}
		return m[0].Subject
	}
	const key = "AKIAIOSFODNN7EXAMPLE"
	tenantPlain := EnvoySubjects{Salt: "s1", PlainKeys: []string{"tenant"}}
	tests := []struct {
		name  string
		subj  EnvoySubjects
		kv    []string
		plain string // "" wants a hash
	}{
		{"an API key is hashed by default", EnvoySubjects{}, []string{"api_key", key}, ""},
		{"an API key is hashed with a salt", EnvoySubjects{Salt: "s1"}, []string{"api_key", key}, ""},
		{"an address is hashed by default", EnvoySubjects{}, []string{"remote_address", "203-0-113-77"}, ""},
		{"a tenant is hashed unless listed", EnvoySubjects{}, []string{"tenant", "acme"}, ""},
		{"a listed key stays readable", tenantPlain, []string{"tenant", "acme"}, "acme"},
		{"a listed key next to an unlisted one is hashed", tenantPlain, []string{"tenant", "acme", "api_key", key}, ""},
		{"every key listed: readable", EnvoySubjects{PlainKeys: []string{"api_key", "tenant"}}, []string{"tenant", "acme", "api_key", "k1"}, "acme_k1"},
		{"a listed key whose value looks like a hash is hashed", tenantPlain, []string{"tenant", "h-abc"}, ""},
		{"a listed key whose value is not [A-Za-z0-9-] is hashed", tenantPlain, []string{"tenant", "a.b"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := subject(tt.subj, tt.kv...)
			switch {
			case tt.plain != "" && got != tt.plain:
				t.Errorf("subject %q, want %q", got, tt.plain)
			case tt.plain == "" && !strings.HasPrefix(got, "h-"):
				t.Errorf("subject %q, want a hash", got)
			}
			for i := 1; i < len(tt.kv); i += 2 {
				if tt.plain == "" && strings.Contains(strings.ToLower(got), strings.ToLower(tt.kv[i])) {
					t.Errorf("subject %q holds the raw value %q", got, tt.kv[i])
				}
			}
		})
	}
	if subject(EnvoySubjects{Salt: "a"}, "api_key", key) == subject(EnvoySubjects{Salt: "b"}, "api_key", key) {
		t.Error("the salt does not change the hash")
	}
	if first, again := subject(EnvoySubjects{Salt: "a"}, "api_key", key), subject(EnvoySubjects{Salt: "a"}, "api_key", key); first != again {
		t.Error("hashed subjects are not deterministic")
	}
	if subject(EnvoySubjects{}, "api_key", key) == subject(EnvoySubjects{}, "remote_address", key) {
		t.Error("one value under two rules gives one subject")
	}
	for _, bad := range []EnvoySubjects{
		{PlainKeys: []string{""}},
		{PlainKeys: []string{strings.Repeat("k", MaxEntryBytes+1)}},
		{PlainKeys: make([]string, MaxPlainKeys+1)},
	} {
		if _, err := s.Match("d", [][]Entry{e("tenant", "acme")}, bad); !errors.Is(err, ErrBadDescriptor) {
			t.Errorf("EnvoySubjects with %d plain keys: %v, want ErrBadDescriptor", len(bad.PlainKeys), err)
		}
	}
}

func TestMatchDescriptorsBadInput(t *testing.T) {
	s, err := Load("../../examples/policies/envoy-ratelimit.yaml")
	if err != nil {
		t.Fatal(err)
	}
	many := make([][]Entry, MaxDescriptors+1)
	for i := range many {
		many[i] = e("k", "v")
	}
	deep := make([]Entry, MaxEntries+1)
	for i := range deep {
		deep[i] = Entry{Key: "k", Value: "v"}
	}
	tests := []struct {
		name   string
		domain string
		descs  [][]Entry
	}{
		{"no domain", "", [][]Entry{e("k", "v")}},
		{"long domain", strings.Repeat("d", MaxDomainBytes+1), [][]Entry{e("k", "v")}},
		{"no descriptors", "edge", nil},
		{"too many descriptors", "edge", many},
		{"empty descriptor", "edge", [][]Entry{{}}},
		{"too deep", "edge", [][]Entry{deep}},
		{"empty key", "edge", [][]Entry{e("", "v")}},
		{"long key", "edge", [][]Entry{e(strings.Repeat("k", MaxEntryBytes+1), "v")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := s.MatchDescriptors(tt.domain, tt.descs); !errors.Is(err, ErrBadDescriptor) {
				t.Errorf("err = %v, want ErrBadDescriptor", err)
			}
		})
	}
}

// TestMatchLongValuesHashed: a value longer than MaxEntryBytes (a client
// controls header values) is matched and hashed like any other, even for a
// plain key; two long values that differ only at their end get different
// subjects.
func TestMatchLongValuesHashed(t *testing.T) {
	s, err := Load("../../examples/policies/envoy-ratelimit.yaml")
	if err != nil {
		t.Fatal(err)
	}
	subj := EnvoySubjects{Salt: "s", PlainKeys: []string{"remote_address"}}
	long := strings.Repeat("v", 4*MaxEntryBytes)
	ms, err := s.Match("edge", [][]Entry{e("remote_address", long+"1"), e("remote_address", long+"2")}, subj)
	if err != nil {
		t.Fatalf("long value: %v", err)
	}
	if ms[0].Policy == nil || ms[1].Policy != ms[0].Policy {
		t.Fatalf("long values matched %v and %v, want the remote_address rule", ms[0].Policy, ms[1].Policy)
	}
	if !strings.HasPrefix(ms[0].Subject, "h-") || ms[0].Subject == ms[1].Subject || strings.Contains(ms[0].Subject, "vvvv") {
		t.Fatalf("subjects %q and %q, want two distinct hashes", ms[0].Subject, ms[1].Subject)
	}
}

func BenchmarkMatchDescriptors(b *testing.B) {
	s, err := Load("../../examples/policies/envoy-ratelimit.yaml")
	if err != nil {
		b.Fatal(err)
	}
	descs := [][]Entry{e("tenant", "acme", "path", "/api/exports/2024"), e("client_id", "abc"), e("remote_address", "10.1.2.3")}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.MatchDescriptors("edge", descs); err != nil {
			b.Fatal(err)
		}
	}
}

// TestMatchToReusesRoom: MatchTo writes into the caller's room, overwriting
// what a previous request left there, without allocating anything
// beyond the subject; room of the wrong length is an error.
func TestMatchToReusesRoom(t *testing.T) {
	s, err := Parse("m.yaml", []byte("domain: m\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 10}\n"))
	if err != nil {
		t.Fatal(err)
	}
	room := make([]DescriptorMatch, 1)
	hit := [][]Entry{e("tenant", "acme")}
	if err := s.MatchTo(room, "m", hit, EnvoySubjects{}); err != nil {
		t.Fatal(err)
	}
	want, err := s.Match("m", hit, EnvoySubjects{})
	if err != nil || room[0] != want[0] || room[0].Policy == nil {
		t.Fatalf("MatchTo = %+v, Match = %+v, %v", room[0], want, err)
	}
	if err := s.MatchTo(room, "m", [][]Entry{e("other", "x")}, EnvoySubjects{}); err != nil || room[0] != (DescriptorMatch{}) {
		t.Fatalf("a descriptor with no rule left %+v (%v)", room[0], err)
	}
	to := testing.AllocsPerRun(100, func() { _ = s.MatchTo(room, "m", hit, EnvoySubjects{}) })
	made := testing.AllocsPerRun(100, func() { _, _ = s.Match("m", hit, EnvoySubjects{}) })
	if to > 1 || made != to+1 {
		t.Fatalf("MatchTo allocates %v times (the subject: want at most 1), Match %v (want one more)", to, made)
	}
	if err := s.MatchTo(make([]DescriptorMatch, 2), "m", hit, EnvoySubjects{}); err == nil {
		t.Fatal("MatchTo accepted room for 2 matches of 1 descriptor")
	}
}
