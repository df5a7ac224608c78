package httplimit_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/quotacoord/quota/client"
	"github.com/quotacoord/quota/client/clienttest"
	"github.com/quotacoord/quota/httplimit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// checkerFunc adapts a function to httplimit.Checker for edge cases the
// test server does not produce.
type checkerFunc func(context.Context, client.Request) (client.Decision, error)

func (f checkerFunc) Check(ctx context.Context, r client.Request) (client.Decision, error) {
	return f(ctx, r)
}

var ok = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "done") })

type errorJSON struct {
	Error struct {
		Code              string `json:"code"`
		Message           string `json:"message"`
		Policy            string `json:"policy"`
		RetryAfterSeconds int64  `json:"retry_after_seconds"`
		Degraded          string `json:"degraded"`
	} `json:"error"`
}

// TestMiddlewareAgainstNode drives the middleware with the real client over
// gRPC: allowed responses carry the remaining budget, the third request is
// refused with the full 429 contract.
func TestMiddlewareAgainstNode(t *testing.T) {
	srv := clienttest.Start(t, map[string]int64{"exports": 2, "daily": 10}, nil)
	c, err := client.New(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := httplimit.New(httplimit.Config{
		Checker:  c,
		Policies: []httplimit.Policy{{Name: "exports", Window: time.Minute}, {Name: "daily"}},
		Subject:  httplimit.Tenant("X-Tenant"),
	})
	if err != nil {
		t.Fatal(err)
	}
	h := l.Wrap(ok)
	steps := []struct {
		tenant    string
		status    int
		rateLimit string
		retry     string
	}{
		{"acme", 200, `"exports";r=1;t=60, "daily";r=9;t=60`, ""},
		{"acme", 200, `"exports";r=0;t=60, "daily";r=8;t=60`, ""},
		{"acme", 429, `"exports";r=0;t=60, "daily";r=8;t=60`, "2"},
		{"other", 200, `"exports";r=1;t=60, "daily";r=9;t=60`, ""},
	}
	for i, s := range steps {
		req := httptest.NewRequest("GET", "/export", nil)
		req.Header.Set("X-Tenant", s.tenant)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != s.status {
			t.Fatalf("step %d: status %d, body %s", i, rec.Code, rec.Body)
		}
		if got := rec.Header().Get("RateLimit"); got != s.rateLimit {
			t.Errorf("step %d: RateLimit %q, want %q", i, got, s.rateLimit)
		}
		if got, want := rec.Header().Get("RateLimit-Policy"), `"exports";q=2;w=60, "daily";q=10`; got != want {
			t.Errorf("step %d: RateLimit-Policy %q, want %q", i, got, want)
		}
		if got := rec.Header().Get("Retry-After"); got != s.retry {
			t.Errorf("step %d: Retry-After %q, want %q", i, got, s.retry)
		}
		if s.status == 429 {
			var body errorJSON
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatalf("body %q: %v", rec.Body, err)
			}
			if body.Error.Code != "RATE_LIMITED" || body.Error.Policy != "exports" || body.Error.RetryAfterSeconds != 2 ||
				rec.Header().Get("Content-Type") != "application/json" {
				t.Errorf("429 body %+v", body)
			}
		} else if rec.Body.String() != "done" {
			t.Errorf("step %d: handler not called", i)
		}
	}
}

