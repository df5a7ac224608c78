package etcdtest

import (
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/quotacoord/quota/internal/testca"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// StartTLS runs an embedded etcd for tb that serves its clients over TLS
// (https endpoints) with a certificate from ca, and requires client
// certificates from ca (mutual TLS). Client returns a client that
// presents a certificate from ca.
func StartTLS(tb testing.TB, ca *testca.CA) *Server {
	tb.Helper()
	s := &Server{dir: tb.TempDir()}
	cert, key, _ := ca.IssueFiles(tb, s.dir, "etcd-server")
	s.tls = &transport.TLSInfo{CertFile: cert, KeyFile: key, TrustedCAFile: ca.File, ClientCertAuth: true}
	pair := ca.IssuePair(tb, "etcdtest-client")
	s.clientTLS = &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}
	if err := s.start(""); err != nil {
		tb.Fatalf("etcdtest: %v", err)
	}
	tb.Cleanup(s.Stop)
	return s
}

// LogFile is the path of the member's log (errors only): it goes to a
// file so that the errors etcd logs when it stops stay out of test output.
func (s *Server) LogFile() string { return filepath.Join(s.dir, "etcd.log") }

// scheme is the client URLs' scheme.
func (s *Server) scheme() string {
	if s.tls != nil {
		return "https"
	}
	return "http"
}

// prepare sets cfg's client TLS and its logger, which writes to LogFile.
func (s *Server) prepare(cfg *embed.Config) error {
	if s.tls != nil {
		cfg.ClientTLSInfo = *s.tls
	}
	f, err := os.OpenFile(s.LogFile(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("etcd log file: %w", err)
	}
	core := zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(f), zapcore.ErrorLevel)
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.New(core))
	s.log = f
	return nil
}

// closeLog closes the log file of a stopped member.
func (s *Server) closeLog() {
	if s.log != nil {
		_ = s.log.Close()
		s.log = nil
	}
}
