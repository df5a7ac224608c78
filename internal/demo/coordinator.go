package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/rebalance"
)

// CoordinatorConfig says how the demo's coordinator runs.
type CoordinatorConfig struct {
	// Dir holds the embedded etcd's data.
	Dir string
	// RebalanceInterval, ReportInterval and RegionLeaseTTL go to the
	// rebalance loop (the last two are published for the regions).
	RebalanceInterval, ReportInterval, RegionLeaseTTL time.Duration
	// SkewMargin is the wait after a region's lease expired before its
	// share is handed over; default 500ms.
	SkewMargin time.Duration
	// MaxStep, DeadBand and Alpha go to the loop (zero: its defaults).
	MaxStep, DeadBand, Alpha float64
	// Log receives the coordinator's logs.
	Log io.Writer
}

// Coordinator is an embedded etcd plus the rebalance loop that leads
// through it, with /metrics and /healthz on HTTPAddr.
type Coordinator struct {
	EtcdAddr string
	HTTPAddr string
	Client   *clientv3.Client
	etcd     *embed.Etcd
	http     *http.Server
	cancel   context.CancelFunc
	done     chan error
}

// StartCoordinator starts embedded etcd on free loopback ports and the
// rebalance loop on it. The loop runs in a goroutine until Stop.
func StartCoordinator(ctx context.Context, cfg CoordinatorConfig) (*Coordinator, error) {
	cport, err := FreePort()
	if err != nil {
		return nil, err
	}
	pport, err := FreePort()
	if err != nil {
		return nil, err
	}
	hport, err := FreePort()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	ec := embed.NewConfig()
	ec.Dir = cfg.Dir
	ec.Logger = "zap"
	ec.LogLevel = "error"
	ec.LogOutputs = []string{filepath.Join(cfg.Dir, "etcd.log")}
	cu, _ := url.Parse("http://127.0.0.1:" + strconv.Itoa(cport))
	pu, _ := url.Parse("http://127.0.0.1:" + strconv.Itoa(pport))
	ec.ListenClientUrls, ec.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	ec.ListenPeerUrls, ec.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	ec.InitialCluster = ec.Name + "=" + pu.String()
	e, err := embed.StartEtcd(ec)
	if err != nil {
		return nil, fmt.Errorf("demo: start embedded etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		e.Close()
		return nil, errors.New("demo: embedded etcd not ready after 30s")
	}
	c := &Coordinator{EtcdAddr: cu.Host, etcd: e, done: make(chan error, 1)}
	c.Client, err = clientv3.New(clientv3.Config{Endpoints: []string{cu.String()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		e.Close()
		return nil, fmt.Errorf("demo: etcd client: %w", err)
	}
	reg := prometheus.NewRegistry()
	skew := cfg.SkewMargin
	if skew <= 0 {
		skew = 500 * time.Millisecond
	}
	loop, err := rebalance.New(rebalance.Config{
		Client: c.Client, Name: "demo-coordinator",
		Interval: cfg.RebalanceInterval, ReportInterval: cfg.ReportInterval, RegionLeaseTTL: cfg.RegionLeaseTTL,
		SkewMargin: skew, SessionTTL: 2 * time.Second,
		MaxStep: cfg.MaxStep, DeadBand: cfg.DeadBand, Alpha: cfg.Alpha,
		Logger:     hclog.New(&hclog.LoggerOptions{Name: "coordinator", Output: cfg.Log, Level: hclog.Info}),
		Registerer: reg,
	})
	if err != nil {
		c.Client.Close()
		e.Close()
		return nil, fmt.Errorf("demo: rebalance loop: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	hl, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(hport))
	if err != nil {
		c.Client.Close()
		e.Close()
		return nil, fmt.Errorf("demo: coordinator HTTP: %w", err)
	}
	c.HTTPAddr = hl.Addr().String()
	c.http = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = c.http.Serve(hl) }()
	lctx, cancel := context.WithCancel(ctx)
	c.cancel = cancel
	go func() { c.done <- loop.Run(lctx) }()
	return c, nil
}

// PutPolicy stores a policy document where the coordinator and the regions
// read it.
func (c *Coordinator) PutPolicy(ctx context.Context, name string, doc []byte) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := c.Client.Put(ctx, etcdlayout.Layout{}.PolicyDoc(name), string(doc)); err != nil {
		return fmt.Errorf("demo: store policy %s: %w", name, err)
	}
	return nil
}

// Stop ends the loop, the HTTP server and etcd, and waits for them.
func (c *Coordinator) Stop() {
	c.cancel()
	<-c.done
	_ = c.http.Close()
	_ = c.Client.Close()
	c.etcd.Close()
	<-c.etcd.Server.StopNotify()
}
