package client_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quotacoord/quota/client"
	"github.com/quotacoord/quota/client/clienttest"
	"github.com/quotacoord/quota/internal/testca"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newClient(t *testing.T, addr string, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.New(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestCheckDecisions(t *testing.T) {
	srv := clienttest.Start(t, map[string]int64{"exports": 3, "daily": 100}, nil)
	c := newClient(t, srv.Addr)
	ctx := context.Background()
	steps := []struct {
		req           client.Request
		allowed       bool
		decidedBy     string
		remaining     int64
		retryAfter    time.Duration
		replayed      bool
		policyAllowed []bool
	}{
		{client.Request{Subject: "tenant-a", Policies: []string{"exports"}}, true, "exports", 2, 0, false, []bool{true}},
		{client.Request{Subject: "tenant-a", Policies: []string{"exports"}, Cost: 2}, true, "exports", 0, 0, false, []bool{true}},
		{client.Request{Subject: "tenant-a", Policies: []string{"exports"}}, false, "exports", 0, clienttest.RetryAfter, false, []bool{false}},
		{client.Request{Subject: "tenant-a", Policies: []string{"exports"}, Peek: true}, true, "exports", 0, 0, false, []bool{true}},
		{client.Request{Subject: "tenant-b", Policies: []string{"daily", "exports"}, IdempotencyKey: "k1"}, true, "exports", 2, 0, false, []bool{true, true}},
		{client.Request{Subject: "tenant-b", Policies: []string{"daily", "exports"}, IdempotencyKey: "k1"}, true, "exports", 2, 0, true, []bool{true, true}},
		{client.Request{Subject: "tenant-b", Policies: []string{"daily", "exports"}, Cost: 3}, false, "exports", 2, clienttest.RetryAfter, false, []bool{true, false}},
	}
	for i, s := range steps {
		d, err := c.Check(ctx, s.req)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if d.Allowed != s.allowed || d.DecidedBy != s.decidedBy || d.Remaining != s.remaining || d.RetryAfter != s.retryAfter ||
			d.Replayed != s.replayed || d.Degraded != "" || d.ResetAfter != clienttest.ResetAfter {
			t.Errorf("step %d: got %+v", i, d)
		}
		if len(d.Policies) != len(s.policyAllowed) {
			t.Fatalf("step %d: %d policy decisions", i, len(d.Policies))
		}
		for j, pd := range d.Policies {
			if pd.Policy != s.req.Policies[j] || pd.Allowed != s.policyAllowed[j] || pd.Share != 1 {
				t.Errorf("step %d policy %d: %+v", i, j, pd)
			}
		}
	}
	if got := srv.Used("daily", "tenant-b"); got != 1 {
		t.Errorf("idempotent retry charged again: daily used %d", got)
	}

	d, err := c.Allow(ctx, "tenant-c", "exports", 3)
	if err != nil || !d.Allowed || d.Remaining != 0 {
		t.Errorf("Allow: %+v, %v", d, err)
	}
	srv.SetDegraded("local")
	d, err = c.Allow(ctx, "tenant-d", "exports", 1)
	if err != nil || d.Degraded != "local" {
		t.Errorf("node's degraded mode not surfaced: %+v, %v", d, err)
	}
}

func TestCheckBatch(t *testing.T) {
	srv := clienttest.Start(t, map[string]int64{"p": 1}, nil)
	c := newClient(t, srv.Addr)
	ds, err := c.CheckBatch(context.Background(), []client.Request{
		{Subject: "a", Policies: []string{"p"}},
		{Subject: "a", Policies: []string{"p"}},
		{Subject: "b", Policies: []string{"p"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 3 || !ds[0].Allowed || ds[1].Allowed || !ds[2].Allowed {
		t.Errorf("batch = %+v", ds)
	}
	if _, err := c.CheckBatch(context.Background(), nil); !errors.Is(err, client.ErrInvalidRequest) {
		t.Errorf("empty batch: %v", err)
	}
	if _, err := c.CheckBatch(context.Background(), []client.Request{{Subject: "a"}}); !errors.Is(err, client.ErrInvalidRequest) {
		t.Errorf("bad entry: %v", err)
	}
}

func TestRequestErrors(t *testing.T) {
	srv := clienttest.Start(t, map[string]int64{"p": 5}, nil)
	// Fail-open must not turn a refused request into an admission.
	c := newClient(t, srv.Addr, client.WithUnreachable(client.UnreachableOpen))
	tests := []struct {
		name string
		req  client.Request
		code codes.Code // 0: a local ErrInvalidRequest
	}{
		{"empty subject", client.Request{Policies: []string{"p"}}, 0},
		{"no policies", client.Request{Subject: "s"}, 0},
		{"too many policies", client.Request{Subject: "s", Policies: make([]string, 17)}, 0},
		{"empty policy", client.Request{Subject: "s", Policies: []string{""}}, 0},
		{"negative cost", client.Request{Subject: "s", Policies: []string{"p"}, Cost: -1}, 0},
		{"long idempotency key", client.Request{Subject: "s", Policies: []string{"p"}, IdempotencyKey: strings.Repeat("k", 129)}, 0},
		{"invalid subject", client.Request{Subject: "a b", Policies: []string{"p"}}, codes.InvalidArgument},
		{"unknown policy", client.Request{Subject: "s", Policies: []string{"nope"}}, codes.NotFound},
		{"cost above capacity", client.Request{Subject: "s", Policies: []string{"p"}, Cost: 6}, codes.InvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := c.Check(context.Background(), tt.req)
			if err == nil {
				t.Fatalf("no error, decision %+v", d)
			}
			if tt.code == 0 {
				if !errors.Is(err, client.ErrInvalidRequest) {
					t.Errorf("err = %v, want ErrInvalidRequest", err)
				}
				return
			}
			if got := status.Code(errors.Unwrap(err)); got != tt.code {
				t.Errorf("code = %v (%v), want %v", got, err, tt.code)
			}
		})
	}
	// A raw, hashed subject is fine.
	if d, err := c.Check(context.Background(), client.Request{Subject: "key with spaces", HashSubject: true, Policies: []string{"p"}}); err != nil || !d.Allowed {
		t.Errorf("hashed subject: %+v, %v", d, err)
	}
}

func TestUnreachable(t *testing.T) {
	slow := clienttest.Start(t, map[string]int64{"p": 5}, nil)
	slow.SetDelay(2 * time.Second)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := lis.Addr().String()
	lis.Close() // nothing listens here any more

	tests := []struct {
		name     string
		addr     string
		mode     client.Unreachable
		allowed  bool
		degraded string
		wantErr  bool
	}{
		{"refused, error", closed, client.UnreachableError, false, "", true},
		{"refused, open", closed, client.UnreachableOpen, true, client.DegradedClientOpen, false},
		{"refused, closed", closed, client.UnreachableClosed, false, client.DegradedClientClosed, false},
		{"timeout, error", slow.Addr, client.UnreachableError, false, "", true},
		{"timeout, open", slow.Addr, client.UnreachableOpen, true, client.DegradedClientOpen, false},
		{"timeout, closed", slow.Addr, client.UnreachableClosed, false, client.DegradedClientClosed, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newClient(t, tt.addr, client.WithUnreachable(tt.mode), client.WithTimeout(100*time.Millisecond),
				client.WithUnreachableRetryAfter(3*time.Second))
			start := time.Now()
			d, err := c.Allow(context.Background(), "s", "p", 1)
			if elapsed := time.Since(start); elapsed > time.Second {
				t.Errorf("took %v, the timeout is 100ms", elapsed)
			}
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			if tt.wantErr {
				return
			}
			if d.Allowed != tt.allowed || d.Degraded != tt.degraded || d.Cause == nil {
				t.Errorf("decision %+v", d)
			}
			if !d.Allowed && d.RetryAfter != 3*time.Second {
				t.Errorf("closed retry-after %v", d.RetryAfter)
			}
		})
	}

	t.Run("caller cancel is an error, not a decision", func(t *testing.T) {
		c := newClient(t, slow.Addr, client.WithUnreachable(client.UnreachableOpen), client.WithTimeout(time.Second))
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		if d, err := c.Allow(ctx, "s", "p", 1); err == nil {
			t.Errorf("decision %+v after the caller's deadline", d)
		}
	})
	t.Run("batch, open", func(t *testing.T) {
		c := newClient(t, closed, client.WithUnreachable(client.UnreachableOpen))
		ds, err := c.CheckBatch(context.Background(), []client.Request{{Subject: "a", Policies: []string{"p"}}, {Subject: "b", Policies: []string{"p"}}})
		if err != nil || len(ds) != 2 || !ds[0].Allowed || ds[1].Degraded != client.DegradedClientOpen {
			t.Errorf("batch: %+v, %v", ds, err)
		}
	})
}

func TestNewOptions(t *testing.T) {
	tests := []struct {
		name string
		addr string
		opts []client.Option
	}{
		{"empty address", "", nil},
		{"bad mode", "127.0.0.1:1", []client.Option{client.WithUnreachable("maybe")}},
		{"zero timeout", "127.0.0.1:1", []client.Option{client.WithTimeout(0)}},
		{"negative retry", "127.0.0.1:1", []client.Option{client.WithUnreachableRetryAfter(-time.Second)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if c, err := client.New(tt.addr, tt.opts...); !errors.Is(err, client.ErrInvalidConfig) {
				if c != nil {
					c.Close()
				}
				t.Errorf("err = %v, want ErrInvalidConfig", err)
			}
		})
	}
}

func TestTLS(t *testing.T) {
	ca := testca.New(t, "clienttest-ca")
	srv := clienttest.Start(t, map[string]int64{"p": 5}, &tls.Config{Certificates: []tls.Certificate{ca.IssuePair(t, "clienttest")}, MinVersion: tls.VersionTLS12})

	// The handshake under -race on a loaded machine can take longer than
	// the default 250ms.
	c := newClient(t, srv.Addr, client.WithTLS(&tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}), client.WithTimeout(5*time.Second))
	if d, err := c.Allow(context.Background(), "s", "p", 1); err != nil || !d.Allowed {
		t.Fatalf("TLS check: %+v, %v", d, err)
	}
	plain := newClient(t, srv.Addr, client.WithTimeout(time.Second))
	if _, err := plain.Allow(context.Background(), "s", "p", 1); err == nil {
		t.Error("plaintext client talked to a TLS server")
	}
	untrusting := newClient(t, srv.Addr, client.WithTLS(&tls.Config{MinVersion: tls.VersionTLS12}), client.WithTimeout(time.Second))
	if _, err := untrusting.Allow(context.Background(), "s", "p", 1); err == nil {
		t.Error("client accepted an unknown certificate")
	}
}

// TestBearerTokenNeedsTLSOffLoopback: a bearer token is never sent in
// plaintext to a remote address; to loopback (a mesh sidecar) it may be.
func TestBearerTokenNeedsTLSOffLoopback(t *testing.T) {
	for _, tt := range []struct {
		addr string
		tls  bool
		ok   bool
	}{
		{"10.0.0.5:8081", false, false},
		{"quota.internal:8081", false, false},
		{"dns:///quota.internal:8081", false, false},
		{"127.0.0.1:8081", false, true},
		{"[::1]:8081", false, true},
		{"localhost:8081", false, true},
		{"10.0.0.5:8081", true, true},
	} {
		opts := []client.Option{client.WithBearerToken("token-0123456789abcdef")}
		if tt.tls {
			opts = append(opts, client.WithTLS(&tls.Config{MinVersion: tls.VersionTLS12}))
		}
		c, err := client.New(tt.addr, opts...)
		if tt.ok != (err == nil) || (err != nil && !errors.Is(err, client.ErrInvalidConfig)) {
			t.Errorf("New(%s, tls %v) = %v, want ok %v", tt.addr, tt.tls, err, tt.ok)
		}
		if c != nil {
			c.Close()
		}
	}
}

// TestClienttestCheckAll: the stand-in server decides CheckAll all or
// nothing and refunds, as a node does, so callers can test against it.
func TestClienttestCheckAll(t *testing.T) {
	srv := clienttest.Start(t, map[string]int64{"key": 5, "ip": 1}, nil)
	c := newClient(t, srv.Addr)
	ctx := context.Background()
	charges := []client.Charge{{Policy: "key", Subject: "k"}, {Policy: "ip", Subject: "192.0.2.1", HashSubject: true}}
	for i, want := range []bool{true, false} {
		d, err := c.CheckAll(ctx, charges)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed != want || d.DecidedBy != "ip" || d.DecidedAt.IsZero() || len(d.Policies) != 2 {
			t.Fatalf("check %d: %+v, want allowed %v decided by ip", i, d, want)
		}
	}
	if used := srv.Used("key", "k"); used != 1 {
		t.Fatalf("key spent %d after one admission and one denial, want 1", used)
	}
	rs, err := c.Refund(ctx, charges[1:])
	if err != nil || len(rs) != 1 || !rs[0].Refunded || rs[0].Remaining != 1 {
		t.Fatalf("refund: %+v %v", rs, err)
	}
	if d, err := c.CheckAll(ctx, charges); err != nil || !d.Allowed {
		t.Fatalf("after the refund: %+v %v", d, err)
	}
}
