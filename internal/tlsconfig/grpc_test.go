package tlsconfig

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"

	"github.com/quotacoord/quota/internal/testca"
)

// grpcServer serves gRPC health over TLS with a certificate from ca on
// loopback, requiring client certificates from clientCA; it records the
// serial of the last client certificate it saw. Stopped at cleanup.
func grpcServer(t *testing.T, ca, clientCA *testca.CA) (addr string, lastClient *atomic.Int64) {
	t.Helper()
	c, k, _ := ca.Issue(t, "server")
	pair, err := tls.X509KeyPair(c, k)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(clientCA.Cert)
	tc := &tls.Config{Certificates: []tls.Certificate{pair}, ClientCAs: pool,
		ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}
	lastClient = new(atomic.Int64)
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(tc)), grpc.UnaryInterceptor(
		func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if p, ok := peer.FromContext(ctx); ok {
				if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.PeerCertificates) > 0 {
					lastClient.Store(ti.State.PeerCertificates[0].SerialNumber.Int64())
				}
			}
			return h(ctx, req)
		}))
	healthpb.RegisterHealthServer(gs, health.NewServer())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = gs.Serve(l) }()
	t.Cleanup(func() { gs.Stop(); <-done })
	return l.Addr().String(), lastClient
}

// check makes one health call over a new connection to target.
func check(target string, creds credentials.TransportCredentials) error {
	cc, err := grpc.NewClient(target, grpc.WithTransportCredentials(creds))
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}

// TestTransportCredentials: each connection verifies the server against
// the current CA pool and the dialed host (an IP address included) or the
// fixed server name, and presents the current client certificate, so a
// rotated certificate is used by the next connection.
func TestTransportCredentials(t *testing.T) {
	good, other := testca.New(t, "good"), testca.New(t, "other")
	goodSrv, lastClient := grpcServer(t, good, good)
	otherSrv, _ := grpcServer(t, other, good)
	_, port, _ := net.SplitHostPort(goodSrv)
	r, f, clk, s1 := reloaderOf(t, good, "client")
	tests := []struct {
		name, target, serverName string
		ok                       bool
	}{
		{"by IP, the dialed address verified", goodSrv, "", true},
		{"by host name (SNI)", "localhost:" + port, "", true},
		{"fixed server name the certificate carries", goodSrv, "localhost", true},
		{"fixed server name the certificate lacks", goodSrv, "etcd.example.com", false},
		{"server from another CA", otherSrv, "", false},
	}
	for _, tt := range tests {
		err := check(tt.target, r.TransportCredentials(nil, tt.serverName))
		if (err == nil) != tt.ok {
			t.Errorf("%s: %v, want success=%v", tt.name, err, tt.ok)
		}
	}
	if got := lastClient.Load(); got != s1 {
		t.Errorf("server saw client certificate %d, want %d", got, s1)
	}

	creds := r.TransportCredentials(nil, "")
	// A client certificate from a CA the server does not trust is refused.
	oc, ok, _ := other.Issue(t, "client")
	write(t, f.cert, oc)
	write(t, f.key, ok)
	clk.Advance(DefaultCheckEvery)
	if err := check(goodSrv, creds); err == nil {
		t.Error("a client certificate from another CA was accepted")
	}
	// The rotated certificate is used by the next connection.
	c2, k2, s2 := good.Issue(t, "client")
	write(t, f.cert, c2)
	write(t, f.key, k2)
	clk.Advance(DefaultCheckEvery)
	if err := check(goodSrv, creds.Clone()); err != nil {
		t.Fatalf("after rotation: %v", err)
	}
	if got := lastClient.Load(); got != s2 {
		t.Errorf("after rotation the server saw client certificate %d, want %d", got, s2)
	}
	if _, _, err := creds.ServerHandshake(nil); err == nil {
		t.Error("client credentials served")
	}
}
