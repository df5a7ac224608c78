package testca_test

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"testing"

	"github.com/quotacoord/quota/internal/testca"
)

func TestIssue(t *testing.T) {
	ca, other := testca.New(t, "test-ca"), testca.New(t, "other-ca")
	certFile, keyFile, s1 := ca.IssueFiles(t, t.TempDir(), "node")
	_, _, s2 := ca.Issue(t, "node")
	if s1 == s2 {
		t.Fatalf("two certificates share serial %d", s1)
	}
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatalf("load pair: %v", err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if leaf.SerialNumber.Int64() != s1 || leaf.Subject.CommonName != "node" {
		t.Fatalf("serial %v cn %q, want %d node", leaf.SerialNumber, leaf.Subject.CommonName, s1)
	}
	b, err := os.ReadFile(ca.File)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != string(ca.CertPEM()) {
		t.Fatal("CA file differs from CertPEM")
	}
	if blk, _ := pem.Decode(ca.CertPEM()); blk == nil || blk.Type != "CERTIFICATE" {
		t.Fatal("CertPEM is not a PEM certificate")
	}
	for _, host := range []string{"127.0.0.1", "::1", "localhost"} {
		for _, tc := range []struct {
			name  string
			roots *x509.CertPool
			ok    bool
		}{{"own CA", ca.Pool(), true}, {"other CA", other.Pool(), false}} {
			_, err := leaf.Verify(x509.VerifyOptions{Roots: tc.roots, DNSName: host,
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}})
			if (err == nil) != tc.ok {
				t.Errorf("%s, host %s: verify error %v, want ok=%v", tc.name, host, err, tc.ok)
			}
		}
	}
	if p := ca.IssuePair(t, "client"); len(p.Certificate) != 1 {
		t.Fatalf("pair has %d certificates", len(p.Certificate))
	}
}
