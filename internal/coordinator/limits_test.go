package coordinator

import (
	"context"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// TestEmbeddedEtcdLimits: the embedded etcd runs with the backend quota
// docs/scale.md asks for and refuses a request above the request limit
// the deployment's records are sized against.
func TestEmbeddedEtcdLimits(t *testing.T) {
	cfg := Config{DataDir: t.TempDir(), EmbeddedEtcdAddr: freeAddr(t)}
	stop, err := startEmbedded(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	endpoint := "http://" + cfg.EmbeddedEtcdAddr
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := cli.Status(ctx, endpoint)
	if err != nil {
		t.Fatal(err)
	}
	if st.DbSizeQuota != EmbeddedQuotaBytes {
		t.Errorf("backend quota %d, want %d", st.DbSizeQuota, int64(EmbeddedQuotaBytes))
	}
	if _, err := cli.Put(ctx, "small", strings.Repeat("x", EmbeddedMaxRequestBytes/4)); err != nil {
		t.Errorf("a quarter of the request limit: %v", err)
	}
	if _, err := cli.Put(ctx, "large", strings.Repeat("x", EmbeddedMaxRequestBytes+1)); err == nil || !strings.Contains(err.Error(), "too large") {
		t.Errorf("a value above the request limit: %v, want request too large", err)
	}
}
