package redistest

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Cluster is a Redis Cluster of three masters (no replicas), each a
// redis-server process on loopback started by StartCluster.
type Cluster struct {
	// Addrs are the masters' client addresses.
	Addrs   []string
	servers []*Server
}

// clusterSlots is the slot split of the three masters.
var clusterSlots = [3][2]int{{0, 5460}, {5461, 10922}, {10923, 16383}}

// StartCluster starts three redis-server processes with cluster mode on,
// assigns them the 16384 slots (CLUSTER ADDSLOTSRANGE), joins them (CLUSTER
// MEET) and waits until every node reports cluster_state:ok. The servers are
// stopped at the end of the test. The cluster bus uses its own free port
// (cluster-port), not port+10000.
func StartCluster(tb testing.TB) *Cluster {
	tb.Helper()
	c := &Cluster{}
	for range clusterSlots {
		bus, err := freeAddr()
		if err != nil {
			tb.Fatalf("redistest: cluster: %v", err)
		}
		_, busPort, _ := net.SplitHostPort(bus)
		s := Start(tb, "--cluster-enabled", "yes", "--cluster-port", busPort,
			"--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000")
		c.servers = append(c.servers, s)
		c.Addrs = append(c.Addrs, s.Addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.form(ctx); err != nil {
		tb.Fatalf("redistest: cluster: %v", err)
	}
	return c
}

func (c *Cluster) form(ctx context.Context) error {
	clients := make([]*redis.Client, len(c.Addrs))
	for i, a := range c.Addrs {
		clients[i] = redis.NewClient(&redis.Options{Addr: a})
		defer clients[i].Close()
	}
	for i, cl := range clients {
		if err := cl.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", clusterSlots[i][0], clusterSlots[i][1]).Err(); err != nil {
			return fmt.Errorf("addslotsrange on %s: %w", c.Addrs[i], err)
		}
	}
	for _, a := range c.Addrs[1:] {
		host, port, _ := net.SplitHostPort(a)
		if err := clients[0].Do(ctx, "CLUSTER", "MEET", host, port, busPortOf(ctx, clients, a)).Err(); err != nil {
			return fmt.Errorf("meet %s: %w", a, err)
		}
	}
	for {
		ok := 0
		for _, cl := range clients {
			info, err := cl.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_known_nodes:3") {
				ok++
			}
		}
		if ok == len(clients) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster_state not ok on every node: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// busPortOf reads the cluster bus port of the node at addr.
func busPortOf(ctx context.Context, clients []*redis.Client, addr string) string {
	for _, cl := range clients {
		if cl.Options().Addr != addr {
			continue
		}
		v, err := cl.ConfigGet(ctx, "cluster-port").Result()
		if err == nil {
			return v["cluster-port"]
		}
	}
	return "0"
}

// Client returns a ClusterClient of c, closed at the end of the test.
func (c *Cluster) Client(tb testing.TB) *redis.ClusterClient {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs})
	tb.Cleanup(func() { _ = cc.Close() })
	return cc
}

// Stop stops every node.
func (c *Cluster) Stop() {
	for _, s := range c.servers {
		s.Stop()
	}
}
