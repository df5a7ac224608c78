package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/quotacoord/quota/client/clienttest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRunHuman(t *testing.T) {
	srv := clienttest.Start(t, map[string]int64{"exports": 2}, nil)
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"-addr", srv.Addr, "-subject", "tenant-a", "-policy", "exports", "-n", "3"}, &out, &errOut)
	if err != nil {
		t.Fatal(err, errOut.String())
	}
	want := []string{
		"#1   allowed  exports: 1 of 2 left, full in 1m0s",
		"#2   allowed  exports: 0 of 2 left, full in 1m0s",
		"#3   DENIED   exports: 0 of 2 left, retry after 1.5s, full in 1m0s",
		"2 allowed, 1 denied of 3 checks",
	}
	if got := strings.Split(strings.TrimSpace(out.String()), "\n"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("output:\n%s\nwant:\n%s", out.String(), strings.Join(want, "\n"))
	}
}

func TestRunJSON(t *testing.T) {
	srv := clienttest.Start(t, map[string]int64{"exports": 5, "daily": 100}, nil)
	var out bytes.Buffer
	err := run(context.Background(), []string{"-addr", srv.Addr, "-subject", "k 1", "-hash", "-policy", "exports, daily", "-cost", "2", "-n", "3", "-json"}, &out, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(&out)
	var got []jsonDecision
	for sc.Scan() {
		var d jsonDecision
		if err := json.Unmarshal(sc.Bytes(), &d); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		got = append(got, d)
	}
	if len(got) != 3 {
		t.Fatalf("%d lines", len(got))
	}
	wantAllowed := []bool{true, true, false}
	wantRemaining := []int64{3, 1, 1}
	for i, d := range got {
		if d.N != i+1 || d.Allowed != wantAllowed[i] || d.Remaining != wantRemaining[i] || d.DecidedBy != "exports" || len(d.Policies) != 2 {
			t.Errorf("line %d: %+v", i, d)
		}
	}
	if got[2].RetryAfterMS != 1500 || got[0].ResetAfterMS != 60000 {
		t.Errorf("durations: %+v", got[2])
	}
}

func TestRunErrors(t *testing.T) {
	srv := clienttest.Start(t, map[string]int64{"exports": 2}, nil)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := lis.Addr().String()
	lis.Close()
	emptyFile, tokenFile := filepath.Join(t.TempDir(), "empty"), filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(emptyFile, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tokenFile, []byte("token-0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		args  []string
		usage bool
		want  string
	}{
		{"no subject", []string{"-policy", "p"}, true, "-subject is required"},
		{"no policy", []string{"-subject", "s"}, true, "-policy is required"},
		{"bad n", []string{"-subject", "s", "-policy", "p", "-n", "0"}, true, "-n must be"},
		{"negative cost", []string{"-subject", "s", "-policy", "p", "-cost", "-1"}, true, "-cost"},
		{"stray argument", []string{"-subject", "s", "-policy", "p", "extra"}, true, "unexpected arguments"},
		{"bad mode", []string{"-subject", "s", "-policy", "p", "-unreachable", "maybe"}, true, "unreachable mode"},
		{"unknown flag", []string{"-bogus"}, false, "flag provided but not defined"},
		{"unknown policy", []string{"-addr", srv.Addr, "-subject", "s", "-policy", "nope"}, false, "NotFound"},
		{"node down", []string{"-addr", dead, "-subject", "s", "-policy", "p", "-timeout", "200ms"}, false, "check 1 against"},
		{"missing ca", []string{"-addr", srv.Addr, "-subject", "s", "-policy", "p", "-ca", "/nonexistent.pem"}, false, "read -ca"},
		{"missing token file", []string{"-addr", srv.Addr, "-subject", "s", "-policy", "p", "-token-file", "/nonexistent"}, false, "read -token-file"},
		{"empty token file", []string{"-addr", srv.Addr, "-subject", "s", "-policy", "p", "-token-file", emptyFile}, true, "is empty"},
		{"token in plaintext off loopback", []string{"-addr", "192.0.2.1:8081", "-subject", "s", "-policy", "p", "-token-file", tokenFile}, true, "bearer token goes only over TLS"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var errOut bytes.Buffer
			err := run(context.Background(), tt.args, &bytes.Buffer{}, &errOut)
			if err == nil {
				t.Fatal("no error")
			}
			if errors.Is(err, errUsage) != tt.usage {
				t.Errorf("usage error %v: %v", tt.usage, err)
			}
			if !strings.Contains(err.Error()+errOut.String(), tt.want) {
				t.Errorf("error %q (stderr %q), want %q", err, errOut.String(), tt.want)
			}
		})
	}
	if err := run(context.Background(), []string{"-h"}, &bytes.Buffer{}, &bytes.Buffer{}); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v", err)
	}
}

