package reliability

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/hashicorp/go-hclog"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/quotacoord/quota/client"
	"github.com/quotacoord/quota/httplimit"
	"github.com/quotacoord/quota/internal/coordinator"
	"github.com/quotacoord/quota/internal/etcdtest"
	"github.com/quotacoord/quota/internal/logbuf"
	"github.com/quotacoord/quota/internal/redistest"
	"github.com/quotacoord/quota/internal/regional"
	"github.com/quotacoord/quota/internal/testca"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
	"github.com/quotacoord/quota/rebalance"
)

const simplePolicy = "policies:\n  - {name: plain, capacity: 100, rate: 100/second, failure_mode: closed}\n"

func tlsDial(tc *tls.Config) func(string) (*grpc.ClientConn, error) {
	return func(addr string) (*grpc.ClientConn, error) {
		return grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	}
}

func checkOnce(conn *grpc.ClientConn) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_, err := quotav1.NewAdmissionClient(conn).Check(ctx, &quotav1.CheckRequest{Subject: "s1", Policies: []string{"plain"}, Cost: 1})
	return err
}

// TestRegionalTLS: the regional gRPC listener with TLS, and with mutual
// TLS, accepts exactly the clients it should.
func TestRegionalTLS(t *testing.T) {
	dir := t.TempDir()
	good, other := testca.New(t, "quota-test-ca"), testca.New(t, "intruder-ca")
	scert, skey, _ := good.IssueFiles(t, dir, "server")
	caFile := good.WriteFile(t, dir)
	ccert, ckey, _ := good.Issue(t, "client")
	bcert, bkey, _ := other.Issue(t, "client")
	pol := writePolicies(t, simplePolicy)
	type client struct {
		name string
		dial func(string) (*grpc.ClientConn, error)
		ok   bool
		// probe and refusal, when set: a TLS connection made with probe
		// must be refused for refusal (so a wrong-CA row cannot pass as
		// "no certificate").
		probe   *tls.Config
		refusal string
	}
	plaintext := func(addr string) (*grpc.ClientConn, error) {
		return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
	for _, tc := range []struct {
		name    string
		node    regional.DaemonConfig
		clients []client
	}{
		{"tls", regional.DaemonConfig{TLSCert: scert, TLSKey: skey}, []client{
			{"trusting client", tlsDial(clientTLS(t, good, nil, nil)), true, nil, ""},
			{"plaintext client", plaintext, false, nil, ""},
			{"client not trusting the server's CA", tlsDial(clientTLS(t, other, nil, nil)), false, clientTLS(t, other, nil, nil), "certificate signed by unknown authority"},
		}},
		{"mtls", regional.DaemonConfig{TLSCert: scert, TLSKey: skey, TLSClientCA: caFile}, []client{
			{"client certificate from the CA", tlsDial(clientTLS(t, good, ccert, ckey)), true, nil, ""},
			{"no client certificate", tlsDial(clientTLS(t, good, nil, nil)), false, clientTLS(t, good, nil, nil), "certificate required"},
			{"client certificate from another CA", tlsDial(clientTLS(t, good, bcert, bkey)), false, clientTLS(t, good, bcert, bkey), "unknown certificate authority"},
			{"plaintext client", plaintext, false, nil, ""},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.node.Policies = pol
			n := startNode(t, tc.node, tlsDial(clientTLS(t, good, ccert, ckey)))
			for _, c := range tc.clients {
				conn, err := c.dial(n.grpcAddr)
				if err != nil {
					t.Fatal(err)
				}
				err = checkOnce(conn)
				conn.Close()
				ok := err == nil
				if ok != c.ok {
					t.Errorf("%s: check error %v, want success %v", c.name, err, c.ok)
				}
				refusedFor := true
				if c.probe != nil {
					perr := tlsRefusal(n.grpcAddr, c.probe)
					refusedFor = perr != nil && strings.Contains(perr.Error(), c.refusal)
					if !refusedFor {
						t.Errorf("%s: TLS connection ended with %v, want a refusal for %q", c.name, perr, c.refusal)
					}
				}
				record(t, Entry{Kind: KindSecurity, Name: "regional " + tc.name + ": " + c.name, Injected: true,
					Survived: ok == c.ok && refusedFor, Requests: 1, LimitsLifted: lifted(ok, c.ok), Note: fmt.Sprintf("accepted=%v want=%v", ok, c.ok)})
			}
		})
	}
}

// lifted is 1 when a caller that must be refused was accepted: a
// credential check that let an attacker through.
func lifted(accepted, want bool) int64 {
	if accepted && !want {
		return 1
	}
	return 0
}

// startCoordinator runs a coordinator on an embedded etcd with a token
// file holding one read and one write token; extra configures TLS.
func startCoordinator(t *testing.T, extra func(*coordinator.Config)) (*coordinator.Coordinator, *logbuf.Buffer, string, string) {
	t.Helper()
	srv := etcdtest.Start(t)
	logs := &logbuf.Buffer{Max: 8 << 20}
	readTok, writeTok := "read-token-0123456789abcdef", "write-token-0123456789abcdef"
	tf := writeFile(t, filepath.Join(t.TempDir(), "tokens"), []byte("read:"+readTok+"\nwrite:"+writeTok+"\n"))
	cfg := coordinator.Config{EtcdEndpoints: srv.Endpoints, GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		TokenFile: tf, Rebalance: rebalance.Config{Interval: time.Hour, SessionTTL: time.Second},
		Logger: hclog.New(&hclog.LoggerOptions{Name: "coordinator", Output: logs, JSONFormat: true})}
	if extra != nil {
		extra(&cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c, err := coordinator.Start(ctx, cfg)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		if err := c.Wait(); err != nil {
			t.Errorf("coordinator: %v", err)
		}
	})
	return c, logs, readTok, writeTok
}

func withToken(tok string) context.Context {
	ctx := context.Background()
	if tok != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
	}
	return ctx
}

