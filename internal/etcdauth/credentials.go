package etcdauth

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrRefused reports that etcd refused a client's credentials: an unknown
// user, a wrong password, or a user without permission on what it reads
// at start.
var ErrRefused = errors.New("etcd refused the credentials")

// maxPasswordFile bounds a password file.
const maxPasswordFile = 4096

// Credentials are the etcd user a daemon authenticates as, with its
// password given directly (from an environment variable, never a flag) or
// in a file (one line). The zero value authenticates as nobody (etcd
// without authentication, or a client certificate whose common name is
// the user).
type Credentials struct {
	Username, Password, PasswordFile string
}

// Apply sets cfg's user and password from c. Errors name the flags
// (-etcd-username, -etcd-password-file, QUOTA_ETCD_PASSWORD) and never
// the password: a password without a user, both a password and a file, a
// file that cannot be read or is empty, a user without a password.
func (c Credentials) Apply(cfg *clientv3.Config) error {
	if c == (Credentials{}) {
		return nil
	}
	if c.Password != "" && c.PasswordFile != "" {
		return fmt.Errorf("%w: -etcd-password-file and QUOTA_ETCD_PASSWORD both give the etcd password", ErrInvalid)
	}
	if c.Username == "" {
		return fmt.Errorf("%w: an etcd password needs -etcd-username", ErrInvalid)
	}
	pw := c.Password
	if c.PasswordFile != "" {
		b, err := os.ReadFile(c.PasswordFile)
		if err != nil {
			return fmt.Errorf("etcdauth: -etcd-password-file: %w", err)
		}
		if len(b) > maxPasswordFile {
			return fmt.Errorf("%w: -etcd-password-file %s is over %d bytes", ErrInvalid, c.PasswordFile, maxPasswordFile)
		}
		pw = strings.TrimSpace(string(b))
	}
	if pw == "" {
		return fmt.Errorf("%w: -etcd-username %s needs a password (-etcd-password-file or QUOTA_ETCD_PASSWORD)", ErrInvalid, c.Username)
	}
	cfg.Username, cfg.Password = c.Username, pw
	return nil
}

// Refusal returns err wrapped in ErrRefused when it is etcd refusing a
// client's credentials (authentication failed, no such user, permission
// denied, an invalid token), else err as it is (etcd unreachable, for
// the caller to decide). clientv3.New authenticates a client given a
// user, so its error is the one to look at.
func Refusal(err error) error {
	for _, refused := range []error{rpctypes.ErrAuthFailed, rpctypes.ErrUserEmpty, rpctypes.ErrUserNotFound,
		rpctypes.ErrPermissionDenied, rpctypes.ErrInvalidAuthToken, rpctypes.ErrInvalidAuthMgmt} {
		if errors.Is(err, refused) {
			return fmt.Errorf("%w: %w", ErrRefused, err)
		}
	}
	return err
}
