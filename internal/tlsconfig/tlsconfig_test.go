package tlsconfig

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/quotacoord/quota/internal/clock"
	"github.com/quotacoord/quota/internal/testca"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func write(t testing.TB, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// files are the paths of one test's certificate, key and CA.
type files struct{ cert, key, ca string }

func newFiles(t testing.TB) files {
	d := t.TempDir()
	return files{filepath.Join(d, "tls.crt"), filepath.Join(d, "tls.key"), filepath.Join(d, "ca.CertPEM()")}
}

// reloaderOf writes a certificate for name issued by ca, its key and ca's
// certificate into fresh files and returns a Reloader on them (default
// check period) reading a manual clock, with the files, the clock and the
// certificate's serial number.
func reloaderOf(t *testing.T, ca *testca.CA, name string) (*Reloader, files, *clock.Manual, int64) {
	t.Helper()
	f := newFiles(t)
	cert, key, serial := ca.Issue(t, name)
	write(t, f.cert, cert)
	write(t, f.key, key)
	write(t, f.ca, ca.CertPEM())
	clk := clock.NewManual(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	r, err := New(Config{CertFile: f.cert, KeyFile: f.key, CAFile: f.ca, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	return r, f, clk, serial
}

// serve runs a TLS listener on loopback that answers each completed
// handshake with one byte; it is closed at cleanup.
func serve(t testing.TB, tc *tls.Config) string {
	t.Helper()
	l, err := tls.Listen("tcp", "127.0.0.1:0", tc)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			tcn := c.(*tls.Conn)
			_ = tcn.SetDeadline(time.Now().Add(5 * time.Second))
			if tcn.Handshake() == nil {
				_, _ = tcn.Write([]byte{'k'})
			}
			_ = tcn.Close()
		}
	}()
	t.Cleanup(func() { l.Close(); wg.Wait() })
	return l.Addr().String()
}

// dial handshakes with addr, reads the server's byte (so a client
// certificate the server rejects fails here under TLS 1.3 too) and returns
// the serial of the server's certificate.
func dial(addr string, tc *tls.Config) (int64, error) {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, tc)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err != nil {
		return 0, err
	}
	return c.ConnectionState().PeerCertificates[0].SerialNumber.Int64(), nil
}

func trusting(ca *testca.CA) *tls.Config {
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
}

func withCert(tc *tls.Config, certPEM, keyPEM []byte) *tls.Config {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		panic(err)
	}
	tc = tc.Clone()
	tc.Certificates = []tls.Certificate{pair}
	return tc
}