func TestMiddlewareDecisions(t *testing.T) {
	tests := []struct {
		name     string
		decision client.Decision
		err      error
		status   int
		retry    string
		code     string
		rl       string
	}{
		{"retry-after rounds up", client.Decision{Allowed: false, DecidedBy: "p", Limit: 5, RetryAfter: 1200 * time.Millisecond, ResetAfter: 2500 * time.Millisecond},
			nil, 429, "2", "RATE_LIMITED", `"p";r=0;t=3`},
		{"zero retry-after is one second", client.Decision{Allowed: false, DecidedBy: "p", Limit: 5, Degraded: "closed"},
			nil, 429, "1", "RATE_LIMITED", `"p";r=0;t=0`},
		{"exact seconds stay", client.Decision{Allowed: false, DecidedBy: "p", Limit: 5, RetryAfter: 3 * time.Second},
			nil, 429, "3", "RATE_LIMITED", `"p";r=0;t=0`},
		{"client fail-closed has no limits", client.Decision{Allowed: false, Degraded: client.DegradedClientClosed, RetryAfter: time.Second},
			nil, 429, "1", "RATE_LIMITED", ""},
		{"client fail-open passes", client.Decision{Allowed: true, Degraded: client.DegradedClientOpen}, nil, 200, "", "", ""},
		{"allowed with remaining", client.Decision{Allowed: true, DecidedBy: "p", Limit: 100, Remaining: 42, ResetAfter: 4100 * time.Millisecond},
			nil, 200, "", "", `"p";r=42;t=5`},
		{"checker error", client.Decision{}, errors.New("boom"), 503, "", "RATE_LIMIT_UNAVAILABLE", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := httplimit.New(httplimit.Config{
				Checker:  checkerFunc(func(context.Context, client.Request) (client.Decision, error) { return tt.decision, tt.err }),
				Policies: []httplimit.Policy{{Name: "p"}},
				Subject:  httplimit.Header("X-Api-Key"),
			})
			if err != nil {
				t.Fatal(err)
			}
			req := httptest.NewRequest("GET", "/", nil)
			req.Header.Set("X-Api-Key", "secret key")
			rec := httptest.NewRecorder()
			l.Wrap(ok).ServeHTTP(rec, req)
			if rec.Code != tt.status || rec.Header().Get("Retry-After") != tt.retry || rec.Header().Get("RateLimit") != tt.rl {
				t.Errorf("status %d Retry-After %q RateLimit %q", rec.Code, rec.Header().Get("Retry-After"), rec.Header().Get("RateLimit"))
			}
			if tt.code != "" {
				var body errorJSON
				if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || body.Error.Code != tt.code {
					t.Errorf("body %q: %v", rec.Body, err)
				}
			}
		})
	}
}

func TestMiddlewareRequest(t *testing.T) {
	var got client.Request
	l, err := httplimit.New(httplimit.Config{
		Checker: checkerFunc(func(_ context.Context, r client.Request) (client.Decision, error) {
			got = r
			return client.Decision{Allowed: true}, nil
		}),
		Policies: []httplimit.Policy{{Name: "a"}, {Name: "b"}},
		Subject:  httplimit.Header("X-Api-Key"),
		Cost:     func(r *http.Request) int64 { return int64(len(r.URL.Query()["item"])) },
	})
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest("GET", "/?item=1&item=2&item=3", nil)
	req.Header.Set("X-Api-Key", "k-123")
	l.Wrap(ok).ServeHTTP(httptest.NewRecorder(), req)
	if got.Subject != "k-123" || !got.HashSubject || got.Cost != 3 || strings.Join(got.Policies, ",") != "a,b" {
		t.Errorf("request %+v", got)
	}

	rec := httptest.NewRecorder()
	l.Wrap(ok).ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	if rec.Code != 400 || !strings.Contains(rec.Body.String(), "INVALID_SUBJECT") {
		t.Errorf("missing subject: %d %s", rec.Code, rec.Body)
	}
}

func TestNewErrors(t *testing.T) {
	chk := checkerFunc(func(context.Context, client.Request) (client.Decision, error) { return client.Decision{}, nil })
	subj := httplimit.Header("X")
	tests := []struct {
		name string
		cfg  httplimit.Config
	}{
		{"no checker", httplimit.Config{Subject: subj, Policies: []httplimit.Policy{{Name: "p"}}}},
		{"no subject", httplimit.Config{Checker: chk, Policies: []httplimit.Policy{{Name: "p"}}}},
		{"no policies", httplimit.Config{Checker: chk, Subject: subj}},
		{"empty name", httplimit.Config{Checker: chk, Subject: subj, Policies: []httplimit.Policy{{}}}},
		{"duplicate", httplimit.Config{Checker: chk, Subject: subj, Policies: []httplimit.Policy{{Name: "p"}, {Name: "p"}}}},
		{"negative window", httplimit.Config{Checker: chk, Subject: subj, Policies: []httplimit.Policy{{Name: "p", Window: -1}}}},
	}
	for _, tt := range tests {
		if _, err := httplimit.New(tt.cfg); !errors.Is(err, httplimit.ErrInvalidConfig) {
			t.Errorf("%s: %v", tt.name, err)
		}
	}
}

