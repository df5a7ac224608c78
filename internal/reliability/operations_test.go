package reliability

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/hashicorp/go-hclog"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/quotacoord/quota/internal/coordinator"
	"github.com/quotacoord/quota/internal/etcdauth"
	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/etcdtest"
	"github.com/quotacoord/quota/internal/grpctest"
	"github.com/quotacoord/quota/internal/logbuf"
	"github.com/quotacoord/quota/internal/operatorclient"
	"github.com/quotacoord/quota/internal/redistest"
	"github.com/quotacoord/quota/internal/regional"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
	"github.com/quotacoord/quota/rebalance"
)

// TestRedisCredentialAttack (issue 14 item 10): a node given no Redis
// password, a wrong one, or an ACL user with another user's password
// must not start. Had it started, Redis would refuse every script and
// each policy's failure mode would decide: a fail-open policy admits
// everyone. Each start attempt is a request of the row; a node that
// starts anyway gets 2×capacity checks of a fail-open policy, each
// admission counted (as fail-open when degraded, as lifted otherwise:
// Redis never decided). The right credentials start a node whose checks
// Redis decides, so the refusals are about the credentials.
func TestRedisCredentialAttack(t *testing.T) {
	const capacity, userPW, defaultPW = 5, "user-s3cret", "default-s3cret"
	srv := redistest.Start(t)
	redistest.RequireAuth(t, srv.Addr, "limiter", userPW, defaultPW)
	pol := writePolicies(t, "policies:\n  - {name: cred-open, capacity: 5, rate: 5/hour, failure_mode: open}\n")
	wrongFile := writeFile(t, filepath.Join(t.TempDir(), "wrong"), []byte("nope\n"))

	// A generous store budget: under -race on a loaded machine the first
	// script call can pass the 5 ms default, and the open policy would
	// then decide; this node is about its credentials.
	good := startNode(t, regional.DaemonConfig{Redis: srv.Addr, RedisUsername: "limiter", RedisPassword: userPW, Policies: pol,
		StoreTimeout: time.Second}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if r, err := good.adm.Check(ctx, &quotav1.CheckRequest{Subject: "control", Policies: []string{"cred-open"}}); err != nil || !r.Allowed || r.Degraded != "" {
		t.Fatalf("node with the right credentials: %v, %v; want a decision by Redis", r, err)
	}

	var o attackOutcome
	for _, c := range []struct {
		name string
		cfg  regional.DaemonConfig
	}{
		{"no password", regional.DaemonConfig{Redis: srv.Addr}},
		{"wrong password file", regional.DaemonConfig{Redis: srv.Addr, RedisPasswordFile: wrongFile}},
		{"ACL user, the default user's password", regional.DaemonConfig{Redis: srv.Addr, RedisUsername: "limiter", RedisPassword: defaultPW}},
		{"URL with a wrong password", regional.DaemonConfig{Redis: "redis://limiter:wrong-s3cret@" + srv.Addr}},
	} {
		c.cfg.Policies, c.cfg.GRPCAddr, c.cfg.HTTPAddr = pol, "127.0.0.1:0", "127.0.0.1:0"
		c.cfg.Logger = hclog.NewNullLogger()
		announced := &logbuf.Buffer{}
		c.cfg.Announce = announced
		o.sent++
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- regional.Run(runCtx, c.cfg) }()
		var grpcAddr string
		for deadline := time.Now().Add(10 * time.Second); grpcAddr == "" && len(done) == 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			for _, m := range listenRE.FindAllStringSubmatch(announced.String(), -1) {
				if m[1] == "grpc" {
					grpcAddr = m[2]
				}
			}
		}
		switch {
		case grpcAddr != "":
			t.Errorf("%s: the node started", c.name)
			credentialAttack(ctx, t, grpcAddr, 2*capacity, &o)
		case len(done) == 0:
			t.Fatalf("%s: Run neither returned nor listened in 10s", c.name)
		default:
			err := <-done
			done <- err // for the wait below
			if err == nil || !strings.Contains(err.Error(), "redis refused the credentials") || strings.Contains(err.Error(), "s3cret") {
				t.Errorf("%s: Run = %v, want a start error saying Redis refused the credentials, without the password", c.name, err)
			}
		}
		stop()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: Run did not return after cancel", c.name)
		}
	}
	reportAttack(t, "Redis credentials wrong or absent: the node must not start", o, 0)
}

