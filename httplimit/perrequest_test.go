package httplimit_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quotacoord/quota/client"
	"github.com/quotacoord/quota/httplimit"
)

// planKey is where an authenticating middleware stores the verified
// token's plan claim in these tests.
type planKey struct{}

func withPlan(plan string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if plan != "" {
			r = r.WithContext(context.WithValue(r.Context(), planKey{}, plan))
		}
		h.ServeHTTP(w, r)
	})
}

func planClaim(r *http.Request) (string, error) {
	p, _ := r.Context().Value(planKey{}).(string)
	return p, nil
}

// TestTiersAgainstNode: one handler, the plan claim picks the policy on a
// real regional node: free gets 1, pro gets 3, requests without a plan
// the default policies, an unknown plan is refused before any check.
func TestTiersAgainstNode(t *testing.T) {
	c, names := startNode(t,
		nodePolicy{name: "free", subject: "tenant", capacity: 1},
		nodePolicy{name: "pro", subject: "tenant", capacity: 3},
		nodePolicy{name: "anon", subject: "tenant", capacity: 2})
	l, err := httplimit.New(httplimit.Config{
		Checker:  c,
		Subject:  httplimit.Tenant("X-Tenant"),
		Policies: []httplimit.Policy{{Name: names["anon"]}},
		Tiers: map[string][]httplimit.Policy{
			"free": {{Name: names["free"], Window: time.Hour}},
			"pro":  {{Name: names["pro"], Window: time.Hour}},
		},
		Tier: planClaim,
	})
	if err != nil {
		t.Fatal(err)
	}
	h := l.Wrap(ok)
	admitted := func(plan, tenant string, n int) int {
		got := 0
		for i := 0; i < n; i++ {
			req := httptest.NewRequest("GET", "/", nil)
			req.Header.Set("X-Tenant", tenant)
			rec := httptest.NewRecorder()
			withPlan(plan, h).ServeHTTP(rec, req)
			if rec.Code == http.StatusOK {
				got++
			}
		}
		return got
	}
	if got := admitted("free", "small", 5); got != 1 {
		t.Errorf("free: %d admitted, want 1", got)
	}
	if got := admitted("pro", "big", 5); got != 3 {
		t.Errorf("pro: %d admitted, want 3", got)
	}
	if got := admitted("", "nobody", 5); got != 2 {
		t.Errorf("no plan: %d admitted, want 2", got)
	}
	req := httptest.NewRequest("GET", "/", nil)
	req.Header.Set("X-Tenant", "odd")
	rec := httptest.NewRecorder()
	withPlan("platinum", h).ServeHTTP(rec, req)
	var body errorJSON
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || rec.Code != 400 || body.Error.Code != "INVALID_TIER" {
		t.Errorf("unknown plan: %d %s", rec.Code, rec.Body)
	}
	// The header names the tier's policy and window.
	req = httptest.NewRequest("GET", "/", nil)
	req.Header.Set("X-Tenant", "fresh")
	rec = httptest.NewRecorder()
	withPlan("pro", h).ServeHTTP(rec, req)
	if got, want := rec.Header().Get("RateLimit-Policy"), `"`+names["pro"]+`";q=3;w=3600`; got != want {
		t.Errorf("RateLimit-Policy %q, want %q", got, want)
	}
}

func TestTierConfig(t *testing.T) {
	chk := checkerFunc(func(context.Context, client.Request) (client.Decision, error) { return client.Decision{}, nil })
	subj := httplimit.Header("X")
	tier := func(*http.Request) (string, error) { return "", nil }
	for _, tt := range []struct {
		name string
		cfg  httplimit.Config
	}{
		{"tiers without Tier", httplimit.Config{Checker: chk, Subject: subj, Tiers: map[string][]httplimit.Policy{"a": {{Name: "p"}}}}},
		{"Tier without tiers", httplimit.Config{Checker: chk, Subject: subj, Policies: []httplimit.Policy{{Name: "p"}}, Tier: tier}},
		{"empty tier", httplimit.Config{Checker: chk, Subject: subj, Tier: tier, Tiers: map[string][]httplimit.Policy{"a": nil}}},
		{"unnamed tier", httplimit.Config{Checker: chk, Subject: subj, Tier: tier, Tiers: map[string][]httplimit.Policy{"": {{Name: "p"}}}}},
		{"one policy, two windows", httplimit.Config{Checker: chk, Subject: subj, Tier: tier, Policies: []httplimit.Policy{{Name: "p", Window: time.Second}},
			Tiers: map[string][]httplimit.Policy{"a": {{Name: "p", Window: time.Minute}}}}},
		{"dimensions need an all-or-nothing checker", httplimit.Config{Checker: chk, Subject: subj, Policies: []httplimit.Policy{{Name: "p"}},
			Dimensions: []httplimit.Dimension{{Name: "ip", Subject: subj, Policies: []httplimit.Policy{{Name: "q"}}}}}},
		{"more charges than one check holds", httplimit.Config{Checker: allChecker{chk}, Subject: subj, Policies: []httplimit.Policy{{Name: "p"}},
			Dimensions: []httplimit.Dimension{
				{Name: "a", Subject: subj, Policies: manyPolicies("a", 8)},
				{Name: "b", Subject: subj, Policies: manyPolicies("b", 8)}}}},
	} {
		if _, err := httplimit.New(tt.cfg); !errors.Is(err, httplimit.ErrInvalidConfig) {
			t.Errorf("%s: %v", tt.name, err)
		}
	}
	// A tier function's error is a tier error.
	l, err := httplimit.New(httplimit.Config{Checker: chk, Subject: subj, Tiers: map[string][]httplimit.Policy{"a": {{Name: "p"}}},
		Tier: func(*http.Request) (string, error) { return "", errors.New("token expired") }})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	l.Wrap(ok).ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	if rec.Code != 400 {
		t.Errorf("tier error: %d %s", rec.Code, rec.Body)
	}
}

