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
