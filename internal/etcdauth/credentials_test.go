package etcdauth_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/quotacoord/quota/internal/etcdauth"
)

// TestCredentialsApply: a user with a password from the environment or a
// file reaches the client's configuration; anything incomplete or
// doubled is an error naming the flags, never the password.
func TestCredentialsApply(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	pwFile, empty := file("pw", "f-s3cret\n"), file("empty", "\n")
	for _, tc := range []struct {
		c          etcdauth.Credentials
		user, pw   string
		errContain string
	}{
		{etcdauth.Credentials{}, "", "", ""},
		{etcdauth.Credentials{Username: "u", Password: "e-s3cret"}, "u", "e-s3cret", ""},
		{etcdauth.Credentials{Username: "u", PasswordFile: pwFile}, "u", "f-s3cret", ""},
		{etcdauth.Credentials{Username: "u"}, "", "", "needs a password"},
		{etcdauth.Credentials{Password: "e-s3cret"}, "", "", "needs -etcd-username"},
		{etcdauth.Credentials{Username: "u", Password: "e-s3cret", PasswordFile: pwFile}, "", "", "both give"},
		{etcdauth.Credentials{Username: "u", PasswordFile: empty}, "", "", "needs a password"},
		{etcdauth.Credentials{Username: "u", PasswordFile: filepath.Join(dir, "none")}, "", "", "-etcd-password-file"},
	} {
		var cfg clientv3.Config
		err := tc.c.Apply(&cfg)
		switch {
		case tc.errContain == "" && (err != nil || cfg.Username != tc.user || cfg.Password != tc.pw):
			t.Errorf("%+v: %q %q, %v", tc.c, cfg.Username, cfg.Password, err)
		case tc.errContain != "" && (err == nil || !strings.Contains(err.Error(), tc.errContain) || strings.Contains(err.Error(), "s3cret")):
			t.Errorf("%+v: %v, want an error containing %q without the password", tc.c, err, tc.errContain)
		}
	}
	if err := etcdauth.Refusal(errors.New("connection refused")); errors.Is(err, etcdauth.ErrRefused) {
		t.Errorf("an unreachable etcd counted as refused credentials: %v", err)
	}
}
