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
		tc.Certificates = []tls.Certificate{pair}
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