// operatorCalls are one read and one write.
func operatorCall(op quotav1.OperatorClient, ctx context.Context, write bool) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if write {
		_, err := op.ApplyPolicy(ctx, &quotav1.ApplyPolicyRequest{Filename: "plain.yaml", Document: []byte(simplePolicy)})
		return err
	}
	_, err := op.ListPolicies(ctx, &quotav1.ListPoliciesRequest{})
	return err
}

// TestOperatorAuth: unauthenticated operator calls are refused and
// logged; a read credential reads but cannot write; a write credential
// does both; by token and by client certificate.
func TestOperatorAuth(t *testing.T) {
	dir := t.TempDir()
	good, other := testca.New(t, "ops-ca"), testca.New(t, "intruder-ca")
	scert, skey, _ := good.IssueFiles(t, dir, "coord")
	caFile := good.WriteFile(t, dir)
	c, logs, readTok, writeTok := startCoordinator(t, func(cfg *coordinator.Config) {
		cfg.TLSCert, cfg.TLSKey, cfg.ClientCA, cfg.WriteNames = scert, skey, caFile, []string{"ops-admin"}
	})
	adminCert, adminKey, _ := good.Issue(t, "ops-admin")
	viewCert, viewKey, _ := good.Issue(t, "ops-viewer")
	evilCert, evilKey, _ := other.Issue(t, "ops-admin")
	conn := func(tc *tls.Config) quotav1.OperatorClient {
		cc, err := grpc.NewClient(c.GRPCAddr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return quotav1.NewOperatorClient(cc)
	}
	anon := conn(clientTLS(t, good, nil, nil))
	for _, tc := range []struct {
		name        string
		op          quotav1.OperatorClient
		token       string
		read, write codes.Code
		logged      string
		// probe and refusal: see TestRegionalTLS.
		probe   *tls.Config
		refusal string
	}{
		{"no credential", anon, "", codes.Unauthenticated, codes.Unauthenticated, "refused unauthenticated operator call", nil, ""},
		{"unknown token", anon, "not-a-token-0123456789", codes.Unauthenticated, codes.Unauthenticated, "refused unauthenticated operator call", nil, ""},
		{"read token", anon, readTok, codes.OK, codes.PermissionDenied, "refused operator write with a read credential", nil, ""},
		{"write token", anon, writeTok, codes.OK, codes.OK, "", nil, ""},
		{"certificate with a write name", conn(clientTLS(t, good, adminCert, adminKey)), "", codes.OK, codes.OK, "", nil, ""},
		{"certificate without a write name", conn(clientTLS(t, good, viewCert, viewKey)), "", codes.OK, codes.PermissionDenied, "refused operator write with a read credential", nil, ""},
		// The handshake itself fails: the certificate is presented and refused.
		{"certificate from another CA", conn(clientTLS(t, good, evilCert, evilKey)), "", codes.Unavailable, codes.Unavailable, "",
			clientTLS(t, good, evilCert, evilKey), "unknown certificate authority"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(logs.String())
			ok := true
			for _, w := range []bool{false, true} {
				want := tc.read
				if w {
					want = tc.write
				}
				err := operatorCall(tc.op, withToken(tc.token), w)
				if got := status.Code(err); got != want {
					ok = false
					t.Errorf("write=%v: code %v, want %v", w, got, want)
				}

			}
			if tc.probe != nil {
				if err := tlsRefusal(c.GRPCAddr, tc.probe); err == nil || !strings.Contains(err.Error(), tc.refusal) {
					ok = false
					t.Errorf("TLS connection ended with %v, want a refusal for %q", err, tc.refusal)
				}
			}
			if tc.logged != "" {
				if !strings.Contains(logs.String()[before:], tc.logged) {
					ok = false
					t.Errorf("refusal not logged (%q)", tc.logged)
				}
			}
			record(t, Entry{Kind: KindSecurity, Name: "operator API: " + tc.name, Injected: true, Survived: ok,
				Requests: 2, LimitsLifted: lifted(!ok, false), Note: fmt.Sprintf("read=%v write=%v", tc.read, tc.write)})
		})
	}
	// The audit log names the actor by a token fingerprint, never the token.
	if strings.Contains(logs.String(), writeTok) || strings.Contains(logs.String(), readTok) {
		t.Errorf("a raw operator token appears in the coordinator's logs")
	}
}

