package etcdtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// CA is a certificate authority made for one test. Its certificate is
// written to File (PEM); the certificates it issues are valid for an
// hour around now.
type CA struct {
	// Cert is the CA certificate; File holds it in PEM.
	Cert *x509.Certificate
	File string
	key  *ecdsa.PrivateKey
	dir  string
}

var serials atomic.Int64

// NewCA makes a CA named name whose files live in a t.TempDir.
func NewCA(tb testing.TB, name string) *CA {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatalf("etcdtest: CA key: %v", err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serials.Add(1)), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatalf("etcdtest: CA certificate: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatalf("etcdtest: CA certificate: %v", err)
	}
	ca := &CA{Cert: cert, key: key, dir: tb.TempDir()}
	ca.File = filepath.Join(ca.dir, "ca.pem")
	writeFile(tb, ca.File, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	return ca
}

// Issue returns the PEM certificate and key of a new certificate for the
// common name cn, valid for 127.0.0.1, ::1 and localhost, for server and
// client use, and its serial number.
func (ca *CA) Issue(tb testing.TB, cn string) (certPEM, keyPEM []byte, serial int64) {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatalf("etcdtest: key: %v", err)
	}
	serial = serials.Add(1)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")}, DNSNames: []string{"localhost"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		tb.Fatalf("etcdtest: certificate: %v", err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		tb.Fatalf("etcdtest: key: %v", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), serial
}

// IssueFiles issues a certificate for cn (see Issue) and writes it and its
// key into dir as cn.crt and cn.key, the key first, so that a reader
// polling the pair sees the new certificate only once its key is there.
// It returns the two paths and the serial.
func (ca *CA) IssueFiles(tb testing.TB, dir, cn string) (certFile, keyFile string, serial int64) {
	tb.Helper()
	c, k, serial := ca.Issue(tb, cn)
	certFile, keyFile = filepath.Join(dir, cn+".crt"), filepath.Join(dir, cn+".key")
	writeFile(tb, keyFile, k)
	writeFile(tb, certFile, c)
	return certFile, keyFile, serial
}

func writeFile(tb testing.TB, path string, b []byte) {
	tb.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		tb.Fatalf("etcdtest: %v", err)
	}
}

// StartTLS runs an embedded etcd for tb that serves its clients over TLS
// (https endpoints) with a certificate from ca, and requires client
// certificates from ca (mutual TLS). Client returns a client that
// presents a certificate from ca.
func StartTLS(tb testing.TB, ca *CA) *Server {
	tb.Helper()
	s := &Server{dir: tb.TempDir()}
	cert, key, _ := ca.IssueFiles(tb, s.dir, "etcd-server")
	s.tls = &transport.TLSInfo{CertFile: cert, KeyFile: key, TrustedCAFile: ca.File, ClientCertAuth: true}
	cc, ck, _ := ca.Issue(tb, "etcdtest-client")
	pair, err := tls.X509KeyPair(cc, ck)
	if err != nil {
		tb.Fatalf("etcdtest: client pair: %v", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	s.clientTLS = &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: pool, MinVersion: tls.VersionTLS12}
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