// credentialAttack sends n checks of the fail-open policy to the node at
// addr, which cannot authenticate to Redis, and counts them into o.
func credentialAttack(ctx context.Context, t *testing.T, addr string, n int, o *attackOutcome) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	adm := quotav1.NewAdmissionClient(conn)
	for range n {
		o.sent++
		r, err := adm.Check(ctx, &quotav1.CheckRequest{Subject: "no-credentials", Policies: []string{"cred-open"}})
		switch {
		case err != nil, r.Allowed && r.Degraded != "":
			o.failOpen++
		case r.Allowed:
			o.admitted++
		}
	}
}

// TestPlaintextTokenAttack (issue 14 item 11): an attacker on the path
// between quotactl and a coordinator reached without TLS reads the
// operator's write token. quotactl's connection (operatorclient.Dial,
// which quotactl uses) must refuse a token in plaintext to any target
// that may leave the machine, before it dials. The network is a tap on
// loopback that every dial reaches and that records the authorization
// headers it sees: each token it sees is a limit lifted (with it the
// attacker rewrites every policy). --insecure-plaintext, the operator's
// explicit choice, shows the tap works.
func TestPlaintextTokenAttack(t *testing.T) {
	tap := grpctest.StartTokenTap(t)
	const token = "fedcba9876543210fedcba98"
	tokenFile := writeFile(t, filepath.Join(t.TempDir(), "tokens"), []byte("write:"+token+"\n"))
	var dials sync.Map
	dialer := func(ctx context.Context, addr string) (net.Conn, error) {
		dials.Store(addr, true)
		var d net.Dialer
		return d.DialContext(ctx, "tcp", tap.Addr)
	}
	call := func(c operatorclient.Config) error {
		c.TokenFile, c.Dialer = tokenFile, dialer
		conn, err := operatorclient.Dial(c)
		if err != nil {
			return err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = quotav1.NewOperatorClient(conn).ApplyPolicy(ctx, &quotav1.ApplyPolicyRequest{Filename: "p.yaml", Document: []byte(simplePolicy)})
		return err
	}

	var o attackOutcome
	for _, target := range []string{"192.0.2.10:8091", "coordinator.internal:8091", "dns:///coordinator.internal:8091",
		"passthrough:///192.0.2.10:8091", "[2001:db8::1]:8091", ":8091"} {
		o.sent++
		if err := call(operatorclient.Config{Addr: target}); err == nil || !strings.Contains(err.Error(), "--insecure-plaintext") {
			t.Errorf("plaintext token to %s: %v, want a refusal naming --tls and --insecure-plaintext", target, err)
		}
	}
	dials.Range(func(k, _ any) bool {
		t.Errorf("a refused call dialed %v", k)
		return true
	})
	o.admitted = len(tap.Tokens())

	// The tap sees what an allowed plaintext call sends.
	if err := call(operatorclient.Config{Addr: "192.0.2.10:8091", InsecurePlaintext: true}); status.Code(err) != codes.Unimplemented {
		t.Fatalf("--insecure-plaintext call: %v, want the tap's Unimplemented", err)
	}
	if got := tap.Tokens(); len(got) != o.admitted+1 || got[len(got)-1] != "Bearer "+token {
		t.Fatalf("the tap saw %q after an allowed plaintext call: it cannot see a leaked token", got)
	}
	reportAttack(t, "operator token in plaintext off loopback (quotactl)", o, 0)
}

// TestExposedDefaultsAttack (issue 14 item 12): what an attacker who
// reaches a host finds on the daemons' ports when the operator kept the
// defaults. Each probe is a request; each one that finds something open
// is a limit lifted:
//   - the node's and the coordinator's HTTP listener (metrics, health),
//     started on the default host: it must be loopback, not every
//     interface;
//   - gRPC server reflection on the node and the coordinator: it must be
//     off (it lists every service to whoever reaches the port);
//   - the coordinator's /healthz with etcd down: no error text (endpoints,
//     TLS details) for an unauthenticated caller.
func TestExposedDefaultsAttack(t *testing.T) {
	defaultHost := func(addr string) string {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		return net.JoinHostPort(host, "0")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var o attackOutcome
	probe := func(what string, open bool) {
		o.sent++
		if open {
			o.admitted++
			t.Errorf("%s: open to an attacker", what)
		}
	}
	n := startNode(t, regional.DaemonConfig{Policies: writePolicies(t, simplePolicy), HTTPAddr: defaultHost(regional.DefaultHTTPAddr)}, nil)
	probe("node HTTP listener "+n.httpAddr, !onLoopback(n.httpAddr))
	services, err := grpctest.ReflectionServices(ctx, n.grpcAddr)
	probe(fmt.Sprintf("node gRPC reflection (%v, %v)", services, err), status.Code(err) != codes.Unimplemented)

	etcd := etcdtest.Start(t)
	c, logs, _, _ := startCoordinator(t, func(cfg *coordinator.Config) {
		cfg.EtcdEndpoints, cfg.HTTPAddr = etcd.Endpoints, defaultHost(coordinator.DefaultHTTPAddr)
	})
	probe("coordinator HTTP listener "+c.HTTPAddr, !onLoopback(c.HTTPAddr))
	services, err = grpctest.ReflectionServices(ctx, c.GRPCAddr)
	probe(fmt.Sprintf("coordinator gRPC reflection (%v, %v)", services, err), status.Code(err) != codes.Unimplemented)

	// Stopped while the coordinator is leader, as in a real outage (a
	// campaign under way when etcd stops would wait for etcd to return).
	waitFor(t, "the coordinator to lead", 20*time.Second, c.Loop.IsLeader)
	etcd.Stop()
	code, body := 0, ""
	for deadline := time.Now().Add(20 * time.Second); code != http.StatusServiceUnavailable && time.Now().Before(deadline); {
		code, body = httpGet(t, "http://"+c.HTTPAddr+"/healthz")
	}
	probe(fmt.Sprintf("coordinator /healthz with etcd down: %d %q", code, body), code != http.StatusServiceUnavailable || body != "etcd unreachable\n")
	if !strings.Contains(logs.String(), "/healthz: etcd unreachable") {
		t.Errorf("the /healthz error is not in the coordinator's log:\n%s", logs.String())
	}
	reportAttack(t, "metrics, health and reflection open by default; error text on /healthz", o, 0)
}

// onLoopback reports whether a listener's bound address accepts loopback
// connections only.
func onLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	ip := net.ParseIP(host)
	return err == nil && ip != nil && ip.IsLoopback()
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// TestRollingUpdateAttack (issue 14 item 13): a rollout stops every node
// in turn. Envoy keeps sending checks to a node until the endpoint leaves
// its cluster, and a check that fails (connection refused, Unavailable)
// is admitted by a filter without failure_mode_deny. Once the node is
// told to stop (ctx ends, as on SIGTERM) it must keep deciding, on new
// connections, through its drain: each check sent during the drain gets a
// real decision, 2×capacity of them on the Envoy API and as many on the
// own API, no more than capacity each admitted, no error.
func TestRollingUpdateAttack(t *testing.T) {
	const capacity, drain = 5, 3 * time.Second
	srv := redistest.Start(t)
	pol := writePolicies(t, "policies:\n  - {name: rollout, capacity: 5, rate: 5/hour, failure_mode: closed}\n")
	writeFile(t, filepath.Join(filepath.Dir(pol), "envoy.yaml"),
		[]byte("domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 5}\n"))
	// A generous store budget: on a loaded machine a Redis call past the
	// 5 ms default falls back to the in-process bucket (the Envoy rule's
	// default failure mode is local), which this row is not about.
	n := startNode(t, regional.DaemonConfig{Redis: srv.Addr, Policies: filepath.Dir(pol), Drain: drain, StoreTimeout: time.Second}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if code, _ := httpGet(t, "http://"+n.httpAddr+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz before the stop: %d", code)
	}

	stopped := make(chan error, 1)
	start := time.Now()
	go func() { stopped <- n.stop() }()
	// Not ready at once (or, without a drain, already gone).
	waitFor(t, "/readyz to turn 503", drain/2, func() bool {
		resp, err := http.Get("http://" + n.httpAddr + "/readyz")
		if err != nil {
			return true
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable
	})

	var envoy, own attackOutcome
	for range 2 * capacity {
		conn, err := grpc.NewClient(n.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		sendEnvoy(ctx, rlsv3.NewRateLimitServiceClient(conn), &envoy, &rlsv3.RateLimitRequest{Domain: "edge",
			Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "tenant", Value: "rolling"}}}}})
		own.sent++
		switch r, err := quotav1.NewAdmissionClient(conn).Check(ctx, &quotav1.CheckRequest{Subject: "rolling", Policies: []string{"rollout"}}); {
		case err != nil:
			own.failOpen++
		case r.Allowed:
			own.admitted++
		}
		conn.Close()
	}
	if d := time.Since(start); d >= drain {
		t.Fatalf("the checks took %v, the whole drain: the row proves nothing", d)
	}
	both := attackOutcome{sent: envoy.sent + own.sent, failOpen: envoy.failOpen + own.failOpen,
		admitted: max(envoy.admitted-capacity, 0) + max(own.admitted-capacity, 0)}
	reportAttack(t, "rolling update: checks during a node's drain", both, 0)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < drain {
		t.Errorf("the node stopped %v after being told to, before its drain of %v", d, drain)
	}
}

// TestEtcdCredentialAttack (issue 14 item 9): whoever holds a region's
// etcd credential, as written by a coordinator run with
// -embedded-etcd-auth, tries to rewrite what only the coordinator and
// the operators may: an allocation (its region's share), a policy, a
// control, the published settings, the audit log, the election, and
// another region's registration, demand and acknowledgement; an
// anonymous client tries an allocation. Each write is a request; each
// one etcd accepts lifts a limit.
func TestEtcdCredentialAttack(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	etcdAddr := l.Addr().String()
	l.Close()
	dataDir := t.TempDir()
	cfg := coordinator.Config{DataDir: dataDir, EmbeddedEtcdAddr: etcdAddr, EmbeddedAuthRegions: []string{"eu"},
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", TokenFile: filepath.Join(dataDir, "tokens"),
		Rebalance: rebalance.Config{Interval: time.Hour, SessionTTL: time.Second}, Logger: hclog.NewNullLogger()}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cctx, stop := context.WithCancel(ctx)
	c, err := coordinator.Start(cctx, cfg)
	if err != nil {
		stop()
		t.Fatal(err)
	}
	defer func() {
		stop()
		if err := c.Wait(); err != nil {
			t.Errorf("coordinator: %v", err)
		}
	}()
	pw, err := os.ReadFile(cfg.RegionPasswordFile("eu"))
	if err != nil {
		t.Fatal(err)
	}
	dial := func(user, password string) *clientv3.Client {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://" + etcdAddr}, DialTimeout: 5 * time.Second,
			Logger: zap.NewNop(), Username: user, Password: password})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cli.Close() })
		return cli
	}
	region, anon := dial(etcdauth.RegionUser("eu"), strings.TrimSpace(string(pw))), dial("", "")
	lay := etcdlayout.Layout{}
	// The credential works for what it is for.
	if _, err := region.Put(ctx, lay.Node("eu", "n1"), "{}"); err != nil {
		t.Fatalf("the region's credential cannot register its node: %v", err)
	}
	var o attackOutcome
	for _, w := range []struct {
		cli *clientv3.Client
		key string
	}{
		{region, lay.Alloc("capped")}, {region, lay.PolicyDoc("p.yaml")}, {region, lay.Control("capped")},
		{region, lay.Settings()}, {region, lay.Audit(time.Now(), 1)}, {region, lay.Election() + "/attacker"},
		{region, lay.Node("us", "n1")}, {region, lay.DemandShard("us", "n1", 0)}, {region, lay.AckShard("us", "n1", 0)},
		{anon, lay.Alloc("capped")},
	} {
		o.sent++
		if _, err := w.cli.Put(ctx, w.key, `{"epoch":99}`); err == nil {
			o.admitted++
			t.Errorf("wrote %s", w.key)
		}
	}
	reportAttack(t, "etcd: a region's credential rewrites allocations, policies, controls, other regions", o, 0)
}