// TestCertificateReload: a certificate replaced on disk is served to new
// connections without a restart, by the regional gRPC listener and by the
// coordinator's operator listener (both through internal/tlsconfig, which
// looks at the files at most every CheckEvery). A listener that keeps its
// first certificate fails the test.
func TestCertificateReload(t *testing.T) {
	good := testca.New(t, "reload-ca")
	for _, which := range []string{"regional", "coordinator"} {
		t.Run(which, func(t *testing.T) {
			dir := t.TempDir()
			scert, skey, _ := good.IssueFiles(t, dir, "server")
			var addr string
			switch which {
			case "regional":
				addr = startNode(t, regional.DaemonConfig{Policies: writePolicies(t, simplePolicy), TLSCert: scert, TLSKey: skey},
					tlsDial(clientTLS(t, good, nil, nil))).grpcAddr
			default:
				c, _, _, _ := startCoordinator(t, func(cfg *coordinator.Config) { cfg.TLSCert, cfg.TLSKey = scert, skey })
				addr = c.GRPCAddr
			}
			tc := clientTLS(t, good, nil, nil)
			first, err := servedSerial(t, addr, tc)
			if err != nil {
				t.Fatal(err)
			}
			good.IssueFiles(t, dir, "server")
			written := time.Now()
			reloaded := false
			// tlsconfig looks at the files at most every 500 ms by default:
			// five seconds leave room for a loaded machine.
			deadline := written.Add(5 * time.Second)
			for !reloaded && time.Now().Before(deadline) {
				time.Sleep(100 * time.Millisecond)
				s, err := servedSerial(t, addr, tc)
				if err != nil {
					t.Fatal(err)
				}
				reloaded = s.Cmp(first) != 0
			}
			note := fmt.Sprintf("new certificate served %v after it was written, without a restart", time.Since(written).Round(10*time.Millisecond))
			if !reloaded {
				note = fmt.Sprintf("the listener still serves its first certificate %v after a new one was written", time.Since(written).Round(10*time.Millisecond))
				t.Errorf("%s: %s", which, note)
			}
			record(t, Entry{Kind: KindSecurity, Name: which + " TLS certificate reload", Injected: true, Survived: reloaded, Note: note})
		})
	}
}

