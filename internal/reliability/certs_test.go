package reliability

import (
	"crypto/tls"
	"math/big"
	"net"
	"os"
	"testing"
	"time"

	"github.com/quotacoord/quota/internal/testca"
)

func writeFile(t testing.TB, path string, b []byte) string {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// clientTLS trusts roots and presents the given pair (none when nil).
func clientTLS(t testing.TB, roots *testca.CA, certPEM, keyPEM []byte) *tls.Config {
	t.Helper()
	tc := &tls.Config{RootCAs: roots.Pool(), MinVersion: tls.VersionTLS12}
	if certPEM != nil {
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		// Present the certificate whatever CAs the server asks for: Go
		// otherwise sends none that the server's list does not name, and a
		// certificate from another CA would only test "no certificate".
		tc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &pair, nil }
	}
	return tc
}

// servedSerial handshakes with addr and returns the serial of the
// certificate the server presented.
func servedSerial(t testing.TB, addr string, tc *tls.Config) (*big.Int, error) {
	t.Helper()
	d := &net.Dialer{Timeout: 5 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", addr, tc.Clone())
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].SerialNumber, nil
}

// tlsRefusal connects to addr as tc and reads once: the error that says
// why the connection was refused (the client's own verification of the
// server, or the alert the server sent after checking the client's
// certificate), nil when the server answered.
func tlsRefusal(addr string, tc *tls.Config) error {
	tc = tc.Clone()
	tc.NextProtos = []string{"h2"}
	d := &net.Dialer{Timeout: 5 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", addr, tc)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.SetReadDeadline(time.Now().Add(3 * time.Second)); err != nil {
		return err
	}
	_, err = c.Read(make([]byte, 1))
	return err
}
