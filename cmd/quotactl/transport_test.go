package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// tokenCatcher is a gRPC server on loopback that answers every call
// Unimplemented and records the authorization headers it received.
type tokenCatcher struct {
	addr string
	mu   sync.Mutex
	seen []string
}

func startTokenCatcher(t *testing.T) *tokenCatcher {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tc := &tokenCatcher{addr: l.Addr().String()}
	s := grpc.NewServer(grpc.UnknownServiceHandler(func(_ any, ss grpc.ServerStream) error {
		md, _ := metadata.FromIncomingContext(ss.Context())
		tc.mu.Lock()
		tc.seen = append(tc.seen, md.Get("authorization")...)
		tc.mu.Unlock()
		return status.Error(codes.Unimplemented, "token catcher")
	}))
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Serve(l) }()
	t.Cleanup(func() { s.Stop(); <-done })
	return tc
}

func (tc *tokenCatcher) tokens() []string {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	return append([]string(nil), tc.seen...)
}

// TestPlaintextTokenOffLoopback: an attacker on the network between
// quotactl and a coordinator reached without TLS would read the operator's
// bearer token. quotactl refuses before it connects unless the address is
// loopback, --tls is given or --insecure-plaintext says the operator knows.
// The remote address is routed to a loopback server that records what
// arrives, so the test sees whether the token would have left the machine.
func TestPlaintextTokenOffLoopback(t *testing.T) {
	catcher := startTokenCatcher(t)
	tokenFile := filepath.Join(t.TempDir(), "tokens")
	const secret = "write:fedcba9876543210fedcba"
	if err := os.WriteFile(tokenFile, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var dialed []string
	quotactl := func(args ...string) error {
		var out, errb bytes.Buffer
		root := newRootCmd(&options{stdout: &out, dialer: func(ctx context.Context, addr string) (net.Conn, error) {
			mu.Lock()
			dialed = append(dialed, addr)
			mu.Unlock()
			var d net.Dialer
			return d.DialContext(ctx, "tcp", catcher.addr)
		}})
		root.SetArgs(append([]string{"--token-file", tokenFile, "--timeout", "5s"}, args...))
		root.SetOut(&out)
		root.SetErr(&errb)
		return root.ExecuteContext(context.Background())
	}

	err := quotactl("--coordinator", "192.0.2.10:8091", "policy", "list")
	if err == nil || !strings.Contains(err.Error(), "plaintext") || !strings.Contains(err.Error(), "--insecure-plaintext") {
		t.Errorf("plaintext token to 192.0.2.10: %v, want a refusal naming --tls and --insecure-plaintext", err)
	}
	if d, toks := dialed, catcher.tokens(); len(d) != 0 || len(toks) != 0 {
		t.Fatalf("refused call still dialed %v and sent %q", d, toks)
	}

	// Loopback needs no flag; --insecure-plaintext opens a remote address.
	for _, args := range [][]string{
		{"--coordinator", "127.0.0.1:8091"},
		{"--coordinator", "192.0.2.10:8091", "--insecure-plaintext"},
	} {
		err := quotactl(append(args, "policy", "list")...)
		if err == nil || !strings.Contains(err.Error(), "Unimplemented") {
			t.Fatalf("%v: %v, want the catcher's Unimplemented", args, err)
		}
	}
	if toks := catcher.tokens(); len(toks) != 2 || toks[0] != "Bearer fedcba9876543210fedcba" {
		t.Fatalf("catcher saw %q, want the token twice", toks)
	}
}

func TestTokenMayTravelInPlaintext(t *testing.T) {
	cases := []struct {
		target string
		want   bool
	}{
		{"127.0.0.1:8091", true},
		{"localhost:8091", true},
		{"[::1]:8091", true},
		{"dns:///localhost:8091", true},
		{"dns://8.8.8.8/127.0.0.1:8091", true},
		{"passthrough:///127.0.0.1:8091", true},
		{"unix:///run/quota/operator.sock", true},
		{"unix:relative.sock", true},
		{"unix-abstract:quota", true},
		{"192.0.2.10:8091", false},
		{"coordinator.internal:8091", false},
		{"dns:///coordinator.internal:8091", false},
		{"passthrough:///192.0.2.10:8091", false},
		{":8091", false},
		{"0.0.0.0:8091", false},
		{"xds:///coordinator", false},
		{"", false},
	}
	for _, c := range cases {
		if got := plaintextSafe(c.target); got != c.want {
			t.Errorf("plaintextSafe(%q) = %v, want %v", c.target, got, c.want)
		}
	}
}
