package regional

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/quotacoord/quota/internal/logbuf"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

// runDaemon runs Run(c) on loopback until the test ends and returns its
// gRPC address.
func runDaemon(t *testing.T, c DaemonConfig) string {
	t.Helper()
	out := &logbuf.Buffer{}
	c.GRPCAddr, c.HTTPAddr, c.Announce = "127.0.0.1:0", "127.0.0.1:0", out
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- Run(ctx, c) }()
	t.Cleanup(func() {
		cancel()
		<-errc
	})
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		select {
		case err := <-errc:
			t.Fatalf("Run: %v", err)
		default:
		}
		if m := listenRE.FindStringSubmatch(out.String()); m != nil && m[1] == "grpc" {
			return m[2]
		}
	}
	t.Fatal("Run never listened")
	return ""
}

// TestRunGrantsFile: Run enforces the grants file it is given (here
// peek granted to every caller) and the default without one, reloads the
// file when it changes (keeping the last good one over a bad one), and a
// bad file at start stops it with an error naming the flag.
func TestRunGrantsFile(t *testing.T) {
	dir := writePolicies(t, map[string]string{"own.yaml": "policies:\n  - {name: small, capacity: 3, rate: 3/minute}\n"})
	gfile := filepath.Join(t.TempDir(), "grants.yaml")
	if err := os.WriteFile(gfile, []byte("default: [{actions: [check, peek], policies: [small]}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	peek := &quotav1.CheckRequest{Subject: "s", Policies: []string{"small"}, Peek: true}
	for _, tt := range []struct {
		grants string
		want   codes.Code
	}{{"", codes.PermissionDenied}, {gfile, codes.OK}} {
		addr := runDaemon(t, DaemonConfig{Policies: dir, GrantsFile: tt.grants})
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := quotav1.NewAdmissionClient(conn).Check(ctxT(t), peek); status.Code(err) != tt.want {
			t.Errorf("grants %q: peek %v, want %v", tt.grants, err, tt.want)
		}
	}
	// A revoked grant takes effect without a restart; a bad file then
	// keeps the last good grants.
	addr := runDaemon(t, DaemonConfig{Policies: dir, GrantsFile: gfile, ReloadSettle: 20 * time.Millisecond})
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	adm := quotav1.NewAdmissionClient(conn)
	if _, err := adm.Check(ctxT(t), peek); err != nil {
		t.Fatalf("peek before the revocation: %v", err)
	}
	if err := os.WriteFile(gfile, []byte("default: [{actions: [check], policies: ['*']}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	waitCode := func(want codes.Code, what string) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			_, err := adm.Check(ctxT(t), peek)
			if status.Code(err) == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: peek %v, want %v", what, err, want)
			}
		}
	}
	waitCode(codes.PermissionDenied, "grant revoked in the file")
	if err := os.WriteFile(gfile, []byte("default: [{actions: [check, peek], policies: ['*']}]\ncallers: [{identities: [bogus]}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	waitCode(codes.PermissionDenied, "bad file after the revocation")

	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("default: [{actions: [admin], policies: ['*']}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err = Run(context.Background(), DaemonConfig{Policies: dir, GrantsFile: bad, GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"})
	if err == nil || !strings.Contains(err.Error(), "-grants") || !strings.Contains(err.Error(), "admin") {
		t.Fatalf("bad grants file: %v", err)
	}
}
