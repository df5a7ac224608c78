package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelMaster is the primary's name the Sentinels of StartSentinels
// monitor.
const SentinelMaster = "quota-primary"

// Sentinels is a Sentinel-managed Redis started by StartSentinels: two
// data nodes (a primary and its replica) and three Sentinels that monitor
// the primary under SentinelMaster with a quorum of two, each a process on
// loopback.
type Sentinels struct {
	// Addrs are the Sentinels' addresses.
	Addrs []string
	// Nodes are the data nodes: Nodes[0] is the primary at start,
	// Nodes[1] its replica.
	Nodes [2]*Server
	auth  SentinelAuth
	procs []*exec.Cmd
}

// SentinelAuth are the passwords of StartSentinels: Password is the data
// nodes' (requirepass, and masterauth for the replica), SentinelPassword
// the Sentinels' own (requirepass). Empty means none.
type SentinelAuth struct {
	Password, SentinelPassword string
}

// StartSentinels starts a primary, a replica of it (waiting until it is in
// sync) and three `redis-server sentinel.conf --sentinel` processes, and
// waits until every Sentinel knows the replica, so that a failover can
// pick it. A Sentinel deems the primary down after one second without an
// answer. Every process is stopped at the end of the test. With
// auth.Password, use Sentinels.Client rather than the data nodes'
// Server.Client.
func StartSentinels(tb testing.TB, auth SentinelAuth) *Sentinels {
	tb.Helper()
	s := &Sentinels{}
	s.Nodes[0] = Start(tb)
	host, port, _ := net.SplitHostPort(s.Nodes[0].Addr)
	s.Nodes[1] = Start(tb, "--replicaof", host, port)
	tb.Cleanup(s.stop)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if auth.Password != "" {
		// masterauth first on both, so that the replica's link survives
		// the primary's requirepass.
		for _, param := range []string{"masterauth", "requirepass"} {
			for _, n := range s.Nodes {
				c := s.node(n.Addr)
				err := c.ConfigSet(ctx, param, auth.Password).Err()
				_ = c.Close()
				if err != nil {
					tb.Fatalf("redistest: CONFIG SET %s on %s: %v", param, n.Addr, err)
				}
			}
		}
	}
	s.auth = auth
	if err := waitRole(ctx, s.node(s.Nodes[1].Addr), "slave", "master_link_status:up"); err != nil {
		tb.Fatalf("redistest: replica: %v", err)
	}
	dir := tb.TempDir()
	for range 3 {
		addr, err := s.startSentinel(dir, host, port)
		if err != nil {
			tb.Fatalf("redistest: sentinel: %v", err)
		}
		s.Addrs = append(s.Addrs, addr)
	}
	for _, a := range s.Addrs {
		if err := waitReplicaKnown(ctx, s.sentinel(a), s.Nodes[1].Addr); err != nil {
			tb.Fatalf("redistest: sentinel %s: %v", a, err)
		}
	}
	return s
}

// Client returns a client of the data node at addr with the data nodes'
// password, closed at the end of the test.
func (s *Sentinels) Client(tb testing.TB, addr string) *redis.Client {
	c := s.node(addr)
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// node is a client of the data node at addr.
func (s *Sentinels) node(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, Password: s.auth.Password, MaxRetries: -1})
}

// sentinel is a client of the Sentinel at addr.
func (s *Sentinels) sentinel(addr string) *redis.SentinelClient {
	return redis.NewSentinelClient(&redis.Options{Addr: addr, Password: s.auth.SentinelPassword, MaxRetries: -1})
}

// startSentinel writes a sentinel.conf in dir monitoring host:port and
// runs a Sentinel on it.
func (s *Sentinels) startSentinel(dir, host, port string) (string, error) {
	addr, err := freeAddr()
	if err != nil {
		return "", err
	}
	_, own, _ := net.SplitHostPort(addr)
	conf := filepath.Join(dir, "sentinel-"+own+".conf")
	text := fmt.Sprintf(`bind 127.0.0.1
port %s
daemonize no
protected-mode no
dir %s
logfile %s
sentinel monitor %s %s %s 2
sentinel down-after-milliseconds %[4]s 1000
sentinel failover-timeout %[4]s 4000
sentinel parallel-syncs %[4]s 1
`, own, dir, filepath.Join(dir, "sentinel-"+own+".log"), SentinelMaster, host, port)
	if s.auth.Password != "" {
		text += fmt.Sprintf("sentinel auth-pass %s %s\n", SentinelMaster, s.auth.Password)
	}
	if s.auth.SentinelPassword != "" {
		text += "requirepass " + s.auth.SentinelPassword + "\n"
	}
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		return "", err
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return "", fmt.Errorf("redis-server not installed: %w", err)
	}
	cmd := exec.Command(bin, conf, "--sentinel")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("start redis-server --sentinel: %w", err)
	}
	s.procs = append(s.procs, cmd)
	if err := waitListening(addr, 5*time.Second); err != nil {
		return "", fmt.Errorf("sentinel on %s: %w (log: %s)", addr, err, tail(filepath.Join(dir, "sentinel-"+own+".log")))
	}
	return addr, nil
}

