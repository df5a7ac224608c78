package client_test

import (
	"context"
	"fmt"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/client"
	"github.com/quotacoord/quota/client/clienttest"
)

func ExampleClient_Check() {
	// A stand-in node for the example; use a regional node's address.
	srv, err := clienttest.Serve(map[string]int64{"exports": 2}, nil)
	if err != nil {
		panic(err)
	}
	defer srv.Stop()

	c, err := client.New(srv.Addr, client.WithUnreachable(client.UnreachableClosed))
	if err != nil {
		panic(err)
	}
	defer c.Close()
	for i := 0; i < 3; i++ {
		d, err := c.Check(context.Background(), client.Request{Subject: "tenant-a", Policies: []string{"exports"}})
		if err != nil {
			panic(err)
		}
		fmt.Printf("allowed=%v remaining=%d/%d retry-after=%v\n", d.Allowed, d.Remaining, d.Limit, d.RetryAfter)
	}
	// Output:
	// allowed=true remaining=1/2 retry-after=0s
	// allowed=true remaining=0/2 retry-after=0s
	// allowed=false remaining=0/2 retry-after=1.5s
}

func ExampleWithEmergency() {
	// A stand-in node for the example: a region whose share of "exports"
	// (capacity 4) is 1.
	srv, err := clienttest.Serve(map[string]int64{"exports": 4}, nil)
	if err != nil {
		panic(err)
	}
	defer srv.Stop()

	// Two clients share the region: while the node is down, each keeps
	// half of the region's share in its own bucket. Checks the bucket
	// cannot decide fail closed.
	c, err := client.New(srv.Addr, client.WithUnreachable(client.UnreachableClosed),
		client.WithEmergency(client.Emergency{Clients: 2, Policies: []client.EmergencyPolicy{
			{Name: "exports", Limits: bucket.Limits{Capacity: 4, RefillPerSecond: 1}},
		}}))
	if err != nil {
		panic(err)
	}
	defer c.Close()
	check := func() {
		d, err := c.Allow(context.Background(), "tenant-a", "exports", 1)
		if err != nil {
			panic(err)
		}
		fmt.Printf("allowed=%v degraded=%q remaining=%d/%d\n", d.Allowed, d.Degraded, d.Remaining, d.Limit)
	}
	check() // the node decides, and tells the client the region's share
	srv.Stop()
	for i := 0; i < 3; i++ {
		check() // the emergency bucket decides: 4 × 1 / 2 = 2 tokens
	}
	// Output:
	// allowed=true degraded="" remaining=3/4
	// allowed=true degraded="client_local" remaining=1/2
	// allowed=true degraded="client_local" remaining=0/2
	// allowed=false degraded="client_local" remaining=0/2
}

func ExampleClient_CheckAll() {
	// A stand-in node for the example; use a regional node's address.
	srv, err := clienttest.Serve(map[string]int64{"per-key": 5, "per-ip": 1}, nil)
	if err != nil {
		panic(err)
	}
	defer srv.Stop()
	c, err := client.New(srv.Addr)
	if err != nil {
		panic(err)
	}
	defer c.Close()
	ctx := context.Background()

	// One request, charged to its API key and its client address, all or
	// nothing.
	charges := []client.Charge{
		{Policy: "per-key", Subject: "key-123", HashSubject: true},
		{Policy: "per-ip", Subject: "192.0.2.7", HashSubject: true},
	}
	for i := 0; i < 2; i++ {
		d, err := c.CheckAll(ctx, charges)
		if err != nil {
			panic(err)
		}
		fmt.Printf("allowed=%v decided-by=%s key-remaining=%d\n", d.Allowed, d.DecidedBy, d.Policies[0].Remaining)
	}
	// The work of the admitted request failed: give its charges back
	// (a regional node asks for the refund grant).
	rs, err := c.Refund(ctx, charges)
	if err != nil {
		panic(err)
	}
	fmt.Printf("refunded=%v key-remaining=%d ip-remaining=%d\n", rs[0].Refunded, rs[0].Remaining, rs[1].Remaining)
	// Output:
	// allowed=true decided-by=per-ip key-remaining=4
	// allowed=false decided-by=per-ip key-remaining=4
	// refunded=true key-remaining=5 ip-remaining=1
}
