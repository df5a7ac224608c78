package httplimit_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/quotacoord/quota/httplimit"
)

func mustIdentify(t *testing.T, id httplimit.Identity) httplimit.SubjectFunc {
	t.Helper()
	f, err := httplimit.Identify(id)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestIdentityPrecedence: tenant, then API key, then user, then address.
func TestIdentityPrecedence(t *testing.T) {
	f := mustIdentify(t, httplimit.Identity{
		TenantHeader: "X-Tenant", APIKeyHeader: "X-Api-Key",
		User: func(r *http.Request) string { return r.Header.Get("X-User") },
	})
	sub := func(kind httplimit.IdentityKind, raw string) httplimit.Subject {
		s, err := httplimit.IdentitySubject(kind, raw, 0)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	tests := []struct {
		name    string
		headers map[string]string
		want    httplimit.Subject
	}{
		{"all present: tenant", map[string]string{"X-Tenant": "acme", "X-Api-Key": "k1", "X-User": "a@b.c"}, httplimit.Subject{Value: "acme"}},
		{"key before user", map[string]string{"X-Api-Key": "k1", "X-User": "a@b.c"}, sub(httplimit.KindAPIKey, "k1")},
		{"user before address", map[string]string{"X-User": "a@b.c"}, sub(httplimit.KindUser, "a@b.c")},
		{"blank headers are absent", map[string]string{"X-Tenant": "  ", "X-Api-Key": ""}, sub(httplimit.KindIP, "192.0.2.1")},
		{"address last", nil, sub(httplimit.KindIP, "192.0.2.1")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := httptest.NewRequest("GET", "/", nil)
			req.RemoteAddr = "192.0.2.1:5000"
			for k, v := range tt.headers {
				req.Header.Set(k, v)
			}
			got, err := f(req)
			if err != nil || got != tt.want {
				t.Errorf("got %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

func TestIdentitySubject(t *testing.T) {
	same := [][2]struct {
		kind httplimit.IdentityKind
		raw  string
	}{
		{{httplimit.KindUser, "Alice@Example.COM"}, {httplimit.KindUser, "alice@example.com"}},
		{{httplimit.KindUser, " bob@x.io "}, {httplimit.KindUser, "bob@x.io"}},
		{{httplimit.KindIP, "2001:db8:1:2:aaaa::1"}, {httplimit.KindIP, "2001:db8:1:2:ffff::9"}},
		{{httplimit.KindIP, "::ffff:198.51.100.7"}, {httplimit.KindIP, "198.51.100.7"}},
	}
	for _, p := range same {
		a, errA := httplimit.IdentitySubject(p[0].kind, p[0].raw, 0)
		b, errB := httplimit.IdentitySubject(p[1].kind, p[1].raw, 0)
		if errA != nil || errB != nil || a != b {
			t.Errorf("%q and %q: %+v %v, %+v %v; want one subject", p[0].raw, p[1].raw, a, errA, b, errB)
		}
	}
	differ := [][2]struct {
		kind httplimit.IdentityKind
		raw  string
	}{
		{{httplimit.KindUser, "Alice"}, {httplimit.KindUser, "alice"}},                 // not an e-mail: ids keep their case
		{{httplimit.KindAPIKey, "Key1"}, {httplimit.KindAPIKey, "key1"}},               // keys are case sensitive
		{{httplimit.KindAPIKey, "same"}, {httplimit.KindUser, "same"}},                 // the kind is hashed in
		{{httplimit.KindIP, "2001:db8:1:2::1"}, {httplimit.KindIP, "2001:db8:1:3::1"}}, // another /64
	}
	for _, p := range differ {
		a, _ := httplimit.IdentitySubject(p[0].kind, p[0].raw, 0)
		b, _ := httplimit.IdentitySubject(p[1].kind, p[1].raw, 0)
		if a == b {
			t.Errorf("%s %q and %s %q share subject %+v", p[0].kind, p[0].raw, p[1].kind, p[1].raw, a)
		}
	}
	s, err := httplimit.IdentitySubject(httplimit.KindAPIKey, "sk_live_secret", 0)
	if err != nil || !s.Hash || strings.Contains(s.Value, "secret") || !strings.HasPrefix(s.Value, "api_key_") || len(s.Value) > 96 {
		t.Errorf("API key subject %+v, %v: want hashed here and by the node, no raw text", s, err)
	}
	// A /48 grouping puts two /64s together.
	a, _ := httplimit.IdentitySubject(httplimit.KindIP, "2001:db8:1:2::1", 48)
	b, _ := httplimit.IdentitySubject(httplimit.KindIP, "2001:db8:1:3::1", 48)
	if a != b {
		t.Errorf("/48: %+v != %+v", a, b)
	}
	for _, bad := range []struct {
		kind httplimit.IdentityKind
		raw  string
	}{
		{httplimit.KindTenant, "acme/eu"}, {httplimit.KindIP, "nonsense"}, {httplimit.KindUser, ""},
		{httplimit.KindAPIKey, strings.Repeat("k", httplimit.MaxRawSubject+1)},
	} {
		if _, err := httplimit.IdentitySubject(bad.kind, bad.raw, 0); !errors.Is(err, httplimit.ErrNoSubject) {
			t.Errorf("%s %q: %v, want ErrNoSubject", bad.kind, bad.raw, err)
		}
	}
	if _, err := httplimit.IdentitySubject("cookie", "x", 0); !errors.Is(err, httplimit.ErrInvalidConfig) {
		t.Errorf("unknown kind: %v", err)
	}
}

func TestIdentityValidate(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	for _, tt := range []struct {
		name string
		id   httplimit.Identity
		ok   bool
	}{
		{"zero: the address", httplimit.Identity{}, true},
		{"no source at all", httplimit.Identity{NoIP: true}, false},
		{"bad header name", httplimit.Identity{APIKeyHeader: "X Key"}, false},
		{"prefix too long", httplimit.Identity{IPv6PrefixBits: 129}, false},
		{"proxies without header", httplimit.Identity{Proxies: httplimit.Proxies{Trusted: trusted}}, false},
	} {
		_, err := httplimit.Identify(tt.id)
		if tt.ok != (err == nil) || (err != nil && !errors.Is(err, httplimit.ErrInvalidConfig)) {
			t.Errorf("%s: %v", tt.name, err)
		}
	}
	f := mustIdentify(t, httplimit.Identity{APIKeyHeader: "X-Api-Key", NoIP: true})
	if _, err := f(httptest.NewRequest("GET", "/", nil)); !errors.Is(err, httplimit.ErrNoSubject) {
		t.Errorf("no key, no address allowed: %v", err)
	}
}

// TestIdentityAgainstNode: on a real regional node backed by Redis, the
// spellings of one e-mail address and the addresses of one IPv6 /64 each
// share a single budget; another /64 has its own.
func TestIdentityAgainstNode(t *testing.T) {
	c, names := startNode(t, nodePolicy{name: "calls", subject: "user", capacity: 2})
	l, err := httplimit.New(httplimit.Config{
		Checker:  c,
		Policies: []httplimit.Policy{{Name: names["calls"]}},
		Subject:  mustIdentify(t, httplimit.Identity{User: func(r *http.Request) string { return r.Header.Get("X-User") }}),
	})
	if err != nil {
		t.Fatal(err)
	}
	h := l.Wrap(ok)
	do := func(user, remote string) int {
		req := httptest.NewRequest("GET", "/", nil)
		req.RemoteAddr = remote
		if user != "" {
			req.Header.Set("X-User", user)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			t.Logf("%s from %s: %d %s RateLimit %q", user, remote, rec.Code, strings.TrimSpace(rec.Body.String()), rec.Header().Get("RateLimit"))
		}
		return rec.Code
	}
	steps := []struct {
		user, remote string
		want         int
	}{
		{"Alice@Example.com", "192.0.2.1:1", 200},
		{"alice@example.COM", "192.0.2.2:1", 200},
		{"ALICE@EXAMPLE.COM", "192.0.2.3:1", 429},
		{"bob@example.com", "192.0.2.3:1", 200},
		{"", "[2001:db8:7:1::1]:1", 200},
		{"", "[2001:db8:7:1:ffff::2]:1", 200},
		{"", "[2001:db8:7:1:1234::3]:1", 429},
		{"", "[2001:db8:7:2::1]:1", 200},
	}
	for i, s := range steps {
		if got := do(s.user, s.remote); got != s.want {
			t.Errorf("step %d (%q from %s): %d, want %d", i, s.user, s.remote, got, s.want)
		}
	}
}