// waitListening waits until addr accepts connections (a Sentinel with a
// password answers PING with NOAUTH, so waitReady does not fit).
func waitListening(addr string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			return c.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not listening after %v: %w", within, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop kills the Sentinels (the data nodes stop with their own cleanup).
func (s *Sentinels) stop() {
	for _, c := range s.procs {
		_ = c.Process.Kill()
		_ = c.Wait()
	}
	s.procs = nil
}

// primary returns the primary's address as the Sentinel at addr names it.
func (s *Sentinels) primary(ctx context.Context, addr string) (string, error) {
	c := s.sentinel(addr)
	defer c.Close()
	hp, err := c.GetMasterAddrByName(ctx, SentinelMaster).Result()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(hp[0], hp[1]), nil
}

// Failover waits until every Sentinel knows the other data node as a
// replica in sync, has the first Sentinel fail the primary over to it
// (SENTINEL FAILOVER, no agreement asked) and waits until every Sentinel
// names it and it serves as the primary. It returns the new primary's
// address.
func (s *Sentinels) Failover(tb testing.TB) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	old, err := s.primary(ctx, s.Addrs[0])
	if err != nil {
		tb.Fatalf("redistest: primary: %v", err)
	}
	replica := s.Nodes[0].Addr
	if old == replica {
		replica = s.Nodes[1].Addr
	}
	for _, a := range s.Addrs {
		if err := waitReplicaKnown(ctx, s.sentinel(a), replica); err != nil {
			tb.Fatalf("redistest: sentinel %s: %v", a, err)
		}
	}
	c := s.sentinel(s.Addrs[0])
	defer c.Close()
	if err := c.Failover(ctx, SentinelMaster).Err(); err != nil {
		tb.Fatalf("redistest: SENTINEL FAILOVER: %v", err)
	}
	var now string
	for _, a := range s.Addrs {
		for now = old; now == old; {
			if now, err = s.primary(ctx, a); err != nil || ctx.Err() != nil {
				tb.Fatalf("redistest: sentinel %s after the failover: primary %s, %v", a, now, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if err := waitRole(ctx, s.node(now), "master", ""); err != nil {
		tb.Fatalf("redistest: new primary %s: %v", now, err)
	}
	return now
}

// Remonitor makes every Sentinel monitor the primary at addr in place of
// the one it knew (SENTINEL REMOVE, then MONITOR with the settings of
// StartSentinels): what the Sentinels say after an operator moved the
// primary by hand, without a failover of their own and so without a
// +switch-master announcement.
func (s *Sentinels) Remonitor(tb testing.TB, addr string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	host, port, _ := net.SplitHostPort(addr)
	for _, a := range s.Addrs {
		c := s.sentinel(a)
		set := []any{"SENTINEL", "SET", SentinelMaster, "down-after-milliseconds", 1000, "failover-timeout", 4000}
		if s.auth.Password != "" {
			set = append(set, "auth-pass", s.auth.Password)
		}
		for _, args := range [][]any{
			{"SENTINEL", "REMOVE", SentinelMaster},
			{"SENTINEL", "MONITOR", SentinelMaster, host, port, 2},
			set,
		} {
			if err := c.Process(ctx, redis.NewStatusCmd(ctx, args...)); err != nil {
				_ = c.Close()
				tb.Fatalf("redistest: sentinel %s: %v: %v", a, args, err)
			}
		}
		_ = c.Close()
	}
}

// waitRole waits until the server of c reports role (INFO
// replication's role: "master" or "slave") and, unless empty, the line
// also. It closes c.
func waitRole(ctx context.Context, c *redis.Client, role, also string) error {
	defer c.Close()
	var info string
	for {
		var err error
		info, err = c.Info(ctx, "replication").Result()
		if err == nil && strings.Contains(info, "role:"+role+"\r\n") && (also == "" || strings.Contains(info, also+"\r\n")) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no role %s (%s): %q, %v", role, also, info, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// waitReplicaKnown waits until the Sentinel of c lists replica as a
// replica of the primary, linked and up. It closes c.
func waitReplicaKnown(ctx context.Context, c *redis.SentinelClient, replica string) error {
	defer c.Close()
	var last []map[string]string
	for {
		var err error
		last, err = c.Replicas(ctx, SentinelMaster).Result()
		if err == nil && slices.ContainsFunc(last, func(r map[string]string) bool {
			return net.JoinHostPort(r["ip"], r["port"]) == replica && r["flags"] == "slave" && r["master-link-status"] == "ok"
		}) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("replica %s not known: %v, %v", replica, last, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
