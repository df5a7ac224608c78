package demo

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/hashicorp/go-hclog"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/quotacoord/quota/internal/coordinator"
	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/rebalance"
)

// CoordinatorConfig says how the demo's coordinator runs.
type CoordinatorConfig struct {
	// Dir holds the embedded etcd's data and the operator token file.
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

// Coordinator is the real coordinator process (package
// internal/coordinator: embedded etcd, the rebalance loop, the operator
// gRPC API that quotactl talks to, /metrics and /healthz), run in this
// process on loopback, plus an etcd client for the demo itself.
type Coordinator struct {
	// EtcdAddr is the embedded etcd's client address (host:port).
	EtcdAddr string
	// GRPCAddr is the operator API (quotactl -coordinator); HTTPAddr
	// serves /metrics and /healthz.
	GRPCAddr, HTTPAddr string
	// TokenFile holds the operator write token (quotactl -token-file).
	TokenFile string
	// Client is the demo's own etcd client.
	Client *clientv3.Client
	c      *coordinator.Coordinator
	cancel context.CancelFunc
}

// StartCoordinator starts the coordinator on free loopback ports with its
// data in cfg.Dir. It runs goroutines until Stop.
func StartCoordinator(ctx context.Context, cfg CoordinatorConfig) (*Coordinator, error) {
	cport, err := FreePort()
	if err != nil {
		return nil, err
	}
	skew := cfg.SkewMargin
	if skew <= 0 {
		skew = 500 * time.Millisecond
	}
	cctx, cancel := context.WithCancel(ctx)
	c, err := coordinator.Start(cctx, coordinator.Config{
		DataDir:          cfg.Dir,
		EmbeddedEtcdAddr: "127.0.0.1:" + strconv.Itoa(cport),
		GRPCAddr:         "127.0.0.1:0",
		HTTPAddr:         "127.0.0.1:0",
		Rebalance: rebalance.Config{
			Name:     "demo-coordinator",
			Interval: cfg.RebalanceInterval, ReportInterval: cfg.ReportInterval, RegionLeaseTTL: cfg.RegionLeaseTTL,
			SkewMargin: skew, SessionTTL: 2 * time.Second,
			MaxStep: cfg.MaxStep, DeadBand: cfg.DeadBand, Alpha: cfg.Alpha,
		},
		Logger: hclog.New(&hclog.LoggerOptions{Name: "coordinator", Output: cfg.Log, Level: hclog.Info}),
	})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("demo: start coordinator: %w", err)
	}
	co := &Coordinator{EtcdAddr: "127.0.0.1:" + strconv.Itoa(cport), GRPCAddr: c.GRPCAddr, HTTPAddr: c.HTTPAddr,
		TokenFile: c.TokenFile, c: c, cancel: cancel}
	co.Client, err = clientv3.New(clientv3.Config{Endpoints: c.EtcdEndpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		cancel()
		_ = c.Wait()
		return nil, fmt.Errorf("demo: etcd client: %w", err)
	}
	return co, nil
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

// Stop stops the coordinator (servers, loop, embedded etcd) and waits for
// it.
func (c *Coordinator) Stop() {
	_ = c.Client.Close()
	c.cancel()
	_ = c.c.Wait()
}