func TestClientAddr(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}
	xff := httplimit.Proxies{Trusted: trusted, Header: "X-Forwarded-For"}
	fwd := httplimit.Proxies{Trusted: trusted, Header: "Forwarded"}
	tests := []struct {
		name    string
		proxies httplimit.Proxies
		remote  string
		headers map[string]string
		want    string // "" for an error
	}{
		{"untrusted peer ignores headers", xff, "203.0.113.9:5000", map[string]string{"X-Forwarded-For": "1.1.1.1"}, "203.0.113.9"},
		{"no trusted proxies ignores headers", httplimit.Proxies{}, "10.0.0.2:5000", map[string]string{"X-Forwarded-For": "1.1.1.1", "Forwarded": "for=1.1.1.1"}, "10.0.0.2"},
		{"trusted peer, one hop", xff, "10.0.0.2:5000", map[string]string{"X-Forwarded-For": "198.51.100.7"}, "198.51.100.7"},
		{"spoofed left entries are skipped", xff, "10.0.0.2:5000", map[string]string{"X-Forwarded-For": "6.6.6.6, 198.51.100.7, 10.0.0.5"}, "198.51.100.7"},
		{"garbage left of the client is never read", xff, "10.0.0.2:5000", map[string]string{"X-Forwarded-For": "nonsense, 198.51.100.7"}, "198.51.100.7"},
		{"all hops trusted: leftmost", xff, "10.0.0.2:5000", map[string]string{"X-Forwarded-For": "10.1.1.1, 10.0.0.5"}, "10.1.1.1"},
		{"trusted peer, no header", xff, "10.0.0.2:5000", nil, "10.0.0.2"},
		{"garbage hop", xff, "10.0.0.2:5000", map[string]string{"X-Forwarded-For": "nonsense"}, ""},
		{"hop with port", xff, "10.0.0.2:5000", map[string]string{"X-Forwarded-For": "198.51.100.7:1234"}, "198.51.100.7"},
		// The attack: the proxy appends X-Forwarded-For only and passes the
		// client's own Forwarded header through.
		{"client Forwarded ignored behind an X-Forwarded-For proxy", xff, "10.0.0.2:5000",
			map[string]string{"Forwarded": "for=192.0.2.1", "X-Forwarded-For": "203.0.113.9"}, "203.0.113.9"},
		{"client Forwarded ignored without X-Forwarded-For", xff, "10.0.0.2:5000",
			map[string]string{"Forwarded": "for=192.0.2.1"}, "10.0.0.2"},
		{"client X-Forwarded-For ignored behind a Forwarded proxy", fwd, "10.0.0.2:5000",
			map[string]string{"X-Forwarded-For": "192.0.2.1", "Forwarded": "for=203.0.113.9"}, "203.0.113.9"},
		{"client X-Real-IP ignored", xff, "10.0.0.2:5000",
			map[string]string{"X-Real-IP": "192.0.2.1", "X-Forwarded-For": "203.0.113.9"}, "203.0.113.9"},
		{"Forwarded, rightmost untrusted", fwd, "10.0.0.2:5000",
			map[string]string{"Forwarded": `for=192.0.2.60;proto=http;by=10.0.0.2, for="[2001:db8:cafe::17]:4711"`}, "2001:db8:cafe::17"},
		{"Forwarded trusted hop skipped", fwd, "10.0.0.2:5000", map[string]string{"Forwarded": `for=192.0.2.60, for=10.9.9.9`}, "192.0.2.60"},
		{"Forwarded quoted with escapes", fwd, "10.0.0.2:5000", map[string]string{"Forwarded": `for="198.51.100.\7"`}, "198.51.100.7"},
		{"Forwarded obfuscated", fwd, "10.0.0.2:5000", map[string]string{"Forwarded": `for=unknown`}, ""},
		{"other header name", httplimit.Proxies{Trusted: trusted, Header: "x-envoy-external-address"}, "10.0.0.2:5000",
			map[string]string{"X-Envoy-External-Address": "198.51.100.7", "X-Forwarded-For": "192.0.2.1"}, "198.51.100.7"},
		{"IPv6 peer", xff, "[2001:db8::1]:443", nil, "2001:db8::1"},
		{"mapped IPv4 peer", xff, "[::ffff:10.0.0.2]:80", map[string]string{"X-Forwarded-For": "198.51.100.7"}, "198.51.100.7"},
		{"bad peer", xff, "somewhere", nil, ""},
		{"too many hops", xff, "10.0.0.2:1", map[string]string{"X-Forwarded-For": strings.Repeat("10.0.0.1,", 40)}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := httptest.NewRequest("GET", "/", nil)
			req.RemoteAddr = tt.remote
			for k, v := range tt.headers {
				req.Header.Set(k, v)
			}
			a, err := httplimit.ClientAddr(req, tt.proxies)
			if tt.want == "" {
				if err == nil || !errors.Is(err, httplimit.ErrNoSubject) {
					t.Errorf("got %v, %v; want ErrNoSubject", a, err)
				}
				return
			}
			if err != nil || a.String() != tt.want {
				t.Errorf("got %v, %v; want %s", a, err, tt.want)
			}
		})
	}
}

