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

	"github.com/quotacoord/quota/internal/grpctest"
)

// TestPlaintextTokenOffLoopback: an attacker on the network between
// quotactl and a coordinator reached without TLS would read the operator's
// bearer token. quotactl refuses before it connects unless the address is
// loopback, --tls is given or --insecure-plaintext says the operator knows.
// The remote address is routed to a loopback server that records what
// arrives, so the test sees whether the token would have left the machine.
func TestPlaintextTokenOffLoopback(t *testing.T) {
	catcher := grpctest.StartTokenTap(t)
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
			return d.DialContext(ctx, "tcp", catcher.Addr)
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
	if d, toks := dialed, catcher.Tokens(); len(d) != 0 || len(toks) != 0 {
		t.Fatalf("refused call still dialed %v and sent %q", d, toks)
	}

	// Loopback needs no flag; --insecure-plaintext opens a remote address.
	for _, args := range [][]string{
		{"--coordinator", "127.0.0.1:8091"},
		{"--coordinator", "192.0.2.10:8091", "--insecure-plaintext"},
	} {
		err := quotactl(append(args, "policy", "list")...)
		if err == nil || !strings.Contains(err.Error(), "Unimplemented") {
			t.Fatalf("%v: %v, want the tap's Unimplemented", args, err)
		}
	}
	if toks := catcher.Tokens(); len(toks) != 2 || toks[0] != "Bearer fedcba9876543210fedcba" {
		t.Fatalf("tap saw %q, want the token twice", toks)
	}
}
