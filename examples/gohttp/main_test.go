package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.uber.org/goleak"

	"github.com/quotacoord/quota/internal/logbuf"
	"github.com/quotacoord/quota/internal/regional"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// start runs fn in a goroutine until the test ends and waits until its
// output matches re; it returns the first submatch.
func start(t *testing.T, name string, re *regexp.Regexp, fn func(ctx context.Context, out io.Writer) error) string {
	t.Helper()
	addr, _ := startStoppable(t, name, re, fn)
	return addr
}

// startStoppable is start that also returns a function stopping fn before
// the test ends (idempotent).
func startStoppable(t *testing.T, name string, re *regexp.Regexp, fn func(ctx context.Context, out io.Writer) error) (string, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := &logbuf.Buffer{}
	errc := make(chan error, 1)
	go func() { errc <- fn(ctx, out) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-errc:
				if err != nil {
					t.Errorf("%s: %v", name, err)
				}
			case <-time.After(20 * time.Second):
				t.Errorf("%s did not stop", name)
			}
		})
	}
	t.Cleanup(stop)
	deadline := time.Now().Add(15 * time.Second)
	for {
		if m := re.FindStringSubmatch(out.String()); m != nil {
			return m[1], stop
		}
		select {
		case err := <-errc:
			errc <- err
			t.Fatalf("%s returned before listening: %v\n%s", name, err, out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never listened:\n%s", name, out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// exportsDoc is the node's policy file for most tests: exports, burst 3,
// refill 0.5/s.
const exportsDoc = `policies:
  - name: exports
    version: 1
    subject: tenant
    capacity: 3
    refill_per_second: 0.5
    failure_mode: closed
`

// startNode runs a real regional node (regional.Run, standalone, the
// in-process store) with the policies of doc and the default grants.
func startNode(t *testing.T, doc string) string {
	t.Helper()
	addr, _ := startStoppableNode(t, doc, "")
	return addr
}

// startNodeGrants is startNode with a grants file of grantsDoc ("": none).
func startNodeGrants(t *testing.T, doc, grantsDoc string) string {
	t.Helper()
	addr, _ := startStoppableNode(t, doc, grantsDoc)
	return addr
}

// startStoppableNode is startNodeGrants that also returns a function
// stopping the node before the test ends.
func startStoppableNode(t *testing.T, doc, grantsDoc string) (string, func()) {
	t.Helper()
	dir := t.TempDir()
	pol := filepath.Join(dir, "policies.yaml")
	if err := os.WriteFile(pol, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	var grantsFile string
	if grantsDoc != "" {
		grantsFile = filepath.Join(dir, "grants.yaml")
		if err := os.WriteFile(grantsFile, []byte(grantsDoc), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return startStoppable(t, "regional node", regexp.MustCompile(`grpc listening on (\S+)`), func(ctx context.Context, out io.Writer) error {
		return regional.Run(ctx, regional.DaemonConfig{Region: "test", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Policies: pol,
			GrantsFile: grantsFile,
			Logger:     hclog.New(&hclog.LoggerOptions{Name: "regional", Output: out, Level: hclog.Warn}), Announce: out})
	})
}

func startService(t *testing.T, args ...string) string {
	t.Helper()
	args = append([]string{"-listen", "127.0.0.1:0"}, args...)
	return "http://" + start(t, "gohttp", regexp.MustCompile(`listening on http://(\S+) `), func(ctx context.Context, out io.Writer) error {
		return run(ctx, args, out)
	})
}

type answer struct {
	code                          int
	retryAfter, rateLimit, policy string
	body                          map[string]map[string]any
}

func post(t *testing.T, url, tenant string) answer {
	t.Helper()
	h := map[string]string{}
	if tenant != "" {
		h["X-Tenant"] = tenant
	}
	return postWith(t, url, h)
}

func postWith(t *testing.T, url string, headers map[string]string) answer {
	t.Helper()
	return postBody(t, url, headers, "")
}

func postBody(t *testing.T, url string, headers map[string]string, body string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/exports", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	a := answer{code: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"),
		rateLimit: resp.Header.Get("RateLimit"), policy: resp.Header.Get("RateLimit-Policy")}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		if err := json.Unmarshal(b, &a.body); err != nil {
			t.Fatalf("%d body %q is not JSON: %v", resp.StatusCode, b, err)
		}
	}
	return a
}

// TestAgainstRegionalNode: a tenant gets its burst of 3 with RateLimit
// fields counting down, then 429 with Retry-After; another tenant is not
// affected.
func TestAgainstRegionalNode(t *testing.T) {
	node := startNode(t, exportsDoc)
	url := startService(t, "-node", node, "-policy", "exports", "-window", "6s")
	wantPolicy := `"exports";q=3;w=6`
	for i, wantR := range []string{"2", "1", "0"} {
		a := post(t, url, "acme")
		if a.code != http.StatusOK {
			t.Fatalf("request %d: %d %v", i+1, a.code, a.body)
		}
		if a.policy != wantPolicy {
			t.Errorf("request %d: RateLimit-Policy %q, want %q", i+1, a.policy, wantPolicy)
		}
		if !strings.HasPrefix(a.rateLimit, `"exports";r=`+wantR+";t=") {
			t.Errorf("request %d: RateLimit %q, want r=%s", i+1, a.rateLimit, wantR)
		}
		if a.retryAfter != "" {
			t.Errorf("request %d admitted with Retry-After %q", i+1, a.retryAfter)
		}
	}
	a := post(t, url, "acme")
	if a.code != http.StatusTooManyRequests {
		t.Fatalf("4th request: %d, want 429", a.code)
	}
	// One token refills in 2 s at 0.5/s: Retry-After is whole seconds,
	// rounded up, at least 1.
	if n, err := strconv.Atoi(a.retryAfter); err != nil || n < 1 || n > 2 {
		t.Errorf("Retry-After %q, want 1 or 2", a.retryAfter)
	}
	if a.policy != wantPolicy || !strings.HasPrefix(a.rateLimit, `"exports";r=0;t=`) {
		t.Errorf("429 headers: RateLimit-Policy %q RateLimit %q", a.policy, a.rateLimit)
	}
	if e := a.body["error"]; e["code"] != "RATE_LIMITED" || e["policy"] != "exports" {
		t.Errorf("429 body %v", a.body)
	}
	if b := post(t, url, "globex"); b.code != http.StatusOK {
		t.Errorf("another tenant: %d, want 200", b.code)
	}
	if b := post(t, url, ""); b.code != http.StatusBadRequest || b.body["error"]["code"] != "INVALID_SUBJECT" {
		t.Errorf("no tenant: %d %v, want 400 INVALID_SUBJECT", b.code, b.body)
	}
}

// TestPlansIdentityAndDimensions: the service with -subject identity,
// plans (-tiers) and an address and a global dimension, against a real
// regional node: two spellings of one e-mail share a budget, the pro plan
// gets its own policy, the RateLimit fields show the most restrictive
// dimension, which then refuses; a refused request charges no dimension;
// an unknown plan is a 400.
func TestPlansIdentityAndDimensions(t *testing.T) {
	node := startNode(t, `policies:
  - {name: exports, subject: user, capacity: 1, refill_per_second: 0.001, failure_mode: closed}
  - {name: exports-pro, subject: tenant, capacity: 4, refill_per_second: 0.001, failure_mode: closed}
  - {name: per-ip, subject: ip, capacity: 5, refill_per_second: 0.001, failure_mode: closed}
  - {name: everything, subject: all, capacity: 100, refill_per_second: 0.001, failure_mode: closed}
`)
	url := startService(t, "-node", node, "-subject", "identity", "-tiers", "pro=exports-pro",
		"-ip-policy", "per-ip", "-global-policy", "everything")
	pro := map[string]string{"X-Tenant": "globex", "X-Plan": "pro"}
	steps := []struct {
		headers   map[string]string
		code      int
		rateLimit string // prefix
	}{
		{map[string]string{"X-User": "Bob@Example.com"}, 200, `"exports";r=0;`},
		{map[string]string{"X-User": "bob@example.COM"}, 429, `"exports";r=0;`},
		// The refused request charged no dimension: the address has 4.
		{pro, 200, `"per-ip";r=3;`},
		{pro, 200, `"per-ip";r=2;`},
		{pro, 200, `"per-ip";r=1;`},
		{pro, 200, `"per-ip";r=0;`},
		// The plan and the address are both spent and wait as long: the
		// plan, checked first, is shown.
		{pro, 429, `"exports-pro";r=0;`},
	}
	for i, s := range steps {
		a := postWith(t, url, s.headers)
		if a.code != s.code || !strings.HasPrefix(a.rateLimit, s.rateLimit) {
			t.Errorf("step %d: %d RateLimit %q, want %d %s… (%v)", i, a.code, a.rateLimit, s.code, s.rateLimit, a.body)
		}
	}
	if a := postWith(t, url, map[string]string{"X-Tenant": "initech", "X-Plan": "platinum"}); a.code != 400 || a.body["error"]["code"] != "INVALID_TIER" {
		t.Errorf("unknown plan: %d %v", a.code, a.body)
	}
}

// TestRefundInvalid: with -refund-invalid, malformed requests (admitted,
// then refused with 400) cost no quota on a node that grants the service
// refund: five of them leave the tenant its whole burst of 2, charged to
// the tenant and to the whole service alike. On a node with the default
// grants (check only) the refund is refused and the malformed requests
// spend the budget.
func TestRefundInvalid(t *testing.T) {
	doc := `policies:
  - {name: exports, subject: tenant, capacity: 2, refill_per_second: 0.001, failure_mode: closed}
  - {name: everything, subject: all, capacity: 2, refill_per_second: 0.001, failure_mode: closed}
`
	for _, tc := range []struct {
		name, grants string
		refunded     bool
		valid        int // admitted valid requests after five malformed ones
	}{
		{"granted", "default: [{actions: [check, refund], policies: ['*']}]", true, 2},
		{"default grants", "", false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := startService(t, "-node", startNodeGrants(t, doc, tc.grants), "-refund-invalid", "-global-policy", "everything")
			acme := map[string]string{"X-Tenant": "acme"}
			for i := range 5 {
				a := postBody(t, url, acme, "{not json")
				if i < 2 || tc.refunded {
					if a.code != http.StatusBadRequest || a.body["error"]["code"] != "INVALID_BODY" || a.body["error"]["refunded"] != tc.refunded {
						t.Fatalf("malformed %d: %d %v, want 400 INVALID_BODY refunded %v", i, a.code, a.body, tc.refunded)
					}
				} else if a.code != http.StatusTooManyRequests {
					t.Fatalf("malformed %d without refunds: %d, want 429 (the budget is spent)", i, a.code)
				}
			}
			valid := 0
			for range 3 {
				if postBody(t, url, acme, `{"report": "q3"}`).code == http.StatusOK {
					valid++
				}
			}
			if valid != tc.valid {
				t.Errorf("%d valid requests admitted after five malformed ones, want %d", valid, tc.valid)
			}
		})
	}
}

// TestNodeUnreachable: with no node the service answers per -unreachable.
func TestNodeUnreachable(t *testing.T) {
	cases := []struct {
		mode string
		code int
	}{
		{"error", http.StatusServiceUnavailable},
		{"open", http.StatusOK},
		{"closed", http.StatusTooManyRequests},
	}
	for _, c := range cases {
		t.Run(c.mode, func(t *testing.T) {
			// Port 1 on loopback: nothing listens there.
			url := startService(t, "-node", "127.0.0.1:1", "-unreachable", c.mode, "-timeout", "200ms")
			if a := post(t, url, "acme"); a.code != c.code {
				t.Errorf("%d, want %d (%v)", a.code, c.code, a.body)
			}
		})
	}
}

// TestEmergencyBucket: three copies of the service share the region; when
// the node stops, this copy keeps a third of the region's share of
// exports (capacity 3: one token), then denies with degraded
// "client_local", and /metrics counts both decisions.
func TestEmergencyBucket(t *testing.T) {
	node, stop := startStoppableNode(t, exportsDoc, "")
	url := startService(t, "-node", node, "-unreachable", "open", "-timeout", "1s",
		"-emergency-clients", "3", "-emergency-capacity", "3", "-emergency-refill", "0.5")
	if a := post(t, url, "acme"); a.code != http.StatusOK {
		t.Fatalf("through the node: %d %v", a.code, a.body)
	}
	stop()
	if a := post(t, url, "acme"); a.code != http.StatusOK {
		t.Fatalf("first check without the node: %d %v", a.code, a.body)
	}
	// The bucket refills a token in 6 s: the next check finds it empty.
	a := post(t, url, "acme")
	if a.code != http.StatusTooManyRequests || a.body["error"]["degraded"] != "client_local" {
		t.Fatalf("second check without the node: %d %v, want 429 by client_local (fail-open would admit it)", a.code, a.body)
	}
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	metrics, _ := io.ReadAll(resp.Body)
	for _, want := range []string{`quota_client_local_decisions_total{outcome="local_allowed"} 1`, `quota_client_local_decisions_total{outcome="local_denied"} 1`} {
		if !bytes.Contains(metrics, []byte(want)) {
			t.Errorf("/metrics lacks %s:\n%s", want, metrics)
		}
	}
}

func TestBadFlags(t *testing.T) {
	cases := [][]string{
		{"-subject", "cookie"},
		{"-unreachable", "maybe"},
		{"-trusted-proxies", "10.0.0.0/99"},
		{"-timeout", "0s"},
		{"-window", "-1s"},
		{"-tiers", "pro"},
		{"-emergency-capacity", "3"},
		{"-emergency-clients", "2"},
		{"-emergency-clients", "2", "-emergency-capacity", "3", "-emergency-refill", "-1"},
		{"-subject", "identity", "-trusted-proxies", "10.0.0.0/8", "-forwarded-header", ""},
		{"extra"},
	}
	for _, args := range cases {
		var out bytes.Buffer
		if err := run(context.Background(), append([]string{"-listen", "127.0.0.1:0"}, args...), &out); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}