// TestNoSecretsInKeysLogsMetrics drives API keys, client IPs and raw
// identities through both APIs of a node on Redis (also while Redis is
// down), then scans every Redis key (SCAN), the node's logs at debug level
// with every decision logged, and /metrics for any of them. In Redis it
// reads every key name and everything stored inside the keys (hash fields
// and values, members, items), and proves the scan sees subjects with a
// plain canary subject that must be found.
func TestNoSecretsInKeysLogsMetrics(t *testing.T) {
	srv := redistest.Start(t)
	pol := writePolicies(t, `policies:
  - {name: per-key, subject: api_key, capacity: 5, rate: 5/second, failure_mode: closed}
  - {name: per-ip, subject: ip, capacity: 5, rate: 5/second, failure_mode: open}
  - {name: per-user, capacity: 5, rate: 5/second, failure_mode: local}
`)
	envoy := filepath.Join(filepath.Dir(pol), "envoy.yaml")
	writeFile(t, envoy, []byte("domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 5}\n  - key: api_key\n    rate_limit: {unit: second, requests_per_unit: 5}\n"))
	n := startNode(t, regional.DaemonConfig{Redis: srv.Addr, Policies: filepath.Dir(pol),
		DecisionLogEvery: 1, StoreTimeout: 250 * time.Millisecond, BreakerCooldown: 100 * time.Millisecond, SubjectSalt: "s3cret-salt"}, nil)
	rls := rlsv3.NewRateLimitServiceClient(n.conn)
	const canary = "canary-tenant-7"
	secrets := []string{"sk_live_4eC39HqLyjWDarjtT1zdp7dc", "203.0.113.77", "alice@example.com", "198.51.100.23", "AKIAIOSFODNN7EXAMPLE", "s3cret-salt"}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	drive := func() {
		for i := 0; i < 8; i++ {
			for _, c := range []*quotav1.CheckRequest{
				{Subject: secrets[0], Policies: []string{"per-key"}, Cost: 1},
				{Subject: secrets[4], Policies: []string{"per-key"}, Cost: 1},
				{Subject: secrets[1], Policies: []string{"per-ip"}, Cost: 1},
				{Subject: secrets[2], HashSubject: true, Policies: []string{"per-user"}, Cost: 1},
				{Subject: secrets[2], Policies: []string{"per-user"}, Cost: 1}, // rejected: not a valid subject
				{Subject: canary, Policies: []string{"per-user"}, Cost: 1},     // a plain subject, stored as it is
			} {
				_, _ = n.adm.Check(ctx, c)
			}
			_, _ = rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{
				{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "remote_address", Value: secrets[3]}}},
				{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "api_key", Value: secrets[4]}}},
			}})
		}
	}
	drive()
	srv.Stop() // degraded decisions log errors too
	drive()
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	drive()

	// Every key name, and every field and value inside it: token buckets
	// are hash fields (the subject) in group keys, so key names alone
	// would not show a raw subject.
	stored := scanRedis(t, ctx, srv.Client(t))
	if stored.keys == 0 || stored.fields == 0 {
		t.Fatalf("%d Redis keys, %d hash fields after the run: the scan proves nothing", stored.keys, stored.fields)
	}
	// The canary is a valid plain subject: it is stored as it is, so the
	// scan must find it, or it would not find a raw secret either.
	if !strings.Contains(stored.text, canary) {
		t.Fatalf("the plain subject %q is not among the %d keys and %d fields scanned: the scan proves nothing", canary, stored.keys, stored.fields)
	}
	logs, metrics := n.out.String(), n.metrics(t)
	if !strings.Contains(logs, `"decision"`) && !strings.Contains(logs, "decision") {
		t.Fatal("no decision logged: the log scan proves nothing")
	}
	found := 0
	for _, s := range secrets {
		for what, text := range map[string]string{"redis keys, fields and values": stored.text, "logs": logs, "metrics": metrics} {
			if strings.Contains(strings.ToLower(text), strings.ToLower(s)) {
				found++
				t.Errorf("%q appears in %s", s, what)
			}
		}
	}
	record(t, Entry{Kind: KindSecurity, Name: "no raw subject, API key or IP in Redis keys, logs, metrics", Injected: true,
		Survived: found == 0, Note: fmt.Sprintf("%d keys (%d hash fields, %d values), %d log bytes, %d metric bytes scanned",
			stored.keys, stored.fields, stored.values, len(logs), len(metrics))})
}

// redisContents is everything a Redis holds, as text to search: key
// names, hash fields, set and sorted-set members, list items and values.
type redisContents struct {
	text                 string
	keys, fields, values int
}

// maxScanned bounds the keys, and the elements per key, that scanRedis
// reads: far above what the test writes.
const maxScanned = 100000

