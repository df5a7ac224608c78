package rebalance

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/quotacoord/quota/internal/etcdtest"
	"github.com/quotacoord/quota/internal/faultproxy"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// TestRunEndsWhileCutOffCampaigning: a coordinator campaigning behind
// another leader loses etcd (a partition) and is then stopped. Run
// returns at once: the election's own clean-up on a cancelled campaign
// (a resignation on the client's context) would wait for etcd until the
// client is closed, which its caller does only after Run returned.
func TestRunEndsWhileCutOffCampaigning(t *testing.T) {
	srv := etcdtest.Start(t)
	u, err := url.Parse(srv.Endpoints[0])
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := faultproxy.Start(faultproxy.Config{Target: u.Host})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	leader, _ := startLoop(t, Config{Client: srv.Client(t), Name: "c1"})
	waitLeader(t, leader)

	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://" + proxy.Addr()}, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	standby, err := New(Config{Client: cli, Name: "c2", Interval: time.Hour, SessionTTL: time.Second,
		Registerer: prometheus.NewRegistry(), Logger: hclog.New(&hclog.LoggerOptions{Name: "c2", Output: testWriter{t}})})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- standby.Run(ctx) }()
	waitFor(t, "the standby to campaign", 10*time.Second, func() bool {
		resp, err := srv.Client(t).Get(context.Background(), standby.layout.Election()+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && resp.Count == 2
	})
	if err := proxy.SetMode(faultproxy.Drop); err != nil {
		t.Fatal(err)
	}
	_ = proxy.Close()
	time.Sleep(time.Second)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run still campaigning 5 s after it was stopped, cut off from etcd")
	}
}
