package reliability

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/quotacoord/quota/internal/redistest"
	"github.com/quotacoord/quota/internal/regional"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

// TestHostileIdentityFlood floods a node with new subjects and checks the
// caps hold, every excess check decided without failing open: a fail-open
// policy against a Redis with a small maxmemory (noeviction), which must
// fill, admits no subject beyond the node's live-subject bound and never
// by its failure mode; with Redis down, the local policy's in-process
// buckets stop at -local-max-buckets.
func TestHostileIdentityFlood(t *testing.T) {
	flood := pick(20000, 200000)
	const (
		localCap = 200
		maxLive  = 5000
		capacity = 5
	)
	srv := redistest.Start(t, "--maxmemory-policy", "noeviction")
	rc := srv.Client(t)
	// Room for a few thousand buckets above what Redis holds at rest.
	headroom := int64(512 << 10)
	maxmemory := redistest.Info(t, rc, "memory", "used_memory") + headroom
	if err := rc.ConfigSet(context.Background(), "maxmemory", fmt.Sprint(maxmemory)).Err(); err != nil {
		t.Fatal(err)
	}
	n := startNode(t, regional.DaemonConfig{Redis: srv.Addr, Policies: writePolicies(t, `policies:
  - {name: fl-open, capacity: 5, rate: 5/second, failure_mode: open}
  - {name: fl-local, capacity: 5, rate: 5/second, failure_mode: local}
`), StoreTimeout: 2 * time.Second, BreakerCooldown: 100 * time.Millisecond, LocalMaxBuckets: localCap,
		MaxLiveSubjects: maxLive}, nil)
	ctx := context.Background()
	kinds := counter{}
	var lost int64
	var firstErr error
	send := func(pol string, i int) {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		r, err := n.adm.Check(cctx, &quotav1.CheckRequest{Subject: fmt.Sprintf("attacker-%s-%d", pol, i), Policies: []string{pol}, Cost: 1})
		if err != nil {
			lost++
			if firstErr == nil {
				firstErr = err
			}
			return
		}
		k := "normal"
		if r.Degraded != "" {
			k = r.Degraded
		}
		if r.Allowed {
			k += "-admit"
		} else {
			k += "-deny"
		}
		kinds.add(pol+":"+k, 1)
	}
	// 1. Against live Redis: buckets grow until maxmemory; then Redis
	// refuses to grow, which denies, and never opens the breaker.
	for i := 0; i < flood; i++ {
		send("fl-open", i)
	}
	used := redistest.Info(t, rc, "memory", "used_memory")
	keys := redistest.DBSize(t, rc)
	opens := n.metricSum(t, "quota_regional_breaker_opens_total")
	// 2. Redis down: the local policy creates in-process buckets up to
	// -local-max-buckets; the excess must still be decided.
	srv.Stop()
	for i := 0; i < 2*localCap; i++ {
		send("fl-local", i)
	}
	got := kinds.snapshot()
	ok := lost == 0
	if lost > 0 {
		t.Errorf("%d of the flood's checks got no decision; first: %v", lost, firstErr)
	}
	if got["fl-open:closed-deny"] == 0 {
		ok = false
		t.Errorf("Redis never refused a write (%d keys, %d bytes, maxmemory %d): the flood did not fill it", keys, used, maxmemory)
	}
	if opens > 0 {
		ok = false
		t.Errorf("the flood opened the breaker %v times", opens)
	}
	failOpen := got["fl-open:open-admit"]
	if failOpen > 0 {
		t.Errorf("%d flood checks admitted by the fail-open mode", failOpen)
	}
	admitted := got["fl-open:normal-admit"] + failOpen
	lifted := max(admitted-(maxLive+capacity), 0)
	if lifted > 0 {
		t.Errorf("the fail-open policy admitted %d new subjects, bound %d", admitted, maxLive+capacity)
	}
	if got["fl-local:local-admit"] > localCap {
		ok = false
		t.Errorf("local buckets admitted %d new subjects, cap %d", got["fl-local:local-admit"], localCap)
	}
	record(t, Entry{Kind: KindSecurity, Name: fmt.Sprintf("identity flood: %d new subjects of a fail-open policy, Redis maxmemory +512kb noeviction", flood),
		Injected: got["fl-open:closed-deny"] > 0, Survived: ok && !t.Failed(), Lost: lost, Decisions: got,
		Requests: int64(flood + 2*localCap), LimitsLifted: lifted, FailOpen: failOpen,
		Note: fmt.Sprintf("redis %d keys, %d bytes; local cap %d", keys, used, localCap)})
}

// TestFloodCannotOpenTheBreaker: on a node without Redis (the in-process
// store is the primary store), a flood of new subjects that fills
// -local-max-buckets must not count as a store outage: otherwise the
// breaker opens and a fail-open policy admits a subject it had denied.
func TestFloodCannotOpenTheBreaker(t *testing.T) {
	const localCap = 100
	n := startNode(t, regional.DaemonConfig{Policies: writePolicies(t, "policies:\n  - {name: sa-open, capacity: 2, rate: 2/hour, failure_mode: open}\n"),
		LocalMaxBuckets: localCap, BreakerCooldown: 10 * time.Second}, nil)
	ctx := context.Background()
	checkCost := func(subject string, cost int64) (*quotav1.CheckResponse, error) {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return n.adm.Check(cctx, &quotav1.CheckRequest{Subject: subject, Policies: []string{"sa-open"}, Cost: cost})
	}
	check := func(subject string) (*quotav1.CheckResponse, error) { return checkCost(subject, 1) }
	// The victim empties its bucket in one admitted check (so no denial
	// sits in the negative cache): its next check must be denied.
	if r, err := checkCost("victim", 2); err != nil || !r.Allowed {
		t.Fatalf("victim before the flood: %v, %v", r, err)
	}
	var lost int64
	for i := 0; i < 2*localCap; i++ {
		if _, err := check(fmt.Sprintf("flood-%d", i)); err != nil {
			lost++
		}
	}
	r, err := check("victim")
	ok := err == nil && !r.Allowed && lost == 0
	if err != nil {
		t.Errorf("victim after the flood: %v", err)
	} else if r.Allowed {
		t.Errorf("the flood opened the breaker: the denied victim is admitted (degraded %q)", r.Degraded)
	}
	if lost > 0 {
		t.Errorf("%d flood checks got no decision", lost)
	}
	if opens, open := n.metricSum(t, "quota_regional_breaker_opens_total"), n.metricSum(t, "quota_regional_breaker_open"); opens > 0 || open > 0 {
		ok = false
		t.Errorf("the breaker opened %v times (open now: %v) because the in-process store was full", opens, open)
	}
	failOpen := int64(0)
	if err == nil && r.Allowed {
		failOpen = 1
	}
	record(t, Entry{Kind: KindSecurity, Name: "identity flood cannot open the breaker (standalone node)", Injected: true,
		Survived: ok && !t.Failed(), Lost: lost, Requests: int64(2*localCap + 2), LimitsLifted: failOpen, FailOpen: failOpen})
}