// scanRedis reads every key of rc (SCAN) and everything inside it by
// type: HSCAN (fields and values), SSCAN, ZSCAN, LRANGE, GET. A key of
// another type fails the test rather than go unscanned.
func scanRedis(t *testing.T, ctx context.Context, rc *redis.Client) redisContents {
	t.Helper()
	var b strings.Builder
	var out redisContents
	add := func(s string) {
		b.WriteString(s)
		b.WriteByte('\n')
	}
	// scanAll pages through one SCAN-family cursor.
	scanAll := func(key string, page func(cursor uint64) ([]string, uint64, error)) {
		var cursor uint64
		for n := 0; n < maxScanned; {
			items, next, err := page(cursor)
			if err != nil {
				t.Fatalf("scan %q: %v", key, err)
			}
			for _, it := range items {
				add(it)
			}
			n += len(items)
			if cursor = next; cursor == 0 {
				return
			}
		}
		t.Fatalf("key %q holds over %d elements", key, maxScanned)
	}
	var keys []string
	scanAll("*", func(c uint64) ([]string, uint64, error) {
		ks, next, err := rc.Scan(ctx, c, "*", 1000).Result()
		keys = append(keys, ks...)
		return ks, next, err
	})
	for _, k := range keys {
		typ, err := rc.Type(ctx, k).Result()
		if err != nil {
			t.Fatalf("TYPE %q: %v", k, err)
		}
		switch typ {
		case "none": // expired since the SCAN
		case "hash":
			scanAll(k, func(c uint64) ([]string, uint64, error) {
				kv, next, err := rc.HScan(ctx, k, c, "*", 1000).Result()
				out.fields += len(kv) / 2
				out.values += len(kv) / 2
				return kv, next, err
			})
		case "set":
			scanAll(k, func(c uint64) ([]string, uint64, error) {
				ms, next, err := rc.SScan(ctx, k, c, "*", 1000).Result()
				out.values += len(ms)
				return ms, next, err
			})
		case "zset":
			scanAll(k, func(c uint64) ([]string, uint64, error) {
				ms, next, err := rc.ZScan(ctx, k, c, "*", 1000).Result()
				out.values += len(ms) / 2
				return ms, next, err
			})
		case "list":
			items, err := rc.LRange(ctx, k, 0, maxScanned).Result()
			if err != nil {
				t.Fatalf("LRANGE %q: %v", k, err)
			}
			for _, it := range items {
				add(it)
			}
			out.values += len(items)
		case "string":
			v, err := rc.Get(ctx, k).Result()
			if err != nil && !errors.Is(err, redis.Nil) {
				t.Fatalf("GET %q: %v", k, err)
			}
			add(v)
			out.values++
		default:
			t.Fatalf("key %q has type %s, which the scan does not read", k, typ)
		}
	}
	out.keys = len(keys)
	out.text = b.String() // key names first, then what they hold
	return out
}

