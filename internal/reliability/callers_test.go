package reliability

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/redistest"
	"github.com/quotacoord/quota/internal/regional"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

// TestCallerAttacks tries, against a node run through regional.Main on
// Redis with its defaults (no -grants, no -subject-salt), the attacks of
// a caller that reaches the node's port (issue 14 items 2, 5 and 8):
// refunds, limit overrides and peeks it was not granted, a CheckBatch far
// over the work bound, and reversing a hashed IPv4 subject by hashing
// guesses with the empty salt. Each is a row of the security table: no
// admission beyond the capacity, no error that a failing-open caller
// would turn into admission.
func TestCallerAttacks(t *testing.T) {
	srv := redistest.Start(t)
	const capacity = 5
	pol := writePolicies(t, `policies:
  - {name: capped, capacity: 5, rate: 5/hour, failure_mode: closed}
  - {name: per-ip, subject: ip, capacity: 5, rate: 5/hour, failure_mode: closed}
  - {name: wide, capacity: 5, rate: 5/hour, failure_mode: closed}
`)
	writeFile(t, filepath.Join(filepath.Dir(pol), "envoy.yaml"),
		[]byte("domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 5}\n"))
	n := startNode(t, regional.DaemonConfig{Redis: srv.Addr, Policies: filepath.Dir(pol)}, nil)
	rls := rlsv3.NewRateLimitServiceClient(n.conn)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	edge := func(d *rlcommon.RateLimitDescriptor) *rlsv3.RateLimitRequest {
		return &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{d}}
	}
	tenant := func(v string) *rlcommon.RateLimitDescriptor {
		return &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "tenant", Value: v}}}
	}

	// 2. A refund after every hit, without the refund grant: the hits
	// count, the refunds' answers only for errors.
	var refund, refunds attackOutcome
	for range 4 * capacity {
		sendEnvoy(ctx, rls, &refund, edge(tenant("refunder")))
		d := tenant("refunder")
		d.IsNegativeHits = true
		sendEnvoy(ctx, rls, &refunds, edge(d))
	}
	refund.sent, refund.failOpen = refund.sent+refunds.sent, refund.failOpen+refunds.failOpen
	reportAttack(t, "Envoy refunds (is_negative_hits) without the refund grant", refund, capacity)

	// 2. A limit override of the caller's own, without the override grant.
	var override attackOutcome
	for range 4 * capacity {
		d := tenant("overrider")
		d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1 << 20, Unit: typev3.RateLimitUnit_HOUR}
		sendEnvoy(ctx, rls, &override, edge(d))
	}
	reportAttack(t, "Envoy limit override without the override grant", override, capacity)

	// 2. Peeks at another subject's budget, without the peek grant: a
	// peek answered counts as a lifted limit (limit 0); PermissionDenied
	// is the refusal, not a fail-open error.
	var peek attackOutcome
	for range capacity {
		peek.sent++
		_, err := n.adm.Check(ctx, &quotav1.CheckRequest{Subject: "victim", Policies: []string{"capped"}, Peek: true})
		switch status.Code(err) {
		case codes.OK:
			peek.admitted++
		case codes.PermissionDenied:
		default:
			peek.failOpen++
		}
	}
	reportAttack(t, "peek at another subject's budget without the peek grant", peek, 0)

	// 5. A CheckBatch of 256 checks of 3 policies each: refused whole
	// (InvalidArgument) before any Redis call; any check it admits lifts.
	var batch attackOutcome
	req := &quotav1.CheckBatchRequest{}
	for i := range 256 {
		req.Checks = append(req.Checks, &quotav1.CheckRequest{Subject: fmt.Sprintf("b%d", i), Policies: []string{"capped", "per-ip", "wide"}, HashSubject: true})
	}
	batch.sent += len(req.Checks)
	switch r, err := n.adm.CheckBatch(ctx, req); {
	case err == nil:
		for _, c := range r.Responses {
			if c.Allowed {
				batch.admitted++
			}
		}
	case status.Code(err) != codes.InvalidArgument:
		batch.failOpen++
	}
	reportAttack(t, "CheckBatch over the bucket operation bound", batch, 0)

	// 8. Hashed IPv4 subjects with no -subject-salt: an attacker who sees
	// the Redis keys hashes guesses with the empty salt; a key matching a
	// guess reverses the address (counted as lifted, limit 0).
	ips := []string{"203.0.113.9", "198.51.100.4", "192.0.2.200"}
	var reversed attackOutcome
	for _, ip := range ips {
		reversed.sent++
		if _, err := n.adm.Check(ctx, &quotav1.CheckRequest{Subject: ip, Policies: []string{"per-ip"}}); err != nil {
			reversed.failOpen++
		}
	}
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rc.Close()
	stored := scanRedis(t, ctx, rc)
	if stored.keys == 0 {
		t.Fatal("no bucket in Redis: the reversal check proves nothing")
	}
	for _, ip := range ips {
		if strings.Contains(stored.text, bucket.HashSubject("", ip)) {
			reversed.admitted++
		}
	}
	reportAttack(t, "hashed IPv4 subject reversed with the empty salt", reversed, 0)
}

// attackOutcome counts an attack's requests: sent, admitted, and answered
// with an error (which Envoy without failure_mode_deny, or a caller
// failing open, turns into admission).
type attackOutcome struct{ sent, admitted, failOpen int }

// reportAttack records an attack as a row of the security table and
// fails the test when it admitted more than limit or caused an error.
func reportAttack(t *testing.T, name string, o attackOutcome, limit int) {
	t.Helper()
	lifted := max(o.admitted-limit, 0)
	record(t, Entry{Kind: KindSecurity, Name: "attack: " + name, Injected: o.sent > 0,
		Survived: o.sent > 0 && lifted == 0 && o.failOpen == 0,
		Requests: int64(o.sent), LimitsLifted: int64(lifted), FailOpen: int64(o.failOpen)})
	if lifted > 0 || o.failOpen > 0 {
		t.Errorf("%s: %d requests, %d admitted beyond the limit of %d, %d answered with an error", name, o.sent, lifted, limit, o.failOpen)
	}
}

// sendEnvoy sends req as an attack request of o: counted as sent, and as
// admitted (OK) or failed open (an error).
func sendEnvoy(ctx context.Context, rls rlsv3.RateLimitServiceClient, o *attackOutcome, req *rlsv3.RateLimitRequest) {
	o.sent++
	resp, err := rls.ShouldRateLimit(ctx, req)
	switch {
	case err != nil:
		o.failOpen++
	case resp.OverallCode == rlsv3.RateLimitResponse_OK:
		o.admitted++
	}
}
