package regionsync

import (
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"

	"github.com/quotacoord/quota/internal/etcdauth"
	"github.com/quotacoord/quota/internal/tlsconfig"
)

// Dial returns a plaintext etcd client for endpoints; see DialTLS.
func Dial(endpoints []string) (*clientv3.Client, error) {
	return DialTLS(endpoints, tlsconfig.Etcd{})
}

// authTimeout bounds the authentication of a client with a user.
const authTimeout = 5 * time.Second

// DialTLS returns an etcd client for endpoints, over TLS when t is not
// zero (see tlsconfig.Etcd.Apply). The client does not wait for a connection (a node
// starts, at its safe shares, while etcd is down) and reconnects within
// about two seconds once etcd is back. It starts no goroutine of its own
// beyond the etcd client's; Close the client.
func DialTLS(endpoints []string, t tlsconfig.Etcd) (*clientv3.Client, error) {
	return DialAuth(endpoints, t, etcdauth.Credentials{})
}

// DialAuth is DialTLS authenticating as creds (etcdauth.Credentials).
// With a user the client authenticates before it returns, so etcd must
// answer within a few seconds: credentials etcd refuses are an error
// wrapping etcdauth.ErrRefused.
func DialAuth(endpoints []string, t tlsconfig.Etcd, creds etcdauth.Credentials) (*clientv3.Client, error) {
	if len(endpoints) == 0 {
		return nil, fmt.Errorf("%w: no etcd endpoints", ErrInvalidConfig)
	}
	cfg := clientv3.Config{
		Endpoints:            endpoints,
		DialKeepAliveTime:    5 * time.Second,
		DialKeepAliveTimeout: 2 * time.Second,
		Logger:               zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           grpcbackoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
			MinConnectTimeout: 2 * time.Second,
		})},
	}
	if err := t.Apply(&cfg); err != nil {
		return nil, fmt.Errorf("regionsync: %w", err)
	}
	if err := creds.Apply(&cfg); err != nil {
		return nil, fmt.Errorf("regionsync: %w", err)
	}
	if cfg.Username != "" {
		cfg.DialTimeout = authTimeout
	}
	c, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("regionsync: etcd client for %v: %w", endpoints, etcdauth.Refusal(err))
	}
	return c, nil
}
