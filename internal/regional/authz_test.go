package regional

import (
	"context"
	"crypto/tls"
	"net"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/quotacoord/quota/client"
	"github.com/quotacoord/quota/internal/clock"
	"github.com/quotacoord/quota/internal/grants"
	"github.com/quotacoord/quota/internal/policy"
	"github.com/quotacoord/quota/internal/testca"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

// authzPolicies: an Envoy rule of 3 per minute and an own-API policy of
// capacity 3.
var authzPolicies = map[string]string{
	"sem.yaml": "domain: sem\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 3}\n",
	"own.yaml": "policies:\n  - {name: small, capacity: 3, rate: 3/minute}\n",
}

func envoyReq(d *rlcommon.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "sem", Descriptors: []*rlcommon.RateLimitDescriptor{d}}
}

func refundOf(d *rlcommon.RateLimitDescriptor) *rlcommon.RateLimitDescriptor {
	d.IsNegativeHits = true
	return d
}

func overrideOf(d *rlcommon.RateLimitDescriptor, rpu uint32) *rlcommon.RateLimitDescriptor {
	d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: typev3.RateLimitUnit_MINUTE}
	return d
}

// admitted counts the requests of n tries that Envoy would let through.
func admitted(t *testing.T, c rlsv3.RateLimitServiceClient, ctx context.Context, n int, req func() *rlsv3.RateLimitRequest) int {
	t.Helper()
	k := 0
	for range n {
		r, err := c.ShouldRateLimit(ctx, req())
		if err != nil {
			t.Fatalf("ShouldRateLimit: %v (Envoy admits on an error)", err)
		}
		if r.OverallCode == rlsv3.RateLimitResponse_OK {
			k++
		}
	}
	return k
}

// TestCallerWithoutGrantsCannotLiftLimits is the attack of issue 14 item
// 2 by a caller that merely reaches the node's port, with the default
// grants (check only): refunds with is_negative_hits, a limit override of
// its own, and peeks at another subject's budget. None lifts a limit or
// reads a budget: the refund is charged as a plain hit, the override is
// ignored (the rule decides), the peek is PermissionDenied; each is
// counted.
func TestCallerWithoutGrantsCannotLiftLimits(t *testing.T) {
	clk := clock.NewManual(t0)
	h := startNode(t, Config{Clock: clk, Store: memoryStore(t, clk)}, authzPolicies)
	ctx := ctxT(t)
	// Refund after every hit: 20 tries would all pass with refunds.
	got := 0
	for range 20 {
		got += admitted(t, h.rls, ctx, 1, func() *rlsv3.RateLimitRequest { return envoyReq(desc("k", "victim")) })
		admitted(t, h.rls, ctx, 1, func() *rlsv3.RateLimitRequest { return envoyReq(refundOf(desc("k", "victim"))) })
	}
	if got > 3 {
		t.Errorf("refunds lifted the limit: %d of 20 admitted, rule allows 3", got)
	}
	if got := admitted(t, h.rls, ctx, 20, func() *rlsv3.RateLimitRequest { return envoyReq(overrideOf(desc("k", "own"), 1000)) }); got != 3 {
		t.Errorf("override of 1000/minute: %d of 20 admitted, want the rule's 3", got)
	}
	if _, err := h.adm.Check(ctx, &quotav1.CheckRequest{Subject: "victim", Policies: []string{"small"}, Peek: true}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("peek: %v, want PermissionDenied", err)
	}
	if _, err := h.adm.CheckBatch(ctx, &quotav1.CheckBatchRequest{Checks: []*quotav1.CheckRequest{
		{Subject: "victim", Policies: []string{"small"}, Peek: true}}}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("peek in a batch: %v, want PermissionDenied", err)
	}
	if r, err := h.adm.Check(ctx, &quotav1.CheckRequest{Subject: "victim", Policies: []string{"small"}}); err != nil || !r.Allowed {
		t.Errorf("plain check: %v, %v", r, err)
	}
	if n := counterValue(t, h.reg, "quota_regional_forbidden_actions_total"); n != 20+20+2 {
		t.Errorf("forbidden actions counted %v, want 42", n)
	}
}

// mtlsNode serves a node over mutual TLS: client certificates are
// required and verified against ca.
func mtlsNode(t *testing.T, ca *testca.CA, cfg Config) (*Node, string, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	if cfg.Region == "" {
		cfg.Region = "test"
	}
	if cfg.Store == nil {
		cfg.Store = memoryStore(t, clock.Real{})
	}
	cfg.Local = memoryStore(t, clock.Real{})
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s, err := policy.Load(writePolicies(t, authzPolicies))
	if err != nil {
		t.Fatal(err)
	}
	n.SetPolicies(s)
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.Pool(),
		Certificates: []tls.Certificate{ca.IssuePair(t, "node")}}
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(tc)))
	n.Register(gs)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(l) }()
	t.Cleanup(gs.Stop)
	return n, l.Addr().String(), reg
}

