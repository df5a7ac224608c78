package coordinator

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/quotacoord/quota/internal/etcdauth"
	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/tlsconfig"
)

// CoordinatorEtcdUser is the etcd user the coordinator authenticates as
// when it turns authentication on in its embedded etcd.
const CoordinatorEtcdUser = "quota-coordinator"

// EmbeddedAuthDir is the directory under DataDir that holds the embedded
// etcd's passwords (EmbeddedAuth): root.password,
// coordinator.password and region-{region}.password, each mode 0600.
const EmbeddedAuthDir = "etcd-auth"

// RegionPasswordFile is the file, under cfg's data directory, holding the
// etcd password of region's nodes (user etcdauth.RegionUser(region)).
func (cfg Config) RegionPasswordFile(region string) string {
	return filepath.Join(cfg.DataDir, EmbeddedAuthDir, "region-"+region+".password")
}

// embeddedAuthTimeout bounds setting up users, roles and authentication.
const embeddedAuthTimeout = 30 * time.Second

// embeddedAuth turns authentication on in the embedded etcd, once, and
// makes sure of its users at every start: root, the coordinator's own
// user (every key of the prefix) and one user per region of
// cfg.EmbeddedAuthRegions shared by that region's nodes
// (etcdauth.RegionRole). Passwords are drawn once (256 random bits) and
// kept in DataDir/etcd-auth; the operator hands each region its file.
// It returns the coordinator's credentials.
func embeddedAuth(ctx context.Context, cfg Config, endpoints []string, t tlsconfig.Etcd, log hclog.Logger) (etcdauth.Credentials, error) {
	ctx, cancel := context.WithTimeout(ctx, embeddedAuthTimeout)
	defer cancel()
	dir := filepath.Join(cfg.DataDir, EmbeddedAuthDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return etcdauth.Credentials{}, fmt.Errorf("coordinator: embedded etcd auth: %w", err)
	}
	rootFile, coordFile := filepath.Join(dir, "root.password"), filepath.Join(dir, "coordinator.password")
	rootPW, err := passwordFile(rootFile)
	if err != nil {
		return etcdauth.Credentials{}, err
	}
	dial := func(c etcdauth.Credentials) (*clientv3.Client, error) {
		ccfg := clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
		if err := t.Apply(&ccfg); err != nil {
			return nil, err
		}
		if err := c.Apply(&ccfg); err != nil {
			return nil, err
		}
		cli, err := clientv3.New(ccfg)
		if err != nil {
			return nil, fmt.Errorf("coordinator: embedded etcd auth: %w", etcdauth.Refusal(err))
		}
		return cli, nil
	}
	cli, err := dial(etcdauth.Credentials{})
	if err != nil {
		return etcdauth.Credentials{}, err
	}
	defer func() { cli.Close() }()
	enabled := false
	switch st, err := cli.AuthStatus(ctx); {
	case errors.Is(err, rpctypes.ErrUserEmpty):
		enabled = true
	case err != nil:
		return etcdauth.Credentials{}, fmt.Errorf("coordinator: embedded etcd auth status: %w", err)
	default:
		enabled = st.Enabled
	}
	if enabled { // a restart: act as root
		cli.Close()
		if cli, err = dial(etcdauth.Credentials{Username: etcdauth.RootUser, PasswordFile: rootFile}); err != nil {
			return etcdauth.Credentials{}, err
		}
	}
	l := etcdlayout.Layout{Prefix: cfg.Rebalance.Prefix}
	coordPW, err := passwordFile(coordFile)
	if err != nil {
		return etcdauth.Credentials{}, err
	}
	if err := etcdauth.Ensure(ctx, cli, etcdauth.CoordinatorRole(l), CoordinatorEtcdUser, coordPW); err != nil {
		return etcdauth.Credentials{}, err
	}
	for _, region := range cfg.EmbeddedAuthRegions {
		role, err := etcdauth.RegionRole(l, region)
		if err != nil {
			return etcdauth.Credentials{}, err
		}
		pw, err := passwordFile(cfg.RegionPasswordFile(region))
		if err != nil {
			return etcdauth.Credentials{}, err
		}
		if err := etcdauth.Ensure(ctx, cli, role, etcdauth.RegionUser(region), pw); err != nil {
			return etcdauth.Credentials{}, err
		}
		log.Info("etcd credentials of a region's nodes", "region", region, "user", etcdauth.RegionUser(region),
			"password_file", cfg.RegionPasswordFile(region))
	}
	if !enabled {
		if err := etcdauth.EnableAuth(ctx, cli, rootPW); err != nil {
			return etcdauth.Credentials{}, err
		}
		log.Info("embedded etcd authentication enabled", "root_password_file", rootFile)
	}
	if len(cfg.EmbeddedAuthRegions) == 0 {
		log.Warn("embedded etcd authentication is on and no region has a user: regional nodes cannot join until one is made "+
			"(restart with -embedded-etcd-auth REGIONS, or quotactl etcd-auth region REGION as root)", "root_password_file", rootFile)
	}
	return etcdauth.Credentials{Username: CoordinatorEtcdUser, PasswordFile: coordFile}, nil
}

// passwordFile returns the password kept in path, first writing a random
// one (256 bits, URL-safe base64) with mode 0600 when path does not exist.
func passwordFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		if pw := strings.TrimSpace(string(b)); pw != "" {
			return pw, nil
		}
		return "", fmt.Errorf("coordinator: %s is empty (remove it to draw a new password, then restart every daemon that uses it)", path)
	case !errors.Is(err, os.ErrNotExist):
		return "", fmt.Errorf("coordinator: %w", err)
	}
	raw := make([]byte, 32)
	_, _ = rand.Read(raw) // crypto/rand.Read never fails (Go 1.24)
	pw := base64.RawURLEncoding.EncodeToString(raw)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", fmt.Errorf("coordinator: %w", err)
	}
	if _, err := f.WriteString(pw + "\n"); err != nil {
		f.Close()
		return "", fmt.Errorf("coordinator: write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return "", fmt.Errorf("coordinator: write %s: %w", path, err)
	}
	return pw, nil
}
