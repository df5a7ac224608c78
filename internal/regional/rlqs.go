package regional

import (
	"context"
	"flag"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/daemon"
	"github.com/quotacoord/quota/internal/policy"
	"github.com/quotacoord/quota/internal/rlqs"
)

// RLQSConfig turns on Envoy's Rate Limit Quota Service (internal/rlqs)
// on the node's gRPC port.
type RLQSConfig struct {
	// Enabled serves envoy.service.rate_limit_quota.v3 beside the RLS.
	Enabled bool
	// Interval, TTL, Margin and Reserve are rlqs.Config's; zero takes
	// its defaults.
	Interval, TTL, Margin time.Duration
	Reserve               float64
	// KeyOrder orders bucket-id keys into descriptors (rlqs.Config.KeyOrder).
	KeyOrder []string

	// gate forwards the region sync's acknowledgement gate to the server
	// once it runs (the Syncer is built first).
	gate *rlqsGate
}

// RLQSFlags registers the -rlqs flags on fs, filling c.
func RLQSFlags(fs *flag.FlagSet, c *RLQSConfig) {
	fs.BoolVar(&c.Enabled, "rlqs", false, "serve Envoy's Rate Limit Quota Service (rate_limit_quota filter) on the gRPC port; assignments are leases on the region's buckets (docs/rlqs.md)")
	fs.DurationVar(&c.Interval, "rlqs-interval", 0, "how often RLQS assignments are re-split by demand and sent (default 1s)")
	fs.DurationVar(&c.TTL, "rlqs-ttl", 0, "RLQS assignment TTL, whole seconds, above interval plus margin (default 3s)")
	fs.DurationVar(&c.Margin, "rlqs-margin", 0, "bound on the time an assignment takes to reach an Envoy; leases last TTL plus this (default 1s)")
	fs.Float64Var(&c.Reserve, "rlqs-reserve", 0, "part of a region's refill never leased to Envoys, in [0, 0.9] (default 0.1)")
	fs.Func("rlqs-key-order", "comma-separated bucket-id keys, in descriptor order (the others follow, sorted)", func(s string) error {
		c.KeyOrder = strings.Split(s, ",")
		return nil
	})
}

// rlqsGate is the LeaseGate handed to the region sync: the RLQS server's
// HeldAbove once it runs, nothing before. A nil gate holds nothing.
// It also holds the node's own leases (Node.HeldAbove) once the node is
// built.
type rlqsGate struct {
	srv  atomic.Pointer[rlqs.Server]
	node atomic.Pointer[Node]
}

func (g *rlqsGate) HeldAbove(policy string, share func(string) float64) time.Time {
	var last time.Time
	if g == nil {
		return last
	}
	if s := g.srv.Load(); s != nil {
		last = s.HeldAbove(policy, share)
	}
	if n := g.node.Load(); n != nil {
		if t := n.HeldAbove(policy, share); t.After(last) {
			last = t
		}
	}
	return last
}

// HeldAbove returns when the last node lease of policy taken at a share
// above share(subject) ends (zero: none), for regionsync.LeaseGate.
func (n *Node) HeldAbove(policy string, share func(subject string) float64) time.Time {
	if n.leases == nil {
		return time.Time{}
	}
	return n.leases.heldAbove(policy, share)
}

// startRLQS builds the RLQS server when c enables it, registers it on gs
// and runs its rounds until ctx ends (then it drains); cleanup waits for
// it.
func startRLQS(ctx context.Context, c DaemonConfig, n *Node, store bucket.Store, shares ShareSource, gs *grpc.Server,
	reg prometheus.Registerer, log hclog.Logger, cleanup *daemon.Cleanup) error {
	if !c.RLQS.Enabled {
		return nil
	}
	leaser, ok := store.(bucket.Leaser)
	if !ok {
		return fmt.Errorf("regional: -rlqs: the store cannot lease")
	}
	node := c.NodeID
	if len(node) > 40 {
		node = node[:40]
	}
	srv, err := rlqs.New(rlqs.Config{
		Policies: n.Policies, Subjects: n.envoySubj, KeyOrder: c.RLQS.KeyOrder,
		Share: shares.Share, Request: n.leaseRequest, Demand: n.cfg.Demand, Part: n.demandPart, Store: leaser, Node: node,
		Interval: c.RLQS.Interval, TTL: c.RLQS.TTL, Margin: c.RLQS.Margin, Reserve: c.RLQS.Reserve,
		Logger: log.Named("rlqs"), Registerer: reg,
	})
	if err != nil {
		return fmt.Errorf("regional: -rlqs: %w", err)
	}
	srv.Register(gs)
	if c.RLQS.gate != nil {
		c.RLQS.gate.srv.Store(srv)
	}
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = srv.Run(rctx) // drains when ctx ends
	}()
	cleanup.Push(func() { cancel(); wg.Wait() })
	log.Info("serving RLQS")
	return nil
}

// leaseRequest is the bucket request a check of p for subject would make
// at now, cost 0: the same key version, share, Since and Withheld, so that
// RLQS leases and the node's checks share one bucket under one rule.
func (n *Node) leaseRequest(p *policy.Policy, subject bucket.Subject, now time.Time) (bucket.Request, error) {
	key, err := bucket.NewSubjectKey(p.Name, p.KeyVersion(), subject)
	if err != nil {
		return bucket.Request{}, err
	}
	share := n.cfg.Shares.Share(p.Name, subject.String())
	switch {
	case math.IsNaN(share) || share < 0:
		share = 0
	case share > 1+p.Limits.Overcommit:
		share = 1 + p.Limits.Overcommit
	}
	it := item{label: p.Name, pol: p, subject: subject.String(),
		req: bucket.Request{Key: key, Limits: p.Limits, Share: share, Since: n.versions.since(p, key.Version(), now)}}
	it.req.Withheld = n.withheld(&it)
	return it.req, nil
}
