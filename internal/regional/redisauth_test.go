package regional

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quotacoord/quota/internal/redistest"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

// TestRedisAuth: a node reaches a real redis-server that requires a
// password, as the default user (password from a file) or as an ACL user
// (password from QUOTA_REDIS_PASSWORD, here RedisPassword), with a
// host:port or a URL, and its checks are decided by Redis (a closed policy
// is not degraded). A wrong or missing password stops Run at start with
// an error saying Redis refused the credentials, without the password.
func TestRedisAuth(t *testing.T) {
	const userPW, defaultPW = "user-s3cret", "default-s3cret"
	srv := redistest.Start(t)
	redistest.RequireAuth(t, srv.Addr, "limiter", userPW, defaultPW)
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	defaultFile, wrongFile := file("default", defaultPW+"\n"), file("wrong", "nope\n")
	pol := writePolicies(t, map[string]string{"p.yaml": "policies:\n  - {name: auth-closed, capacity: 5, rate: 5/hour, failure_mode: closed}\n"})
	for _, tt := range []struct {
		name string
		c    DaemonConfig
	}{
		{"default user, password file", DaemonConfig{Redis: srv.Addr, RedisPasswordFile: defaultFile}},
		{"ACL user, password from the environment", DaemonConfig{Redis: srv.Addr, RedisUsername: "limiter", RedisPassword: userPW}},
		{"URL, ACL user", DaemonConfig{Redis: "redis://" + srv.Addr + "/0", RedisUsername: "limiter", RedisPassword: userPW}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tt.c.Policies, tt.c.StoreTimeout = pol, 2*time.Second
			adm, out, _ := nodeAdmission(t, tt.c)
			r, err := adm.Check(ctxT(t), &quotav1.CheckRequest{Subject: redistest.Unique(t), Policies: []string{"auth-closed"}})
			if err != nil || !r.Allowed || r.Degraded != "" {
				t.Fatalf("check: %v, %v\n%s", r, err, out.String())
			}
		})
	}
	for _, tt := range []struct {
		name string
		c    DaemonConfig
	}{
		{"no password", DaemonConfig{Redis: srv.Addr}},
		{"wrong password file", DaemonConfig{Redis: srv.Addr, RedisPasswordFile: wrongFile}},
		{"ACL user, default user's password", DaemonConfig{Redis: srv.Addr, RedisUsername: "limiter", RedisPassword: defaultPW}},
		{"URL, wrong password", DaemonConfig{Redis: "redis://limiter:wrong-s3cret@" + srv.Addr}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tt.c.Policies, tt.c.GRPCAddr, tt.c.HTTPAddr = pol, "127.0.0.1:0", "127.0.0.1:0"
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := Run(ctx, tt.c)
			if err == nil || !strings.Contains(err.Error(), "redis refused the credentials") || strings.Contains(err.Error(), "s3cret") {
				t.Fatalf("Run: %v, want a start error saying Redis refused the credentials, without the password", err)
			}
		})
	}
	for _, tt := range []struct {
		name string
		c    DaemonConfig
		err  string
	}{
		{"empty password file", DaemonConfig{Redis: srv.Addr, RedisPasswordFile: file("empty", "\n")}, "is empty"},
		{"missing password file", DaemonConfig{Redis: srv.Addr, RedisPasswordFile: filepath.Join(dir, "none")}, "-redis-password-file"},
		{"password in the URL and the environment", DaemonConfig{Redis: "redis://:x@" + srv.Addr, RedisPassword: defaultPW}, "password"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tt.c.Policies = pol
			if err := Run(context.Background(), tt.c); err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Fatalf("Run: %v, want an error containing %q", err, tt.err)
			}
		})
	}
}
