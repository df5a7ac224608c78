package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quotacoord/quota/client"
	"github.com/quotacoord/quota/internal/grants"
	"github.com/quotacoord/quota/internal/redistest"
	"github.com/quotacoord/quota/internal/regional"
)

// nodePolicies: an API key (3), a client address (2) and the whole API
// (100), each a token bucket that does not refill within a test.
const nodePolicies = `policies:
  - {name: per_key, capacity: 3, rate: 3/hour, failure_mode: closed}
  - {name: per_ip, capacity: 2, rate: 2/hour, failure_mode: closed}
  - {name: global, capacity: 100, rate: 100/hour, failure_mode: closed}
`

// startRegional serves a real regional node on the shared Redis with
// nodePolicies and the grants in grantsYAML, and returns its address.
func startRegional(t *testing.T, grantsYAML string) string {
	t.Helper()
	g, err := grants.Parse("grants", []byte(grantsYAML))
	if err != nil {
		t.Fatal(err)
	}
	return serveNode(t, regional.Config{Grants: g, StoreTimeout: 10 * time.Second}, nodePolicies).addr
}

func unique(t *testing.T, prefix string) string {
	return prefix + "_" + strings.ReplaceAll(redistest.Unique(t), "-", "_")
}

// TestCheckAllAndRefundAgainstNode: CheckAll charges an API key, an
// address and the whole API all or nothing on a real node and Redis (a
// denial by the address charges neither of the others), and Refund gives
// the key's budget back only to a caller granted refund.
func TestCheckAllAndRefundAgainstNode(t *testing.T) {
	addr := startRegional(t, "default: [{actions: [check, peek, refund], policies: ['*']}]")
	c := newClient(t, addr, client.WithTimeout(10*time.Second))
	ctx := context.Background()
	key, ip, all := unique(t, "key"), unique(t, "ip"), unique(t, "all")
	charges := []client.Charge{{Policy: "per_key", Subject: key}, {Policy: "per_ip", Subject: ip}, {Policy: "global", Subject: all, Cost: 5}}
	for i, want := range []bool{true, true, false} {
		before := time.Now()
		d, err := c.CheckAll(ctx, charges)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed != want || len(d.Policies) != 3 {
			t.Fatalf("check %d: %+v, want allowed %v with three policy decisions", i, d, want)
		}
		if d.DecidedAt.Before(before.Add(-time.Second)) || d.DecidedAt.After(time.Now().Add(time.Second)) {
			t.Errorf("check %d: decided at %v, not near %v", i, d.DecidedAt, before)
		}
		if !want && d.DecidedBy != "per_ip" {
			t.Errorf("check %d: decided by %q, want per_ip", i, d.DecidedBy)
		}
	}
	peek := func(policy, subject string) int64 {
		t.Helper()
		d, err := c.Check(ctx, client.Request{Subject: subject, Policies: []string{policy}, Peek: true})
		if err != nil {
			t.Fatal(err)
		}
		return d.Remaining
	}
	if k, g := peek("per_key", key), peek("global", all); k != 1 || g != 90 {
		t.Fatalf("after two admissions and a denial: key %d, global %d remaining; want 1 and 90", k, g)
	}
	rs, err := c.Refund(ctx, []client.Charge{{Policy: "per_key", Subject: key, Cost: 2}, {Policy: "global", Subject: all, Cost: 10}})
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 2 || !rs[0].Refunded || rs[0].Remaining != 3 || !rs[1].Refunded || rs[1].Remaining != 100 || rs[0].DecidedAt.IsZero() {
		t.Fatalf("refunds %+v, want key 3 and global 100", rs)
	}
	if _, err := c.CheckAll(ctx, nil); !errors.Is(err, client.ErrInvalidRequest) {
		t.Errorf("no charges: %v, want ErrInvalidRequest", err)
	}
	if _, err := c.CheckAll(ctx, []client.Charge{{Policy: "per_ip", Subject: ip, Cost: 3}}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("cost above capacity: %v, want InvalidArgument", err)
	}
}

// TestRefundRefusedWithoutGrant: with the default grants (check only) a
// client's Refund is PermissionDenied and gives nothing back.
func TestRefundRefusedWithoutGrant(t *testing.T) {
	addr := startRegional(t, "default: [{actions: [check], policies: ['*']}]")
	c := newClient(t, addr, client.WithTimeout(10*time.Second))
	ctx := context.Background()
	key := unique(t, "key")
	admitted := func() int {
		n := 0
		for range 5 {
			d, err := c.Allow(ctx, key, "per_key", 1)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				n++
			}
		}
		return n
	}
	if n := admitted(); n != 3 {
		t.Fatalf("admitted %d of 5, want the capacity 3", n)
	}
	if _, err := c.Refund(ctx, []client.Charge{{Policy: "per_key", Subject: key, Cost: 3}}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("refund without the grant: %v, want PermissionDenied", err)
	}
	if n := admitted(); n != 0 {
		t.Fatalf("after a refused refund %d admitted, want 0", n)
	}
}
