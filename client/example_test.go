package client_test

import (
	"context"
	"fmt"

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
