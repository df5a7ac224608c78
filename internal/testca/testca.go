package testca

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// validity is how long before and after its making a certificate is valid.
const validity = time.Hour

// CA is a certificate authority made for one test.
type CA struct {
	// Cert is the CA certificate; File holds it in PEM.
	Cert *x509.Certificate
	File string
	pem  []byte
	key  *ecdsa.PrivateKey
}

var serials atomic.Int64

// New makes a CA whose common name is name; its certificate is written
// to File in a tb.TempDir.
func New(tb testing.TB, name string) *CA {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatalf("testca: CA key: %v", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serials.Add(1)), Subject: pkix.Name{CommonName: name},
		NotBefore: now.Add(-validity), NotAfter: now.Add(validity),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatalf("testca: CA certificate: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatalf("testca: CA certificate: %v", err)
	}
	ca := &CA{Cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
	ca.File = ca.WriteFile(tb, tb.TempDir())
	return ca
}

// CertPEM returns the CA certificate in PEM.
func (ca *CA) CertPEM() []byte { return append([]byte(nil), ca.pem...) }

// WriteFile writes the CA certificate into dir as ca.pem and returns the path.
func (ca *CA) WriteFile(tb testing.TB, dir string) string {
	tb.Helper()
	path := filepath.Join(dir, "ca.pem")
	write(tb, path, ca.pem)
	return path
}

// Pool returns a new pool holding only the CA certificate.
func (ca *CA) Pool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	return pool
}

// Issue returns the PEM certificate and key of a new certificate for the
// common name cn (see the package doc for its names and uses) and its
// serial number.
func (ca *CA) Issue(tb testing.TB, cn string) (certPEM, keyPEM []byte, serial int64) {
	tb.Helper()
	return ca.issue(tb, cn, nil)
}

// IssueIdentity issues a certificate for cn (see Issue) that also names
// the client identities uris (such as a SPIFFE ID, spiffe://domain/path)
// as URI SANs and dns as further DNS SANs, as a tls.Certificate.
func (ca *CA) IssueIdentity(tb testing.TB, cn string, uris []string, dns ...string) tls.Certificate {
	tb.Helper()
	c, k, _ := ca.issue(tb, cn, func(tmpl *x509.Certificate) {
		for _, s := range uris {
			u, err := url.Parse(s)
			if err != nil {
				tb.Fatalf("testca: URI %q: %v", s, err)
			}
			tmpl.URIs = append(tmpl.URIs, u)
		}
		tmpl.DNSNames = append(tmpl.DNSNames, dns...)
	})
	pair, err := tls.X509KeyPair(c, k)
	if err != nil {
		tb.Fatalf("testca: pair for %q: %v", cn, err)
	}
	return pair
}

// issue makes a certificate for cn, edited by edit when not nil.
func (ca *CA) issue(tb testing.TB, cn string, edit func(*x509.Certificate)) (certPEM, keyPEM []byte, serial int64) {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatalf("testca: key for %q: %v", cn, err)
	}
	serial = serials.Add(1)
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
		NotBefore: now.Add(-validity), NotAfter: now.Add(validity),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")}, DNSNames: []string{"localhost"}}
	if edit != nil {
		edit(tmpl)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		tb.Fatalf("testca: certificate for %q: %v", cn, err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		tb.Fatalf("testca: key for %q: %v", cn, err)
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
	write(tb, keyFile, k)
	write(tb, certFile, c)
	return certFile, keyFile, serial
}

// IssuePair issues a certificate for cn (see Issue) as a tls.Certificate.
func (ca *CA) IssuePair(tb testing.TB, cn string) tls.Certificate {
	tb.Helper()
	c, k, _ := ca.Issue(tb, cn)
	pair, err := tls.X509KeyPair(c, k)
	if err != nil {
		tb.Fatalf("testca: pair for %q: %v", cn, err)
	}
	return pair
}

func write(tb testing.TB, path string, b []byte) {
	tb.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		tb.Fatalf("testca: %v", err)
	}
}