// TestDemandInflationAttack (issue 14 item 6): denied cost counts as
// offered demand, and demand moves shares between regions. An attacker
// sends two requests of the largest hits_addend (one with a single
// descriptor, one with 64 descriptors of the same bucket) among 20
// honest requests of cost 1, through a node joined to etcd; the node's
// demand reports (every version written to etcd) may count the
// attacker's requests at most one capacity each. Each unit of offered
// demand beyond honest + 2×capacity is counted as a lifted limit (in
// units of the capacity, rounded up).
func TestDemandInflationAttack(t *testing.T) {
	const capacity, honest = 5, 20
	etcd := etcdtest.Start(t)
	pol := writePolicies(t, "policies:\n  - {name: plain, capacity: 5, rate: 5/hour, failure_mode: closed}\n")
	writeFile(t, filepath.Join(filepath.Dir(pol), "envoy.yaml"),
		[]byte("domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 5}\n"))
	cli := etcd.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	watch := cli.Watch(ctx, etcdlayout.Layout{}.NodeDemands("eu", "n1"), clientv3.WithPrefix(), clientv3.WithFilterDelete())
	n := startNode(t, regional.DaemonConfig{Region: "eu", NodeID: "n1", EtcdEndpoints: etcd.Endpoints, Policies: filepath.Dir(pol),
		SubjectSalt: "inflation-salt", ReportInterval: 300 * time.Millisecond}, nil)
	rls := rlsv3.NewRateLimitServiceClient(n.conn)
	tenant := func(v string, cost uint64) *rlcommon.RateLimitDescriptor {
		d := &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "tenant", Value: v}}}
		if cost > 0 {
			d.HitsAddend = wrapperspb.UInt64(cost)
		}
		return d
	}
	var o attackOutcome
	for i := range honest {
		if _, err := rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{tenant(fmt.Sprintf("t%d", i/2), 0)}}); err != nil {
			t.Fatalf("honest request: %v", err)
		}
	}
	many := make([]*rlcommon.RateLimitDescriptor, 64)
	for i := range many {
		many[i] = tenant("attacker", 1<<53)
	}
	sendEnvoy(ctx, rls, &o, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{tenant("attacker", 1<<53)}})
	sendEnvoy(ctx, rls, &o, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: many})

	// Sum the offered demand of every report written (a node writes the
	// demand shards that changed), until two report intervals pass
	// without a write after some demand was seen.
	var offered float64
	for quiet := false; !quiet; {
		select {
		case <-time.After(600 * time.Millisecond):
			quiet = offered > 0
		case wr := <-watch:
			for _, ev := range wr.Events {
				var rep etcdlayout.DemandReport
				if err := json.Unmarshal(ev.Kv.Value, &rep); err != nil {
					t.Fatalf("demand report: %v", err)
				}
				for _, pd := range rep.Policies {
					offered += pd.Offered * rep.IntervalSeconds
				}
			}
		case <-ctx.Done():
			t.Fatalf("demand reports: %v (offered so far %v)", ctx.Err(), offered)
		}
	}
	if offered < honest {
		t.Fatalf("offered demand %v from %d honest requests: the reports do not hold the requests", offered, honest)
	}
	bound := float64(honest + o.sent*capacity)
	// Reports carry rates (cost per second) and their interval, so the
	// sum is exact only to float rounding: an excess below a millionth of
	// a request is none.
	o.admitted = int(math.Ceil(math.Max(offered-bound-1e-6, 0) / capacity))
	reportAttack(t, fmt.Sprintf("denied hits_addend of 2^53 inflating demand (%.0f offered, at most %.0f)", offered, bound), o, 0)
}