func TestRunUnreachableOpen(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := lis.Addr().String()
	lis.Close()
	emptyFile, tokenFile := filepath.Join(t.TempDir(), "empty"), filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(emptyFile, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tokenFile, []byte("token-0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	err = run(context.Background(), []string{"-addr", dead, "-subject", "s", "-policy", "p", "-unreachable", "open", "-timeout", "200ms"}, &out, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "allowed") || !strings.Contains(out.String(), "(degraded: client_open)") {
		t.Errorf("output %q", out.String())
	}
}

func TestRunCancel(t *testing.T) {
	srv := clienttest.Start(t, map[string]int64{"p": 1000}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err := run(ctx, []string{"-addr", srv.Addr, "-subject", "s", "-policy", "p", "-n", "100", "-interval", "50ms"}, &bytes.Buffer{}, &bytes.Buffer{})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err = %v, want the context's error", err)
	}
}

// TestRunTokenOnLoopback: a token goes in plaintext to a loopback node.
func TestRunTokenOnLoopback(t *testing.T) {
	srv := clienttest.Start(t, map[string]int64{"exports": 2}, nil)
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("token-0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"-addr", srv.Addr, "-subject", "s", "-policy", "exports", "-peek", "-token-file", tokenFile}, &out, &errOut); err != nil {
		t.Fatal(err, errOut.String())
	}
}

// TestRunRefund: -refund gives the cost back under each policy and prints
// what each bucket holds; -refund with -peek is a usage error.
func TestRunRefund(t *testing.T) {
	srv := clienttest.Start(t, map[string]int64{"exports": 2, "daily": 5}, nil)
	base := []string{"-addr", srv.Addr, "-subject", "tenant-a", "-policy", "exports,daily"}
	if err := run(context.Background(), append(base, "-n", "2"), &bytes.Buffer{}, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run(context.Background(), append(base, "-refund", "-cost", "1"), &out, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	want := "#1   refunded  exports: 1 of 2 left\n#1   refunded  daily: 4 of 5 left\n"
	if out.String() != want {
		t.Errorf("output:\n%s\nwant:\n%s", out.String(), want)
	}
	if used := srv.Used("exports", "tenant-a"); used != 1 {
		t.Errorf("exports spent %d after two checks and a refund of 1, want 1", used)
	}
	out.Reset()
	if err := run(context.Background(), append(base, "-refund", "-json"), &out, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	var r jsonRefund
	if err := json.Unmarshal([]byte(strings.SplitN(out.String(), "\n", 2)[0]), &r); err != nil || !r.Refunded || r.Remaining != 2 || r.DecidedAt.IsZero() {
		t.Errorf("JSON refund %q: %+v %v", out.String(), r, err)
	}
	if err := run(context.Background(), append(base, "-refund", "-peek"), &bytes.Buffer{}, &bytes.Buffer{}); !errors.Is(err, errUsage) {
		t.Errorf("-refund -peek: %v, want a usage error", err)
	}
}
