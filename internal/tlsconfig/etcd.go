package tlsconfig

import (
	"crypto/tls"
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

// Etcd configures an etcd client's TLS from PEM files, reloaded when they
// change: each new connection to etcd presents the
// current client certificate and verifies the server against the current
// CA bundle, so rotated files are used without a restart. The zero value
// means plaintext.
type Etcd struct {
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
	// CheckEvery is the least time between two looks at the files; see Config.
	CheckEvery time.Duration
	// Logger receives reloads and reload failures; default none.
	Logger hclog.Logger
}

// Enabled reports whether t asks for TLS.
func (t Etcd) Enabled() bool {
	return t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" || t.ServerName != ""
}

// Apply configures cfg for t: endpoints without a scheme get https://,
// plaintext http:// endpoints are refused (ErrConfig), and cfg.TLS
// and cfg.DialOptions get the reloading client configuration. The
// transport credentials are appended last to cfg.DialOptions so that they
// replace the ones the etcd client derives from cfg.TLS, which verify
// every endpoint against one fixed name. A zero t leaves cfg as it is.
func (t Etcd) Apply(cfg *clientv3.Config) error {
	if !t.Enabled() {
		return nil
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		return fmt.Errorf("%w: etcd: a client certificate and its key go together", ErrConfig)
	}
	if t.CAFile == "" && t.CertFile == "" {
		return fmt.Errorf("%w: etcd: a server name needs a CA file or a client certificate", ErrConfig)
	}
	eps := make([]string, 0, len(cfg.Endpoints))
	for _, e := range cfg.Endpoints {
		switch scheme, _, found := strings.Cut(e, "://"); {
		case !found:
			e = "https://" + e
		case scheme != "https":
			return fmt.Errorf("%w: etcd: endpoint %q: want https:// (or no scheme)", ErrConfig, e)
		}
		eps = append(eps, e)
	}
	r, err := New(Config{CAFile: t.CAFile, CertFile: t.CertFile, KeyFile: t.KeyFile,
		CheckEvery: t.CheckEvery, Logger: t.Logger})
	if err != nil {
		return fmt.Errorf("etcd TLS: %w", err)
	}
	base := &tls.Config{MinVersion: tls.VersionTLS12}
	cfg.Endpoints = eps
	cfg.TLS = r.ClientConfig(base)
	cfg.DialOptions = append(cfg.DialOptions, grpc.WithTransportCredentials(r.TransportCredentials(base, t.ServerName)))
	return nil
}
