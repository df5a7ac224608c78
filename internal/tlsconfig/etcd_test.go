package tlsconfig

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/quotacoord/quota/internal/testca"
)

// TestEtcdApply: endpoints get https:// when they have no scheme, and
// configurations that cannot work fail before dialing with ErrConfig or
// ErrFiles naming the file at fault; a zero Etcd changes nothing.
func TestEtcdApply(t *testing.T) {
	ca := testca.New(t, "ca")
	f := newFiles(t)
	c, k, _ := ca.Issue(t, "node")
	write(t, f.cert, c)
	write(t, f.key, k)
	write(t, f.ca, ca.CertPEM())
	good := Etcd{CAFile: f.ca, CertFile: f.cert, KeyFile: f.key}
	tests := []struct {
		name      string
		endpoints []string
		etcd      Etcd
		want      []string
		err       error
		text      string
	}{
		{"https kept, no scheme gets https", []string{"https://a:2379", "b:2379"}, good, []string{"https://a:2379", "https://b:2379"}, nil, ""},
		{"CA only", []string{"https://a:2379"}, Etcd{CAFile: f.ca}, []string{"https://a:2379"}, nil, ""},
		{"plaintext endpoint", []string{"https://a:2379", "http://127.0.0.1:2379"}, good, nil, ErrConfig, "http://127.0.0.1:2379"},
		{"other scheme", []string{"unix:///tmp/etcd.sock"}, good, nil, ErrConfig, "want https"},
		{"certificate without key", []string{"https://a:2379"}, Etcd{CAFile: f.ca, CertFile: f.cert}, nil, ErrConfig, "go together"},
		{"server name alone", []string{"https://a:2379"}, Etcd{ServerName: "etcd"}, nil, ErrConfig, "CA file"},
		{"missing CA file", []string{"https://a:2379"}, Etcd{CAFile: filepath.Join(filepath.Dir(f.ca), "none.pem")}, nil, ErrFiles, "none.pem"},
		{"key of another certificate", []string{"https://a:2379"}, Etcd{CertFile: f.cert, KeyFile: f.ca}, nil, ErrFiles, "key pair"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := clientv3.Config{Endpoints: tt.endpoints}
			err := tt.etcd.Apply(&cfg)
			if tt.err != nil {
				if !errors.Is(err, tt.err) || !strings.Contains(err.Error(), tt.text) {
					t.Fatalf("Apply: %v, want %v containing %q", err, tt.err, tt.text)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if strings.Join(cfg.Endpoints, ",") != strings.Join(tt.want, ",") || cfg.TLS == nil || len(cfg.DialOptions) != 1 {
				t.Errorf("Apply: endpoints %v, TLS %v, %d dial options", cfg.Endpoints, cfg.TLS != nil, len(cfg.DialOptions))
			}
		})
	}
	cfg := clientv3.Config{Endpoints: []string{"http://127.0.0.1:2379"}}
	if err := (Etcd{}).Apply(&cfg); err != nil || cfg.TLS != nil || len(cfg.DialOptions) != 0 || cfg.Endpoints[0] != "http://127.0.0.1:2379" {
		t.Errorf("zero Etcd changed the configuration: %v %+v", err, cfg)
	}
}
