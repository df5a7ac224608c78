package e2e

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotacoord/quota/internal/redistest"
	"github.com/quotacoord/quota/internal/regional"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

// sentinelPolicy admits far more than the test asks, so that a denial can
// only be the failure mode's.
var sentinelPolicy = []byte(`policies:
  - name: sentinel
    description: a budget the test never spends; failures deny
    capacity: 100000
    rate: 100000/minute
    failure_mode: closed
`)

// sentinelNode is a standalone regional node whose Redis is the primary
// that sg's Sentinels name.
type sentinelNode struct {
	t   *testing.T
	adm quotav1.AdmissionClient
}

// startSentinelNode runs regional.Run with -redis-sentinel and
// -redis-sentinel-master set to sg's Sentinels and the passwords of auth
// in -redis-password-file and -redis-sentinel-password-file, stopped at
// cleanup.
func startSentinelNode(t *testing.T, sg *redistest.Sentinels, auth redistest.SentinelAuth) *sentinelNode {
	t.Helper()
	dir := t.TempDir()
	file := func(name string, content []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, content, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	l := launch(t, regional.DaemonConfig{
		Region: "solo", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Policies: file("policies.yaml", sentinelPolicy),
		Redis: strings.Join(sg.Addrs, ","), RedisSentinelMaster: redistest.SentinelMaster,
		RedisPasswordFile:         file("redis-password", []byte(auth.Password+"\n")),
		RedisSentinelPasswordFile: file("sentinel-password", []byte(auth.SentinelPassword+"\n")),
		StoreTimeout:              250 * time.Millisecond, ShutdownTimeout: 3 * time.Second,
	}, newLineLog(t), "node")
	t.Cleanup(func() { l.stop(t) })
	return &sentinelNode{t: t, adm: l.admission()}
}

// check asks for one unit; a store failure shows as degraded.
func (n *sentinelNode) check() (allowed, degraded bool) {
	n.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), checkTimeout)
	defer cancel()
	resp, err := n.adm.Check(ctx, &quotav1.CheckRequest{Subject: "tenant-1", Policies: []string{"sentinel"}})
	if err != nil {
		n.t.Fatalf("check: %v (every check must be answered)", err)
	}
	return resp.Allowed, resp.Degraded != ""
}

// until checks until one is admitted by the server behind c (not
// degraded, and c's script runs grew), failing the test after d. Every
// degraded check must be a denial (the policy fails closed): a store
// failure never admits. It returns the degraded checks.
func (n *sentinelNode) until(c *redis.Client, d time.Duration, what string) int {
	n.t.Helper()
	start, failed := time.Now(), 0
	for {
		before := scriptRuns(n.t, c)
		allowed, degraded := n.check()
		switch {
		case degraded && allowed:
			n.t.Fatal("a degraded check was admitted under failure_mode closed")
		case degraded:
			failed++
		case allowed:
			if scriptRuns(n.t, c) > before {
				return failed
			}
		default:
			n.t.Fatal("a check was denied by the store: the budget is never spent")
		}
		if time.Since(start) > d {
			n.t.Fatalf("after %v no check admitted %s (%d degraded)", d, what, failed)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// steady asks k checks and fails the test unless each is admitted from
// the store.
func (n *sentinelNode) steady(k int, what string) {
	n.t.Helper()
	for i := range k {
		if allowed, degraded := n.check(); !allowed || degraded {
			n.t.Fatalf("check %d %s: allowed %v, degraded %v", i, what, allowed, degraded)
		}
	}
}

// scriptRuns is the script calls (EVALSHA and EVAL) the server at addr ran.
func scriptRuns(t *testing.T, c *redis.Client) int {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, line := range strings.Split(info, "\r\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_eval"); ok && (strings.HasPrefix(rest, ":") || strings.HasPrefix(rest, "sha:")) {
			v := rest[strings.Index(rest, "calls=")+len("calls="):]
			n, err := strconv.Atoi(v[:strings.IndexByte(v, ',')])
			if err != nil {
				t.Fatalf("commandstats %q: %v", line, err)
			}
			total += n
		}
	}
	return total
}

// TestNodeFollowsSentinelPrimary runs a regional node on a Sentinel-managed
// Redis (a primary, a replica and three real Sentinels, the data nodes and
// the Sentinels each with a password the node reads from its file) through
// two changes of primary, without restarting it:
//
//   - an operator promotes the replica and demotes the primary with
//     REPLICAOF while the node holds pooled connections to it, and the
//     Sentinels learn of it only later (no +switch-master): the demoted
//     primary answers READONLY, and every check meanwhile is answered by
//     the policy's failure mode (closed: denied, degraded), never
//     admitted; once the Sentinels name the new primary the node's checks
//     run there;
//   - SENTINEL FAILOVER moves the primary back: the node follows it.
func TestNodeFollowsSentinelPrimary(t *testing.T) {
	auth := redistest.SentinelAuth{Password: "data-s3cret", SentinelPassword: "watch-s3cret"}
	sg := redistest.StartSentinels(t, auth)
	n := startSentinelNode(t, sg, auth)
	first, second := sg.Nodes[0], sg.Nodes[1]
	fc, sc := sg.Client(t, first.Addr), sg.Client(t, second.Addr)
	n.until(fc, 10*time.Second, "at start")
	n.steady(20, "on the first primary")

	ctx := context.Background()
	if err := sc.Do(ctx, "REPLICAOF", "NO", "ONE").Err(); err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(second.Addr)
	if err := fc.Do(ctx, "REPLICAOF", host, port).Err(); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if allowed, degraded := n.check(); allowed || !degraded {
			t.Fatalf("check %d on the demoted primary: allowed %v, degraded %v; want the failure mode's denial", i, allowed, degraded)
		}
	}
	if !strings.Contains(infoSection(t, fc, "errorstats"), "errorstat_READONLY:") {
		t.Fatal("the demoted primary sent no READONLY reply")
	}
	sg.Remonitor(t, second.Addr)
	failed := n.until(sc, 10*time.Second, "on the new primary")
	before := scriptRuns(t, sc)
	n.steady(20, "on the new primary")
	if ran := scriptRuns(t, sc) - before; ran < 20 {
		t.Fatalf("the new primary ran %d scripts for 20 checks", ran)
	}
	t.Logf("manual switch: the node's checks reached the new primary after %d degraded denials (the open breaker keeps Redis out for its cooldown)", failed)

	if now := sg.Failover(t); now != first.Addr {
		t.Fatalf("SENTINEL FAILOVER promoted %s, want %s", now, first.Addr)
	}
	failed = n.until(fc, 10*time.Second, "after SENTINEL FAILOVER")
	before = scriptRuns(t, fc)
	n.steady(20, "after SENTINEL FAILOVER")
	if ran := scriptRuns(t, fc) - before; ran < 20 {
		t.Fatalf("the promoted primary ran %d scripts for 20 checks", ran)
	}
	t.Logf("SENTINEL FAILOVER: the node's checks reached the promoted primary after %d degraded denials", failed)
}

// infoSection returns one INFO section of the server behind c.
func infoSection(t *testing.T, c *redis.Client, section string) string {
	t.Helper()
	s, err := c.Info(context.Background(), section).Result()
	if err != nil {
		t.Fatal(err)
	}
	return s
}
