package reliability

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/quotacoord/quota/internal/redistest"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

// TestHostileIdentityFlood floods a node with new subjects and checks the
// configured caps hold, with every excess check decided by the policy's
// failure mode: Redis capped by maxmemory (noeviction), the in-process
// local buckets by -local-max-buckets while Redis is down.
func TestHostileIdentityFlood(t *testing.T) {
	flood := pick(3000, 50000)
	const localCap = 200
	srv := redistest.Start(t, "--maxmemory", "1400kb", "--maxmemory-policy", "noeviction")
	rc := srv.Client(t)
	n := startNode(t, []string{"-redis", srv.Addr, "-policies", writePolicies(t, `policies:
  - {name: fl-closed, capacity: 5, rate: 5/second, failure_mode: closed}
  - {name: fl-local, capacity: 5, rate: 5/second, failure_mode: local}
`), "-store-timeout", "250ms", "-breaker-cooldown", "100ms", "-local-max-buckets", fmt.Sprint(localCap)}, nil)
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
	// 1. Against live Redis: keys grow until maxmemory, then the policy's
	// failure mode decides; Redis never holds more than its cap.
	for i := 0; i < flood; i++ {
		send("fl-closed", i)
	}
	used := redistest.Info(t, rc, "memory", "used_memory")
	keys := redistest.DBSize(t, rc)
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
	if used > 1600<<10 {
		ok = false
		t.Errorf("redis used_memory %d over its 1400kb cap", used)
	}
	if got["fl-closed:closed-deny"] == 0 && flood >= 3000 {
		t.Logf("note: Redis did not fill (%d keys, %d bytes)", keys, used)
	}
	if got["fl-local:local-admit"] > localCap {
		ok = false
		t.Errorf("local buckets admitted %d new subjects, cap %d", got["fl-local:local-admit"], localCap)
	}
	record(t, Entry{Kind: KindLoad, Name: "hostile identity flood (Redis maxmemory 1400kb, local cap 200)", Injected: true,
		Survived: ok && !t.Failed(), Lost: lost, Decisions: got,
		Note: fmt.Sprintf("%d new subjects; redis %d keys, %d bytes", flood+2*localCap, keys, used)})
}

// TestFloodCannotOpenTheBreaker: on a node without Redis (the in-process
// store is the primary store), a flood of new subjects that fills
// -local-max-buckets must not count as a store outage: otherwise the
// breaker opens and a fail-open policy admits a subject it had denied.
func TestFloodCannotOpenTheBreaker(t *testing.T) {
	const localCap = 100
	n := startNode(t, []string{"-policies", writePolicies(t, "policies:\n  - {name: sa-open, capacity: 2, rate: 2/hour, failure_mode: open}\n"),
		"-local-max-buckets", fmt.Sprint(localCap), "-breaker-cooldown", "10s"}, nil)
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
	if m := n.metrics(t); strings.Contains(m, "quota_regional_breaker_opens_total 1") || strings.Contains(m, "quota_regional_breaker_open 1") {
		ok = false
		t.Errorf("the breaker opened because the in-process store was full")
	}
	record(t, Entry{Kind: KindSecurity, Name: "identity flood cannot open the breaker (standalone node)", Injected: true,
		Survived: ok && !t.Failed(), Lost: lost})
}
