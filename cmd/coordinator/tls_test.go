package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quotacoord/quota/internal/testca"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestParseEtcdTLS: the etcd TLS flags reach the configuration.
func TestParseEtcdTLS(t *testing.T) {
	cfg, err := parse([]string{"-etcd", "https://a:2379", "-etcd-tls-ca", "ca.pem", "-etcd-tls-cert", "c.crt",
		"-etcd-tls-key", "c.key", "-etcd-tls-server-name", "etcd.internal"}, nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if e := cfg.EtcdTLS; e.CAFile != "ca.pem" || e.CertFile != "c.crt" || e.KeyFile != "c.key" || e.ServerName != "etcd.internal" || e.Logger == nil {
		t.Errorf("EtcdTLS = %+v", e)
	}
	cfg, err = parse([]string{"-embedded-etcd-tls-cert", "s.crt", "-embedded-etcd-tls-key", "s.key", "-embedded-etcd-client-ca", "ca.pem"}, nil, io.Discard)
	if err != nil || cfg.EmbeddedTLSCert != "s.crt" || cfg.EmbeddedTLSKey != "s.key" || cfg.EmbeddedClientCA != "ca.pem" {
		t.Errorf("embedded TLS: %+v %v", cfg, err)
	}
}

// TestRunEmbeddedEtcdMutualTLS: `coordinator` with the embedded etcd on
// mutual TLS starts, leads through its own TLS client, and keeps etcd's
// log out of stderr; without a client certificate for itself it refuses
// to start.
func TestRunEmbeddedEtcdMutualTLS(t *testing.T) {
	ca := testca.New(t, "quota-ca")
	dir := t.TempDir()
	srvCert, srvKey, _ := ca.IssueFiles(t, dir, "etcd")
	coCert, coKey, _ := ca.IssueFiles(t, dir, "coordinator")
	data, httpAddr := t.TempDir(), freeAddr(t)
	base := []string{"-data-dir", data, "-embedded-etcd-addr", freeAddr(t), "-grpc-addr", "127.0.0.1:0", "-http-addr", httpAddr,
		"-embedded-etcd-tls-cert", srvCert, "-embedded-etcd-tls-key", srvKey, "-embedded-etcd-client-ca", ca.File,
		"-election-ttl", "1s", "-log-level", "error"}

	err := run(t.Context(), base, nil, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "-etcd-tls-cert") {
		t.Fatalf("without a client certificate: %v, want an error naming -etcd-tls-cert", err)
	}

	// etcd's default logger writes to the process's stderr: catch it.
	stderrFile, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer stderrFile.Close()
	realStderr := os.Stderr
	os.Stderr = stderrFile
	defer func() { os.Stderr = realStderr }()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		errc <- run(ctx, append(base, "-etcd-tls-cert", coCert, "-etcd-tls-key", coKey), nil, stderrFile)
	}()
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := http.Get("http://" + httpAddr + "/healthz")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.Contains(string(body), "ok leader") {
				break
			}
		}
		if time.Now().After(deadline) {
			cancel()
			<-errc
			t.Fatalf("never led: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	os.Stderr = realStderr
	if b, _ := os.ReadFile(stderrFile.Name()); strings.Contains(string(b), `"level":"error"`) {
		t.Errorf("etcd logged to stderr:\n%s", b)
	}
	if _, err := os.Stat(filepath.Join(data, "etcd.log")); err != nil {
		t.Errorf("no etcd.log: %v", err)
	}
}