// TestDimensionsAgainstNode charges API key, client address, endpoint and
// the whole API on a real regional node in one all-or-nothing check; the
// headers carry the most restrictive of the four, the first dimension to
// run out refuses, and a refused request is charged to no dimension.
func TestDimensionsAgainstNode(t *testing.T) {
	c, names := startNode(t,
		nodePolicy{name: "key", subject: "api_key", capacity: 3},
		nodePolicy{name: "ip", subject: "ip", capacity: 2},
		nodePolicy{name: "endpoint", subject: "endpoint", capacity: 4},
		nodePolicy{name: "global", subject: "all", capacity: 6})
	mux := http.NewServeMux()
	mux.Handle("GET /exports/{id}", ok)
	mux.Handle("GET /other", ok)
	ip, err := httplimit.ClientIP(httplimit.Proxies{})
	if err != nil {
		t.Fatal(err)
	}
	global, err := httplimit.Fixed("all")
	if err != nil {
		t.Fatal(err)
	}
	l, err := httplimit.New(httplimit.Config{
		Checker:  c,
		Subject:  httplimit.Header("X-Api-Key"),
		Policies: []httplimit.Policy{{Name: names["key"]}},
		Dimensions: []httplimit.Dimension{
			{Name: "ip", Subject: ip, Policies: []httplimit.Policy{{Name: names["ip"]}}},
			{Name: "endpoint", Subject: httplimit.Endpoint(mux), Policies: []httplimit.Policy{{Name: names["endpoint"]}}},
			{Name: "global", Subject: global, Policies: []httplimit.Policy{{Name: names["global"]}}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	h := l.Wrap(mux)
	steps := []struct {
		key, remote, path string
		status            int
		policy            string // the most restrictive policy in the headers
		remaining         string
	}{
		// key 3, ip 2, endpoint 4, global 6 before the first request.
		{"k1", "192.0.2.1:1", "/exports/1", 200, "ip", "1"},
		{"k2", "192.0.2.1:1", "/exports/2", 200, "ip", "0"},
		{"k3", "192.0.2.1:1", "/exports/3", 429, "ip", "0"},
		// The refused request was charged nowhere: the endpoint had 2
		// left and now 1, as k1 and the new address (the endpoint's
		// bucket takes longest to refill, so it is shown).
		{"k1", "192.0.2.2:1", "/exports/4", 200, "endpoint", "1"},
		{"k4", "192.0.2.3:1", "/exports/5", 200, "endpoint", "0"},
		{"k5", "192.0.2.4:1", "/exports/6", 429, "endpoint", "0"},
		// Another endpoint has its own budget; the whole API has 2 left
		// (not 1: the refused request took none).
		{"k5", "192.0.2.4:1", "/other", 200, "global", "1"},
		{"k3", "192.0.2.5:1", "/other", 200, "global", "0"},
		{"k6", "192.0.2.6:1", "/other", 429, "global", "0"},
	}
	for i, s := range steps {
		req := httptest.NewRequest("GET", s.path, nil)
		req.RemoteAddr = s.remote
		req.Header.Set("X-Api-Key", s.key)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		want := `"` + names[s.policy] + `";r=` + s.remaining
		if rec.Code != s.status || len(rec.Header().Get("RateLimit")) < len(want) || rec.Header().Get("RateLimit")[:len(want)] != want {
			t.Errorf("step %d: %d RateLimit %q; want %d %s", i, rec.Code, rec.Header().Get("RateLimit"), s.status, want)
		}
		if s.status == 429 {
			var body errorJSON
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || body.Error.Policy != names[s.policy] {
				t.Errorf("step %d: body %s, want policy %s", i, rec.Body, names[s.policy])
			}
		}
	}
}

func TestMostRestrictive(t *testing.T) {
	pd := func(name string, allowed bool, rem int64, retry, reset time.Duration) client.PolicyDecision {
		return client.PolicyDecision{Policy: name, Allowed: allowed, Limit: 10, Remaining: rem, RetryAfter: retry, ResetAfter: reset}
	}
	dec := func(ps ...client.PolicyDecision) client.Decision {
		d := client.Decision{Allowed: true, Policies: ps}
		for _, p := range ps {
			d.Allowed = d.Allowed && p.Allowed
		}
		return d
	}
	tests := []struct {
		name    string
		in      []client.Decision
		allowed bool
		policy  string
		retry   time.Duration
	}{
		{"least remaining", []client.Decision{dec(pd("a", true, 5, 0, time.Second)), dec(pd("b", true, 2, 0, time.Second))}, true, "b", 0},
		{"tie: longer reset", []client.Decision{dec(pd("a", true, 2, 0, time.Second)), dec(pd("b", true, 2, 0, time.Minute))}, true, "b", 0},
		{"a denial beats any admission", []client.Decision{dec(pd("a", true, 0, 0, time.Hour)), dec(pd("b", false, 0, time.Second, 0))}, false, "b", time.Second},
		{"longest wait among denials", []client.Decision{dec(pd("a", false, 0, 3*time.Second, 0)), dec(pd("b", false, 0, time.Second, 0))}, false, "a", 3 * time.Second},
		{"client-made denial", []client.Decision{dec(pd("a", true, 5, 0, 0)), {Allowed: false, Degraded: client.DegradedClientClosed, RetryAfter: time.Second}}, false, "", time.Second},
		{"client-made admission", []client.Decision{{Allowed: true, Degraded: client.DegradedClientOpen}}, true, "", 0},
	}
	for _, tt := range tests {
		got := httplimit.MostRestrictive(tt.in)
		if got.Allowed != tt.allowed || got.DecidedBy != tt.policy || got.RetryAfter != tt.retry {
			t.Errorf("%s: %+v", tt.name, got)
		}
	}
}

// allChecker adds a CheckAll that is never reached to a Checker.
type allChecker struct{ checkerFunc }

func (allChecker) CheckAll(context.Context, []client.Charge) (client.Decision, error) {
	return client.Decision{}, errors.New("not reached: New refuses the config")
}

func manyPolicies(prefix string, n int) []httplimit.Policy {
	ps := make([]httplimit.Policy, n)
	for i := range ps {
		ps[i] = httplimit.Policy{Name: fmt.Sprintf("%s%d", prefix, i)}
	}
	return ps
}

// TestRefundNeedsGrant: Limiter.Refund asks the node to give a request's
// charges back; a node with the default grants (check only) refuses it
// and the budget stays spent. A Checker that cannot refund is
// ErrNoRefunder.
func TestRefundNeedsGrant(t *testing.T) {
	c, names := startNode(t, nodePolicy{name: "key", subject: "api_key", capacity: 1}, nodePolicy{name: "global", subject: "all", capacity: 5})
	global, err := httplimit.Fixed("all")
	if err != nil {
		t.Fatal(err)
	}
	l, err := httplimit.New(httplimit.Config{Checker: c, Subject: httplimit.Header("X-Api-Key"), Policies: []httplimit.Policy{{Name: names["key"]}},
		Dimensions: []httplimit.Dimension{{Name: "global", Subject: global, Policies: []httplimit.Policy{{Name: names["global"]}}}}})
	if err != nil {
		t.Fatal(err)
	}
	serve := func() (*http.Request, int) {
		req := httptest.NewRequest("POST", "/", nil)
		req.Header.Set("X-Api-Key", "k")
		rec := httptest.NewRecorder()
		l.Wrap(ok).ServeHTTP(rec, req)
		return req, rec.Code
	}
	req, code := serve()
	if code != http.StatusOK {
		t.Fatalf("first request: %d", code)
	}
	if err := l.Refund(req); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("refund without the grant: %v, want PermissionDenied", err)
	}
	if _, code := serve(); code != http.StatusTooManyRequests {
		t.Fatalf("after a refused refund: %d, want 429", code)
	}
	chk := checkerFunc(func(context.Context, client.Request) (client.Decision, error) {
		return client.Decision{Allowed: true}, nil
	})
	l2, err := httplimit.New(httplimit.Config{Checker: chk, Subject: httplimit.Header("X-Api-Key"), Policies: []httplimit.Policy{{Name: "p"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := l2.Refund(req); !errors.Is(err, httplimit.ErrNoRefunder) {
		t.Fatalf("refund through a plain Checker: %v, want ErrNoRefunder", err)
	}
}
