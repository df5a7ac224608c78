package etcdtest

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quotacoord/quota/internal/faultproxy"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Cluster is three embedded etcd members on loopback that form one
// cluster, started by StartCluster.
type Cluster struct {
	// Endpoints are the members' client URLs as clients use them, in
	// member order: each reaches its member through a proxy of its own,
	// which Kill resets.
	Endpoints []string
	// Members are the members (their Endpoints are the members' own
	// client URLs); Kill stops one for good.
	Members []*Server
	// front[i] carries member i's client traffic, peer[i] the raft
	// traffic its peers send it.
	front, peer []*faultproxy.Proxy
}

// clusterSize is the members of a Cluster: the smallest that keeps a
// quorum with one member down.
const clusterSize = 3

// StartCluster runs three embedded etcd members for tb, each with its
// data in its own t.TempDir and its client and peer URLs on free loopback
// ports, and waits until every member serves (the cluster has a leader).
// The members are stopped at cleanup.
func StartCluster(tb testing.TB) *Cluster {
	tb.Helper()
	c := &Cluster{}
	var peers []string
	cfgs := make([]*embed.Config, clusterSize)
	for i := range clusterSize {
		s := &Server{dir: tb.TempDir()}
		cfg := embed.NewConfig()
		cfg.Name = fmt.Sprintf("member-%d", i)
		cfg.Dir = filepath.Join(s.dir, "data")
		cfg.InitialClusterToken = "etcdtest-cluster"
		cu, pu, err := freeURLs()
		if err != nil {
			tb.Fatalf("etcdtest: cluster: %v", err)
		}
		front, peer := c.proxy(tb, cu.Host), c.proxy(tb, pu.Host)
		c.front, c.peer = append(c.front, front), append(c.peer, peer)
		advertised := url.URL{Scheme: "http", Host: peer.Addr()}
		cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
		cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{advertised}
		peers = append(peers, cfg.Name+"="+advertised.String())
		s.Endpoints = []string{cu.String()}
		c.Members = append(c.Members, s)
		c.Endpoints = append(c.Endpoints, "http://"+front.Addr())
		cfgs[i] = cfg
	}
	tb.Cleanup(c.stop)
	// Every member must be listening before any can elect a leader, so
	// they start first and are waited for together.
	for i, cfg := range cfgs {
		cfg.InitialCluster = strings.Join(peers, ",")
		if err := c.Members[i].prepare(cfg); err != nil {
			tb.Fatalf("etcdtest: cluster: %v", err)
		}
		e, err := embed.StartEtcd(cfg)
		if err != nil {
			tb.Fatalf("etcdtest: cluster: start %s: %v", cfg.Name, err)
		}
		c.Members[i].etcd = e
	}
	for _, m := range c.Members {
		select {
		case <-m.etcd.Server.ReadyNotify():
		case <-time.After(30 * time.Second):
			tb.Fatal("etcdtest: cluster not ready after 30s")
		}
	}
	return c
}

// proxy starts a proxy to target, closed at cleanup.
func (c *Cluster) proxy(tb testing.TB, target string) *faultproxy.Proxy {
	tb.Helper()
	p, err := faultproxy.Start(faultproxy.Config{Target: target})
	if err != nil {
		tb.Fatalf("etcdtest: cluster: %v", err)
	}
	tb.Cleanup(func() { _ = p.Close() })
	return p
}

// stop kills every member at once. Stopping them gracefully one by one
// takes seconds (a leader hands its leadership to a peer that is stopping
// too) and leaves raft connections between them open until their read
// timeout.
func (c *Cluster) stop() {
	var wg sync.WaitGroup
	for i := range c.Members {
		wg.Go(func() { c.Kill(i) })
	}
	wg.Wait()
}

// freeURLs returns a client and a peer URL on free loopback ports.
func freeURLs() (client, peer url.URL, err error) {
	var addrs [2]string
	for i := range addrs {
		if addrs[i], err = freeAddr(); err != nil {
			return client, peer, err
		}
	}
	return url.URL{Scheme: "http", Host: addrs[0]}, url.URL{Scheme: "http", Host: addrs[1]}, nil
}

// Client returns a client of every member's endpoint, closed at cleanup.
func (c *Cluster) Client(tb testing.TB) *clientv3.Client {
	tb.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		tb.Fatalf("etcdtest: cluster client: %v", err)
	}
	tb.Cleanup(func() { _ = cli.Close() })
	return cli
}

// Leads reports whether member i runs and takes itself for the leader.
func (c *Cluster) Leads(i int) bool {
	m := c.Members[i]
	return m.etcd != nil && uint64(m.etcd.Server.MemberID()) == m.etcd.Server.Lead()
}

// Leader returns the index in Members of the member the running members
// agree leads, waiting up to ctx for one.
func (c *Cluster) Leader(ctx context.Context) (int, error) {
	for {
		lead, agree := uint64(0), true
		for _, m := range c.Members {
			if m.etcd == nil {
				continue
			}
			l := m.etcd.Server.Lead()
			if lead == 0 {
				lead = l
			}
			agree = agree && l == lead
		}
		for i := range c.Members {
			if agree && lead != 0 && c.Leads(i) {
				return i, nil
			}
		}
		select {
		case <-ctx.Done():
			return -1, fmt.Errorf("etcdtest: no leader: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Kill stops member i as a crash would: its clients' and its peers'
// connections to it are reset and new ones refused, and its raft node
// stops at once, without handing its leadership over. The other members
// elect a leader after their election timeout.
func (c *Cluster) Kill(i int) {
	m := c.Members[i]
	if m.etcd == nil {
		return
	}
	// Reset before stopping: a member that stops with clients connected
	// waits for their streams to end (up to its request timeout), while a
	// crashed one leaves them nothing to wait for.
	_ = c.front[i].SetMode(faultproxy.Reset)
	_ = c.peer[i].SetMode(faultproxy.Reset)
	m.etcd.Server.HardStop()
	m.Stop()
}
