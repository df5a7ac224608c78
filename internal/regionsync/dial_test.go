package regionsync

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/etcdtest"
	"github.com/quotacoord/quota/internal/testca"
	"github.com/quotacoord/quota/internal/tlsconfig"
)

// TestDialTLS: against an etcd that requires client certificates, only a
// client with a certificate from etcd's CA that verifies etcd's
// certificate gets an answer.
func TestDialTLS(t *testing.T) {
	ca, other := testca.New(t, "etcd-ca"), testca.New(t, "other-ca")
	srv := etcdtest.StartTLS(t, ca)
	dir := t.TempDir()
	cert, key, _ := ca.IssueFiles(t, dir, "node")
	otherCert, otherKey, _ := other.IssueFiles(t, dir, "intruder")
	hostPort := strings.TrimPrefix(srv.Endpoints[0], "https://")
	tests := []struct {
		name      string
		endpoints []string
		tls       tlsconfig.Etcd
		ok        bool
	}{
		{"client certificate from etcd's CA, endpoint's IP verified", srv.Endpoints, tlsconfig.Etcd{CAFile: ca.File, CertFile: cert, KeyFile: key}, true},
		{"endpoint without a scheme", []string{hostPort}, tlsconfig.Etcd{CAFile: ca.File, CertFile: cert, KeyFile: key}, true},
		{"fixed server name the certificate carries", srv.Endpoints, tlsconfig.Etcd{CAFile: ca.File, CertFile: cert, KeyFile: key, ServerName: "localhost"}, true},
		{"fixed server name the certificate lacks", srv.Endpoints, tlsconfig.Etcd{CAFile: ca.File, CertFile: cert, KeyFile: key, ServerName: "etcd.example.com"}, false},
		{"no client certificate", srv.Endpoints, tlsconfig.Etcd{CAFile: ca.File}, false},
		{"client certificate from another CA", srv.Endpoints, tlsconfig.Etcd{CAFile: ca.File, CertFile: otherCert, KeyFile: otherKey}, false},
		{"etcd's certificate not trusted", srv.Endpoints, tlsconfig.Etcd{CAFile: other.File, CertFile: cert, KeyFile: key}, false},
		{"plaintext client", []string{"http://" + hostPort}, tlsconfig.Etcd{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, err := DialTLS(tt.endpoints, tt.tls)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_, err = c.Put(ctx, "dial-tls", tt.name)
			if (err == nil) != tt.ok {
				t.Errorf("Put: %v, want success=%v", err, tt.ok)
			}
		})
	}
}

// TestSyncerRotatedClientCertificate: a node whose client certificate etcd
// refuses keeps retrying; once the files hold a certificate from etcd's
// CA, its next connection uses it and the node registers and acknowledges
// without a restart.
func TestSyncerRotatedClientCertificate(t *testing.T) {
	ca, other := testca.New(t, "etcd-ca"), testca.New(t, "other-ca")
	srv := etcdtest.StartTLS(t, ca)
	admin := srv.Client(t)
	putJSON(t, admin, lay.Alloc("exports"), alloc("exports", 1, map[string]float64{"eu": 1}, map[string]float64{"eu": 0.5}, nil))

	dir := t.TempDir()
	cert, key, _ := other.IssueFiles(t, dir, "node")
	c, err := DialTLS(srv.Endpoints, tlsconfig.Etcd{CAFile: ca.File, CertFile: cert, KeyFile: key, CheckEvery: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := New(Config{Region: "eu", Node: testNode, Client: c, LeaseTTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	acked := func() bool {
		var a etcdlayout.Ack
		found, _ := getAck(t, admin, "eu", testNode, &a)
		return found && a.Epochs["exports"] == 1
	}
	time.Sleep(500 * time.Millisecond)
	if acked() || s.Ready() {
		t.Fatal("a node with a certificate from another CA reached etcd")
	}
	// Rotate: key first, then the certificate (as etcdtest writes them).
	good, goodKey, _ := ca.Issue(t, "node")
	if err := os.WriteFile(key, goodKey, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cert, good, 0o600); err != nil {
		t.Fatal(err)
	}
	took := waitFor(t, 8*time.Second, "the rotated certificate was not used", acked)
	t.Logf("acknowledged %v after the rotation", took.Round(time.Millisecond))
}
