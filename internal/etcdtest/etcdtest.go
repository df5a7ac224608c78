// Package etcdtest starts a real embedded etcd server for a test: its data
// in t.TempDir, client and peer URLs on free loopback ports, ready before
// the call returns, stopped at cleanup. StartCluster starts three such
// members as one cluster, whose members a test can kill.
package etcdtest

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"golang.org/x/crypto/bcrypt"
)

// Server is one embedded etcd member.
type Server struct {
	// Endpoints are the client URLs.
	Endpoints []string
	etcd      *embed.Etcd
	dir       string
	tls       *transport.TLSInfo // set by StartTLS
	log       *os.File           // the running member's log (tls.go)
	clientTLS *tls.Config        // what Client presents to a TLS server
}

// Start runs an embedded etcd for tb and waits until it serves.
func Start(tb testing.TB) *Server {
	tb.Helper()
	s := &Server{dir: tb.TempDir()}
	if err := s.start(""); err != nil {
		tb.Fatalf("etcdtest: %v", err)
	}
	tb.Cleanup(s.Stop)
	return s
}

// Client returns a client of s, closed at cleanup.
func (s *Server) Client(tb testing.TB) *clientv3.Client {
	tb.Helper()
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   s.Endpoints,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		TLS:         s.clientTLS, // nil unless StartTLS
	})
	if err != nil {
		tb.Fatalf("etcdtest: client: %v", err)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// Stop stops the server; its data stays for Restart.
func (s *Server) Stop() {
	if s.etcd == nil {
		return
	}
	s.etcd.Close()
	<-s.etcd.Server.StopNotify()
	s.etcd = nil
	s.closeLog()
}

// Restart starts a stopped server again on the same client address and data.
func (s *Server) Restart() error {
	s.Stop()
	return s.start(s.Endpoints[0])
}

func (s *Server) start(clientURL string) error {
	cfg := embed.NewConfig()
	cfg.Dir = filepath.Join(s.dir, "data")
	cfg.Logger = "zap"
	cfg.LogLevel = "error"
	cfg.BcryptCost = uint(bcrypt.MinCost) // test passwords: fast sign-ins
	if err := s.prepare(cfg); err != nil {
		return err
	}
	if clientURL == "" {
		a, err := freeAddr()
		if err != nil {
			return err
		}
		clientURL = s.scheme() + "://" + a
	}
	p, err := freeAddr()
	if err != nil {
		return err
	}
	cu, _ := url.Parse(clientURL)
	pu, _ := url.Parse("http://" + p)
	cfg.ListenClientUrls = []url.URL{*cu}
	cfg.AdvertiseClientUrls = []url.URL{*cu}
	cfg.ListenPeerUrls = []url.URL{*pu}
	cfg.AdvertisePeerUrls = []url.URL{*pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		s.closeLog()
		return fmt.Errorf("start embedded etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		e.Close()
		s.closeLog()
		return fmt.Errorf("embedded etcd not ready after 30s")
	}
	s.etcd = e
	s.Endpoints = []string{clientURL}
	return nil
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find free port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// Ping fails tb when s does not answer a read within a second.
func (s *Server) Ping(tb testing.TB, c *clientv3.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := c.Get(ctx, "ping"); err != nil {
		tb.Fatalf("etcdtest: ping: %v", err)
	}
}