// TestAdmissionAttacks tries, against a node run through regional.Run on
// Redis, the attacks of a client that can only send requests through the
// edge: each must lift no limit (admissions beyond the capacity) and cause
// no fail-open answer (an error, which Envoy with failure_mode_deny: false
// and a failing-open caller turn into admission). Each attack is a row of
// the security table.
func TestAdmissionAttacks(t *testing.T) {
	srv := redistest.Start(t)
	const capacity = 5
	pol := writePolicies(t, `policies:
  - {name: capped, capacity: 5, rate: 5/hour, failure_mode: closed}
  - {name: per-ip, subject: ip, capacity: 5, rate: 5/hour, failure_mode: closed}
`)
	writeFile(t, filepath.Join(filepath.Dir(pol), "envoy.yaml"),
		[]byte("domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 5}\n"))
	// Peek is granted to every caller so that the idempotency row below
	// can try a peek's key on a charge (without the grant a peek is
	// refused outright).
	grantsFile := filepath.Join(t.TempDir(), "grants.yaml")
	writeFile(t, grantsFile, []byte("default: [{actions: [check, peek], policies: ['*']}]\n"))
	// A 1 s store budget: these rows attack input handling, and under a
	// busy CPU a first script call past the 5 ms default is decided by the
	// failure mode instead (open for Envoy rules), which is another row's
	// subject (redis_faults_test.go).
	n := startNode(t, regional.DaemonConfig{Redis: srv.Addr, Policies: filepath.Dir(pol), SubjectSalt: "attack-salt", GrantsFile: grantsFile,
		StoreTimeout: time.Second}, nil)
	rls := rlsv3.NewRateLimitServiceClient(n.conn)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	type outcome = attackOutcome
	report := func(name string, o outcome, limit int) {
		t.Helper()
		reportAttack(t, name, o, limit)
	}
	envoy := func(o *outcome, req *rlsv3.RateLimitRequest) { sendEnvoy(ctx, rls, o, req) }
	entry := func(k, v string) []*rlcommon.RateLimitDescriptor_Entry {
		return []*rlcommon.RateLimitDescriptor_Entry{{Key: k, Value: v}}
	}

	// 1. A descriptor value over the length limit (a 1 KiB x-tenant-id).
	var long outcome
	value := strings.Repeat("t", 1025)
	for range 2 * capacity {
		envoy(&long, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: entry("tenant", value)}}})
	}
	report("Envoy descriptor value over the length limit", long, capacity)

	// 1. Input the node cannot decide, and a huge hits_addend: none may
	// be admitted at all.
	deep := &rlcommon.RateLimitDescriptor{}
	for range 17 {
		deep.Entries = append(deep.Entries, entry("tenant", "a")...)
	}
	many := make([]*rlcommon.RateLimitDescriptor, 65)
	for i := range many {
		many[i] = &rlcommon.RateLimitDescriptor{Entries: entry("tenant", "b")}
	}
	var bad outcome
	for range capacity {
		for _, req := range []*rlsv3.RateLimitRequest{
			{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{deep}},
			{Domain: "edge", Descriptors: many},
			{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: entry("", "c")}}},
			{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: entry("tenant", "d"), HitsAddend: wrapperspb.UInt64(1 << 60)}}},
			{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: entry("tenant", "e"),
				Limit: &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 0}}}},
		} {
			envoy(&bad, req)
		}
	}
	report("Envoy input that cannot be decided (entries, descriptors, key, hits_addend, override)", bad, 0)

	// 3. A client-supplied Forwarded header behind a proxy that appends
	// X-Forwarded-For only.
	cl, err := client.New(n.grpcAddr, client.WithDialOptions(grpc.WithTransportCredentials(insecure.NewCredentials())))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	subject, err := httplimit.ClientIP(httplimit.Proxies{Trusted: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, Header: "X-Forwarded-For"})
	if err != nil {
		t.Fatal(err)
	}
	lim, err := httplimit.New(httplimit.Config{Checker: cl, Policies: []httplimit.Policy{{Name: "per-ip"}}, Subject: subject})
	if err != nil {
		t.Fatal(err)
	}
	h := lim.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	var spoof outcome
	for i := range 2 * capacity {
		req := httptest.NewRequest("GET", "/", nil).WithContext(ctx)
		req.RemoteAddr = "10.0.0.2:40000"
		req.Header.Set("Forwarded", fmt.Sprintf("for=192.0.2.%d", i+1))
		req.Header.Set("X-Forwarded-For", "203.0.113.50")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		spoof.sent++
		switch {
		case rec.Code == http.StatusNoContent:
			spoof.admitted++
		case rec.Code != http.StatusTooManyRequests:
			spoof.failOpen++
		}
	}
	report("spoofed Forwarded header behind an X-Forwarded-For proxy", spoof, capacity)

	// 7. A peek with idempotency key K, then a charge with key K.
	var idem outcome
	for i := range 2 * capacity {
		key := fmt.Sprintf("k-%d", i)
		idem.sent += 2
		if _, err := n.adm.Check(ctx, &quotav1.CheckRequest{Subject: "attacker", Policies: []string{"capped"}, Peek: true, IdempotencyKey: key}); err != nil {
			idem.failOpen++
		}
		r, err := n.adm.Check(ctx, &quotav1.CheckRequest{Subject: "attacker", Policies: []string{"capped"}, IdempotencyKey: key})
		switch {
		case err == nil && r.Allowed:
			idem.admitted++
		case err != nil && status.Code(err) != codes.InvalidArgument:
			idem.failOpen++
		}
	}
	for range capacity { // honest charges still get the whole budget, and no more
		idem.sent++
		if r, err := n.adm.Check(ctx, &quotav1.CheckRequest{Subject: "attacker", Policies: []string{"capped"}}); err == nil && r.Allowed {
			idem.admitted++
		}
	}
	report("idempotency key of a peek replayed for a charge", idem, capacity)
}
