package tlsconfig

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/quotacoord/quota/internal/clock"
)

var (
	// ErrConfig reports an invalid Config or a configuration the Reloader
	// cannot serve (a server without a certificate).
	ErrConfig = errors.New("tlsconfig: invalid config")
	// ErrFiles reports certificate, key or CA files that cannot be read or
	// parsed.
	ErrFiles = errors.New("tlsconfig: bad TLS files")
	// ErrNoServerName reports a client handshake with a CA file but no
	// server name to verify the server's certificate against.
	ErrNoServerName = errors.New("tlsconfig: no server name to verify")
)

// MaxFileBytes bounds each certificate, key and CA file.
const MaxFileBytes = 1 << 20

// DefaultCheckEvery is the least time between two looks at the files.
const DefaultCheckEvery = 500 * time.Millisecond

// Config names the files of a Reloader.
type Config struct {
	// CertFile and KeyFile are a PEM certificate (chain) and its private
	// key; both or neither. A server needs them; a client presents them
	// (mutual TLS).
	CertFile, KeyFile string
	// CAFile is a PEM CA bundle: a server requires client certificates
	// from it (with the base configuration's ClientAuth), a client
	// verifies the server against it instead of the system roots.
	CAFile string
	// CheckEvery is the least time between two reads of the files;
	// 0 means DefaultCheckEvery, negative never reloads.
	CheckEvery time.Duration
	// Clock decides when a check is due; default the real clock.
	Clock clock.Clock
	// Logger receives reloads and reload failures; default none.
	Logger hclog.Logger
}

// material is one successful load of every configured file.
type material struct {
	raw  [3][]byte // cert, key, CA as read
	cert *tls.Certificate
	pool *x509.CertPool
}

// Reloader serves TLS configurations whose certificate and CA pool follow
// the files of its Config. See the package documentation.
type Reloader struct {
	cfg       Config
	cur       atomic.Pointer[material]
	lastCheck atomic.Int64 // unix nanoseconds of the last check
	reloads   atomic.Int64

	mu      sync.Mutex // one reload at a time; guards failed and lastErr
	failed  [3][]byte  // the files of the last failed load, logged once
	lastErr error
}

// New validates cfg and loads its files once; an error wraps ErrConfig or
// ErrFiles and names the file. It starts no goroutine.
func New(cfg Config) (*Reloader, error) {
	if (cfg.CertFile == "") != (cfg.KeyFile == "") {
		return nil, fmt.Errorf("%w: CertFile and KeyFile go together", ErrConfig)
	}
	if cfg.CertFile == "" && cfg.CAFile == "" {
		return nil, fmt.Errorf("%w: no certificate and no CA file", ErrConfig)
	}
	if cfg.CheckEvery == 0 {
		cfg.CheckEvery = DefaultCheckEvery
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	r := &Reloader{cfg: cfg}
	m, err := r.load()
	if err != nil {
		return nil, err
	}
	r.cur.Store(m)
	r.lastCheck.Store(cfg.Clock.Now().UnixNano())
	return r, nil
}

// readBounded reads path, failing beyond MaxFileBytes.
func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxFileBytes {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, MaxFileBytes)
	}
	return b, nil
}

// read returns the configured files' bytes (nil for those not configured).
func (r *Reloader) read() ([3][]byte, error) {
	var raw [3][]byte
	for i, path := range [3]string{r.cfg.CertFile, r.cfg.KeyFile, r.cfg.CAFile} {
		if path == "" {
			continue
		}
		b, err := readBounded(path)
		if err != nil {
			return raw, fmt.Errorf("%w: read %s: %w", ErrFiles, path, err)
		}
		raw[i] = b
	}
	return raw, nil
}

// load reads and parses every file.
func (r *Reloader) load() (*material, error) {
	raw, err := r.read()
	if err != nil {
		return nil, err
	}
	return r.parse(raw)
}

func (r *Reloader) parse(raw [3][]byte) (*material, error) {
	m := &material{raw: raw}
	if r.cfg.CertFile != "" {
		cert, err := tls.X509KeyPair(raw[0], raw[1])
		if err != nil {
			return nil, fmt.Errorf("%w: key pair %s, %s: %w", ErrFiles, r.cfg.CertFile, r.cfg.KeyFile, err)
		}
		m.cert = &cert
	}
	if r.cfg.CAFile != "" {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(raw[2]) {
			return nil, fmt.Errorf("%w: CA file %s holds no PEM certificate", ErrFiles, r.cfg.CAFile)
		}
		m.pool = pool
	}
	return m, nil
}

