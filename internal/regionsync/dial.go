package regionsync

import (
	"crypto/tls"
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"

	"github.com/quotacoord/quota/internal/tlsconfig"
)

// TLS configures an etcd client's TLS from PEM files, reloaded when they
// change (internal/tlsconfig): each new connection to etcd presents the
// current client certificate and verifies the server against the current
// CA bundle, so rotated files are used without a restart. The zero value
// means plaintext.
type TLS struct {
	// CAFile is the CA bundle etcd's certificates are verified against;
	// empty means the system roots.
	CAFile string
	// CertFile and KeyFile are the client certificate presented to etcd
	// (mutual TLS); both or neither.
	CertFile, KeyFile string
	// ServerName is the name every etcd certificate must carry; empty
	// means each endpoint's own host (an IP address is verified against
	// the certificate's IP addresses).
	ServerName string
	// CheckEvery is the least time between two looks at the files; see
	// tlsconfig.Config.
	CheckEvery time.Duration
	// Logger receives reloads and reload failures; default none.
	Logger hclog.Logger
}

// Enabled reports whether t asks for TLS.
func (t TLS) Enabled() bool {
	return t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" || t.ServerName != ""
}

// Apply configures cfg for t: endpoints without a scheme get https://,
// plaintext http:// endpoints are refused (ErrInvalidConfig), and cfg.TLS
// and cfg.DialOptions get the reloading client configuration. The
// transport credentials are appended last to cfg.DialOptions so that they
// replace the ones the etcd client derives from cfg.TLS, which verify
// every endpoint against one fixed name. A zero t leaves cfg as it is.
func (t TLS) Apply(cfg *clientv3.Config) error {
	if !t.Enabled() {
		return nil
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		return fmt.Errorf("%w: etcd TLS: a client certificate and its key go together", ErrInvalidConfig)
	}
	if t.CAFile == "" && t.CertFile == "" {
		return fmt.Errorf("%w: etcd TLS: a server name needs a CA file or a client certificate", ErrInvalidConfig)
	}
	eps := make([]string, 0, len(cfg.Endpoints))
	for _, e := range cfg.Endpoints {
		switch scheme, _, found := strings.Cut(e, "://"); {
		case !found:
			e = "https://" + e
		case scheme != "https":
			return fmt.Errorf("%w: etcd TLS: endpoint %q: want https:// (or no scheme)", ErrInvalidConfig, e)
		}
		eps = append(eps, e)
	}
	r, err := tlsconfig.New(tlsconfig.Config{CAFile: t.CAFile, CertFile: t.CertFile, KeyFile: t.KeyFile,
		CheckEvery: t.CheckEvery, Logger: t.Logger})
	if err != nil {
		return fmt.Errorf("regionsync: etcd TLS: %w", err)
	}
	base := &tls.Config{MinVersion: tls.VersionTLS12}
	cfg.Endpoints = eps
	cfg.TLS = r.ClientConfig(base)
	cfg.DialOptions = append(cfg.DialOptions, grpc.WithTransportCredentials(r.TransportCredentials(base, t.ServerName)))
	return nil
}

// Dial returns a plaintext etcd client for endpoints; see DialTLS.
func Dial(endpoints []string) (*clientv3.Client, error) {
	return DialTLS(endpoints, TLS{})
}

// DialTLS returns an etcd client for endpoints, over TLS when t is not
// zero (see TLS.Apply). The client does not wait for a connection (a node
// starts, at its safe shares, while etcd is down) and reconnects within
// about two seconds once etcd is back. It starts no goroutine of its own
// beyond the etcd client's; Close the client.
func DialTLS(endpoints []string, t TLS) (*clientv3.Client, error) {
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
		return nil, err
	}
	c, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("regionsync: etcd client for %v: %w", endpoints, err)
	}
	return c, nil
}