// TestServerCertificateReload: a certificate replaced on disk is served to
// the next connection once CheckEvery has passed, without a restart; a
// certificate written before its key (a pair that does not match) keeps
// the previous pair until the key arrives.
func TestServerCertificateReload(t *testing.T) {
	ca := testca.New(t, "ca")
	f := newFiles(t)
	c1, k1, s1 := ca.Issue(t, "server")
	write(t, f.cert, c1)
	write(t, f.key, k1)
	clk := clock.NewManual(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	r, err := New(Config{CertFile: f.cert, KeyFile: f.key, CheckEvery: time.Second, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	sc, err := r.ServerConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, sc)
	served := func() int64 {
		t.Helper()
		s, err := dial(addr, trusting(ca))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	c2, k2, s2 := ca.Issue(t, "server")
	steps := []struct {
		name    string
		do      func()
		advance time.Duration
		want    int64
		failing bool
	}{
		{"first certificate", func() {}, 0, s1, false},
		{"new certificate, old key: not loaded yet (check not due)", func() { write(t, f.cert, c2) }, 500 * time.Millisecond, s1, false},
		{"new certificate, old key: the old pair stays", func() {}, time.Second, s1, true},
		{"the key arrives, but the next check is not due", func() { write(t, f.key, k2) }, 100 * time.Millisecond, s1, true},
		{"the next check loads the new pair", func() {}, time.Second, s2, false},
		{"unchanged files keep it", func() {}, time.Second, s2, false},
	}
	for _, st := range steps {
		st.do()
		clk.Advance(st.advance)
		if got := served(); got != st.want {
			t.Errorf("%s: served serial %d, want %d", st.name, got, st.want)
		}
		if (r.Err() != nil) != st.failing {
			t.Errorf("%s: Err() = %v, want failing=%v", st.name, r.Err(), st.failing)
		}
	}
	if r.Reloads() != 1 {
		t.Errorf("Reloads() = %d, want 1", r.Reloads())
	}
}

// TestMutualTLS: with a CA file and RequireAndVerifyClientCert, only
// clients with a certificate from that CA get in, and a replaced CA file
// changes who gets in without a restart.
func TestMutualTLS(t *testing.T) {
	good, other := testca.New(t, "good"), testca.New(t, "other")
	r, f, clk, _ := reloaderOf(t, good, "server")
	tc, err := r.ServerConfig(&tls.Config{ClientAuth: tls.RequireAndVerifyClientCert})
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, tc)
	gc, gk, _ := good.Issue(t, "client")
	oc, ok, _ := other.Issue(t, "client")
	clients := []struct {
		name string
		tc   *tls.Config
	}{
		{"certificate from the configured CA", withCert(trusting(good), gc, gk)},
		{"no certificate", trusting(good)},
		{"certificate from another CA", withCert(trusting(good), oc, ok)},
	}
	check := func(phase string, want []bool) {
		t.Helper()
		for i, c := range clients {
			_, err := dial(addr, c.tc)
			if (err == nil) != want[i] {
				t.Errorf("%s, %s: error %v, want accepted=%v", phase, c.name, err, want[i])
			}
		}
	}
	check("configured CA", []bool{true, false, false})
	write(t, f.ca, other.CertPEM())
	clk.Advance(DefaultCheckEvery)
	check("CA file replaced", []bool{false, false, true})
}

// TestClientConfig: a client verifies the server against the CA file (and
// the server name), presents its certificate for mutual TLS, and follows
// a replaced CA file.
func TestClientConfig(t *testing.T) {
	good, other := testca.New(t, "good"), testca.New(t, "other")
	serverFor := func(ca *testca.CA) string {
		c, k, _ := ca.Issue(t, "server")
		pair, err := tls.X509KeyPair(c, k)
		if err != nil {
			t.Fatal(err)
		}
		pool := x509.NewCertPool()
		pool.AddCert(good.Cert)
		return serve(t, &tls.Config{Certificates: []tls.Certificate{pair}, ClientCAs: pool,
			ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12})
	}
	goodSrv, otherSrv := serverFor(good), serverFor(other)
	r, f, clk, _ := reloaderOf(t, good, "client")
	ip := &tls.Config{ServerName: "127.0.0.1"}
	tests := []struct {
		name string
		addr string
		base *tls.Config
		ok   bool
	}{
		{"server from the CA", goodSrv, ip, true},
		{"server from another CA", otherSrv, ip, false},
		{"wrong server name", goodSrv, &tls.Config{ServerName: "example.com"}, false},
		{"DNS server name", goodSrv, &tls.Config{ServerName: "localhost"}, true},
	}
	for _, tt := range tests {
		_, err := dial(tt.addr, r.ClientConfig(tt.base))
		if (err == nil) != tt.ok {
			t.Errorf("%s: error %v, want success=%v", tt.name, err, tt.ok)
		}
	}
	// An IP address is not sent as a server name (SNI): without
	// base.ServerName the handshake is refused rather than verified
	// without a name.
	if _, err := dial(goodSrv, r.ClientConfig(nil)); !errors.Is(err, ErrNoServerName) {
		t.Errorf("dial by IP without a server name: %v, want ErrNoServerName", err)
	}

	write(t, f.ca, other.CertPEM())
	clk.Advance(DefaultCheckEvery)
	if _, err := dial(otherSrv, r.ClientConfig(ip)); err != nil {
		t.Errorf("after the CA file changed, the other CA's server is not trusted: %v", err)
	}
	if _, err := dial(goodSrv, r.ClientConfig(ip)); err == nil {
		t.Error("the replaced CA is still trusted")
	}
}

// TestNewErrors: bad configurations and files fail at New with errors
// that say which.
func TestNewErrors(t *testing.T) {
	ca := testca.New(t, "ca")
	f := newFiles(t)
	c, k, _ := ca.Issue(t, "s")
	write(t, f.cert, c)
	write(t, f.key, k)
	write(t, f.ca, ca.CertPEM())
	dir := filepath.Dir(f.cert)
	junk := filepath.Join(dir, "junk.pem")
	write(t, junk, []byte("not pem"))
	big := filepath.Join(dir, "big.pem")
	write(t, big, make([]byte, MaxFileBytes+1))
	_, otherKey, _ := ca.Issue(t, "s")
	mismatched := filepath.Join(dir, "other.key")
	write(t, mismatched, otherKey)
	tests := []struct {
		name string
		cfg  Config
		err  error
		text string
	}{
		{"nothing", Config{}, ErrConfig, "no certificate"},
		{"cert without key", Config{CertFile: f.cert}, ErrConfig, "go together"},
		{"missing cert", Config{CertFile: filepath.Join(dir, "none.crt"), KeyFile: f.key}, ErrFiles, "none.crt"},
		{"key of another certificate", Config{CertFile: f.cert, KeyFile: mismatched}, ErrFiles, "key pair"},
		{"CA without certificates", Config{CAFile: junk}, ErrFiles, "junk.pem"},
		{"oversize CA", Config{CAFile: big}, ErrFiles, "larger than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.cfg)
			if !errors.Is(err, tt.err) || !strings.Contains(err.Error(), tt.text) {
				t.Errorf("New: %v, want %v containing %q", err, tt.err, tt.text)
			}
		})
	}
	r, err := New(Config{CAFile: f.ca})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.ServerConfig(nil); !errors.Is(err, ErrConfig) {
		t.Errorf("ServerConfig without a certificate: %v", err)
	}
}

// TestRefreshRate: files are read at most once per CheckEvery, and never
// with a negative CheckEvery.
func TestRefreshRate(t *testing.T) {
	ca := testca.New(t, "ca")
	for _, tt := range []struct {
		name    string
		every   time.Duration
		advance []time.Duration
		reloads []int64
	}{
		{"default", 0, []time.Duration{0, DefaultCheckEvery - 1, 1, DefaultCheckEvery}, []int64{0, 0, 1, 2}},
		{"never", -1, []time.Duration{0, time.Hour}, []int64{0, 0}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFiles(t)
			write(t, f.ca, ca.CertPEM())
			clk := clock.NewManual(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
			r, err := New(Config{CAFile: f.ca, CheckEvery: tt.every, Clock: clk})
			if err != nil {
				t.Fatal(err)
			}
			for i, d := range tt.advance {
				// Each step rewrites the file with one more certificate.
				write(t, f.ca, append(ca.CertPEM(), testca.New(t, "x").CertPEM()...))
				r.Refresh(clk.Advance(d))
				if got := r.Reloads(); got != tt.reloads[i] {
					t.Errorf("step %d: %d reloads, want %d", i, got, tt.reloads[i])
				}
			}
		})
	}
}