func TestProxiesValidate(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	for _, tt := range []struct {
		name string
		p    httplimit.Proxies
		ok   bool
	}{
		{"zero trusts no proxy", httplimit.Proxies{}, true},
		{"X-Forwarded-For", httplimit.Proxies{Trusted: trusted, Header: "X-Forwarded-For"}, true},
		{"Forwarded", httplimit.Proxies{Trusted: trusted, Header: "forwarded"}, true},
		{"trusted proxies without a header", httplimit.Proxies{Trusted: trusted}, false},
		{"header name with a space", httplimit.Proxies{Trusted: trusted, Header: "X Forwarded"}, false},
		{"header name with a colon", httplimit.Proxies{Trusted: trusted, Header: "X-Forwarded-For:"}, false},
		{"invalid prefix", httplimit.Proxies{Trusted: []netip.Prefix{{}}, Header: "X-Forwarded-For"}, false},
	} {
		_, err := httplimit.ClientIP(tt.p)
		if tt.ok != (err == nil) || (err != nil && !errors.Is(err, httplimit.ErrInvalidConfig)) {
			t.Errorf("%s: ClientIP error %v", tt.name, err)
		}
		req := httptest.NewRequest("GET", "/", nil)
		req.RemoteAddr = "10.0.0.2:1"
		if _, err := httplimit.ClientAddr(req, tt.p); tt.ok != (err == nil) {
			t.Errorf("%s: ClientAddr error %v", tt.name, err)
		}
	}
}

func TestSubjectFuncs(t *testing.T) {
	clientIP, err := httplimit.ClientIP(httplimit.Proxies{Trusted: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, Header: "X-Forwarded-For"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		fn      httplimit.SubjectFunc
		remote  string
		header  [2]string
		want    httplimit.Subject
		wantErr bool
	}{
		{"header hashed", httplimit.Header("X-Api-Key"), "1.2.3.4:1", [2]string{"X-Api-Key", " sk_live abc "}, httplimit.Subject{Value: "sk_live abc", Hash: true}, false},
		{"header missing", httplimit.Header("X-Api-Key"), "1.2.3.4:1", [2]string{}, httplimit.Subject{}, true},
		{"header too long", httplimit.Header("X-Api-Key"), "1.2.3.4:1", [2]string{"X-Api-Key", strings.Repeat("k", 1025)}, httplimit.Subject{}, true},
		{"tenant plain", httplimit.Tenant("X-Tenant"), "1.2.3.4:1", [2]string{"X-Tenant", "acme-eu_1"}, httplimit.Subject{Value: "acme-eu_1"}, false},
		{"tenant invalid", httplimit.Tenant("X-Tenant"), "1.2.3.4:1", [2]string{"X-Tenant", "acme/eu"}, httplimit.Subject{}, true},
		{"tenant missing", httplimit.Tenant("X-Tenant"), "1.2.3.4:1", [2]string{}, httplimit.Subject{}, true},
		{"ip v4", clientIP, "10.0.0.1:1", [2]string{"X-Forwarded-For", "198.51.100.7"}, httplimit.Subject{Value: "198.51.100.7", Hash: true}, false},
		{"ip v6 by /64", clientIP, "[2001:db8:1:2:3:4:5:6]:1", [2]string{}, httplimit.Subject{Value: "2001:db8:1:2::/64", Hash: true}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := httptest.NewRequest("GET", "/", nil)
			req.RemoteAddr = tt.remote
			if tt.header[0] != "" {
				req.Header.Set(tt.header[0], tt.header[1])
			}
			got, err := tt.fn(req)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("got %+v, %v", got, err)
			}
		})
	}
}