func dialAs(t *testing.T, ca *testca.CA, addr string, cert tls.Certificate) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		MinVersion: tls.VersionTLS12, RootCAs: ca.Pool(), ServerName: "localhost", Certificates: []tls.Certificate{cert}})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TestGrantsByCertificateAndToken: the proxy whose verified certificate
// carries a granted SPIFFE ID may refund, override and peek; another
// client of the same CA may not; a granted bearer token may peek; an
// unknown token is Unauthenticated on the own API and anonymous on the
// Envoy API (an error there would admit).
func TestGrantsByCertificateAndToken(t *testing.T) {
	ca := testca.New(t, "authz-ca")
	g, err := grants.Parse("g.yaml", []byte(`
callers:
  - identities: ["spiffe://cluster.local/ns/edge/sa/envoy"]
    grants: [{actions: [check, refund, override, peek], policies: ["*"]}]
  - identities: ["token:billing"]
    grants: [{actions: [peek], policies: [small]}]
`))
	if err != nil {
		t.Fatal(err)
	}
	toks, err := grants.ParseTokens("t", []byte("billing billing-token-0123456789\n"))
	if err != nil {
		t.Fatal(err)
	}
	_, addr, _ := mtlsNode(t, ca, Config{Grants: g, Tokens: toks})
	ctx := ctxT(t)
	proxy := dialAs(t, ca, addr, ca.IssueIdentity(t, "envoy", []string{"spiffe://cluster.local/ns/edge/sa/envoy"}))
	other := dialAs(t, ca, addr, ca.IssueIdentity(t, "app", []string{"spiffe://cluster.local/ns/app/sa/app"}, "envoy.edge.svc"))

	prls, orls := rlsv3.NewRateLimitServiceClient(proxy), rlsv3.NewRateLimitServiceClient(other)
	// The proxy refunds after every hit: all 10 pass.
	got := 0
	for range 10 {
		got += admitted(t, prls, ctx, 1, func() *rlsv3.RateLimitRequest { return envoyReq(desc("k", "p")) })
		admitted(t, prls, ctx, 1, func() *rlsv3.RateLimitRequest { return envoyReq(refundOf(desc("k", "p"))) })
	}
	if got != 10 {
		t.Errorf("granted refunds: %d of 10 admitted, want 10", got)
	}
	got = 0
	for range 10 {
		got += admitted(t, orls, ctx, 1, func() *rlsv3.RateLimitRequest { return envoyReq(desc("k", "o")) })
		admitted(t, orls, ctx, 1, func() *rlsv3.RateLimitRequest { return envoyReq(refundOf(desc("k", "o"))) })
	}
	if got > 3 {
		t.Errorf("ungranted refunds: %d of 10 admitted, want at most 3", got)
	}
	if got := admitted(t, prls, ctx, 8, func() *rlsv3.RateLimitRequest { return envoyReq(overrideOf(desc("k", "po"), 5)) }); got != 5 {
		t.Errorf("granted override of 5: %d of 8 admitted", got)
	}
	if got := admitted(t, orls, ctx, 8, func() *rlsv3.RateLimitRequest { return envoyReq(overrideOf(desc("k", "oo"), 5)) }); got != 3 {
		t.Errorf("ungranted override of 5: %d of 8 admitted, want the rule's 3", got)
	}

	peek := &quotav1.CheckRequest{Subject: "s", Policies: []string{"small"}, Peek: true}
	if _, err := quotav1.NewAdmissionClient(proxy).Check(ctx, peek); err != nil {
		t.Errorf("granted peek: %v", err)
	}
	if _, err := quotav1.NewAdmissionClient(other).Check(ctx, peek); status.Code(err) != codes.PermissionDenied {
		t.Errorf("ungranted peek: %v, want PermissionDenied", err)
	}
	bearer := func(tok string) context.Context {
		return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
	}
	if _, err := quotav1.NewAdmissionClient(other).Check(bearer("billing-token-0123456789"), peek); err != nil {
		t.Errorf("peek with a granted token: %v", err)
	}
	// The client library sends its token over TLS.
	cl, err := client.New(addr, client.WithBearerToken("billing-token-0123456789"), client.WithTLS(&tls.Config{
		MinVersion: tls.VersionTLS12, RootCAs: ca.Pool(), ServerName: "localhost", Certificates: []tls.Certificate{ca.IssuePair(t, "lib")}}))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if d, err := cl.Check(ctx, client.Request{Subject: "s", Policies: []string{"small"}, Peek: true}); err != nil || !d.Allowed {
		t.Errorf("client.WithBearerToken peek: %+v, %v", d, err)
	}
	if _, err := quotav1.NewAdmissionClient(other).Check(bearer("guessed-token-0123456789"), peek); status.Code(err) != codes.Unauthenticated {
		t.Errorf("unknown token: %v, want Unauthenticated", err)
	}
	if got := admitted(t, orls, bearer("guessed-token-0123456789"), 1, func() *rlsv3.RateLimitRequest { return envoyReq(desc("k", "tok")) }); got != 1 {
		t.Errorf("Envoy request with an unknown token: %d admitted, want decided as anonymous (1)", got)
	}
}

// fixedShares is a ShareSource with one share for every policy.
type fixedShares float64

func (f fixedShares) Share(string, string) float64 { return float64(f) }
func (fixedShares) Ready() bool                    { return true }

// TestOverrideSplitAcrossRegions: a granted override is a policy like any
// other: a region holding a quarter of the matched rule enforces a
// quarter of the override's limit, so four regions admit the override's
// limit once, not four times.
func TestOverrideSplitAcrossRegions(t *testing.T) {
	clk := clock.NewManual(t0)
	h := startNode(t, Config{Clock: clk, Store: memoryStore(t, clk), Shares: fixedShares(0.25), Grants: trusting(t)}, authzPolicies)
	ctx := ctxT(t)
	r, err := h.rls.ShouldRateLimit(ctx, envoyReq(overrideOf(desc("k", "split"), 100)))
	if err != nil {
		t.Fatal(err)
	}
	if rpu := r.Statuses[0].CurrentLimit.GetRequestsPerUnit(); rpu != 25 {
		t.Errorf("current_limit %d per minute, want the region's 25 of 100", rpu)
	}
	if got := 1 + admitted(t, h.rls, ctx, 40, func() *rlsv3.RateLimitRequest { return envoyReq(overrideOf(desc("k", "split"), 100)) }); got != 25 {
		t.Errorf("override of 100 at share 0.25: %d admitted, want 25", got)
	}
}