// Refresh re-reads the files when CheckEvery has passed since the last
// check at now, and swaps in what they hold when it changed and parses.
// Handshakes call it; a concurrent call returns at once and the caller
// keeps the current value.
func (r *Reloader) Refresh(now time.Time) {
	if r.cfg.CheckEvery < 0 {
		return
	}
	last := r.lastCheck.Load()
	if now.UnixNano()-last < int64(r.cfg.CheckEvery) || !r.lastCheck.CompareAndSwap(last, now.UnixNano()) {
		return
	}
	if !r.mu.TryLock() {
		return
	}
	defer r.mu.Unlock()
	cur := r.cur.Load()
	raw, err := r.read()
	if err == nil && sameFiles(raw, cur.raw) {
		r.lastErr = nil
		return
	}
	var m *material
	if err == nil {
		m, err = r.parse(raw)
	}
	if err != nil {
		// Keep the last good value; log a failure once per content.
		if !sameFiles(raw, r.failed) || r.lastErr == nil {
			r.cfg.Logger.Warn("TLS files changed but do not load; keeping the previous ones", "error", err)
		}
		r.failed, r.lastErr = raw, err
		return
	}
	r.cur.Store(m)
	r.reloads.Add(1)
	r.failed, r.lastErr = [3][]byte{}, nil
	r.cfg.Logger.Info("TLS files reloaded", "cert", r.cfg.CertFile, "ca", r.cfg.CAFile)
}

func sameFiles(a, b [3][]byte) bool {
	return bytes.Equal(a[0], b[0]) && bytes.Equal(a[1], b[1]) && bytes.Equal(a[2], b[2])
}

// current checks the files if due and returns the value in use.
func (r *Reloader) current() *material {
	r.Refresh(r.cfg.Clock.Now())
	return r.cur.Load()
}

// Err returns the error of the last check whose files did not load, nil
// once they load again (or never failed).
func (r *Reloader) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastErr
}

// Reloads counts the successful reloads since New.
func (r *Reloader) Reloads() int64 { return r.reloads.Load() }

// Certificate returns the certificate in use (after a due check), nil
// without CertFile.
func (r *Reloader) Certificate() *tls.Certificate { return r.current().cert }

// ServerConfig returns a server configuration derived from base (nil means
// an empty one): every handshake gets a clone of base with the current
// certificate and, with a CA file, the current pool as ClientCAs. base
// keeps its ClientAuth (set tls.RequireAndVerifyClientCert for mutual
// TLS), MinVersion (default TLS 1.2) and NextProtos: the per-handshake
// configuration replaces the returned one entirely, so base.NextProtos
// must already list the application protocols ("h2" for gRPC).
func (r *Reloader) ServerConfig(base *tls.Config) (*tls.Config, error) {
	if r.cfg.CertFile == "" {
		return nil, fmt.Errorf("%w: a server needs CertFile and KeyFile", ErrConfig)
	}
	tmpl := &tls.Config{}
	if base != nil {
		tmpl = base.Clone()
	}
	if tmpl.MinVersion == 0 {
		tmpl.MinVersion = tls.VersionTLS12
	}
	tmpl.Certificates, tmpl.GetCertificate, tmpl.GetConfigForClient = nil, nil, nil
	type derived struct {
		m *material
		c *tls.Config
	}
	var cache atomic.Pointer[derived]
	out := tmpl.Clone()
	out.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		m := r.current()
		if d := cache.Load(); d != nil && d.m == m {
			return d.c, nil
		}
		c := tmpl.Clone()
		c.Certificates = []tls.Certificate{*m.cert}
		if m.pool != nil {
			c.ClientCAs = m.pool
		}
		cache.Store(&derived{m: m, c: c})
		return c, nil
	}
	return out, nil
}

// ClientConfig returns a client configuration derived from base (nil means
// an empty one): with CertFile it presents the current certificate; with
// CAFile it verifies the server's chain against the current pool and the
// server name, instead of the system roots. The server name is the one the
// handshake sent (SNI: the dialed host name), else base.ServerName; an IP
// address is never sent as SNI, so servers dialed by IP need
// base.ServerName, and a handshake without any name fails with
// ErrNoServerName. MinVersion defaults to TLS 1.2. A VerifyConnection of
// base runs after the Reloader's own check.
func (r *Reloader) ClientConfig(base *tls.Config) *tls.Config {
	c := &tls.Config{}
	if base != nil {
		c = base.Clone()
	}
	if c.MinVersion == 0 {
		c.MinVersion = tls.VersionTLS12
	}
	if r.cfg.CertFile != "" {
		c.Certificates = nil
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return r.current().cert, nil
		}
	}
	if r.cfg.CAFile != "" {
		name, next := c.ServerName, c.VerifyConnection
		c.RootCAs = nil
		// Verification is done by hand below, against the current pool.
		c.InsecureSkipVerify = true
		c.VerifyConnection = func(cs tls.ConnectionState) error {
			if err := r.verifyServer(cs, name); err != nil {
				return err
			}
			if next != nil {
				return next(cs)
			}
			return nil
		}
	}
	return c
}

// verifyServer checks a server's chain as crypto/tls would, against the
// current CA pool.
func (r *Reloader) verifyServer(cs tls.ConnectionState, name string) error {
	if cs.ServerName != "" {
		name = cs.ServerName
	}
	if name == "" {
		return ErrNoServerName
	}
	if len(cs.PeerCertificates) == 0 {
		return fmt.Errorf("tlsconfig: server %s sent no certificate", name)
	}
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{
		Roots: r.current().pool, Intermediates: inter, DNSName: name,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		return fmt.Errorf("tlsconfig: verify server %s: %w", name, err)
	}
	return nil
}
