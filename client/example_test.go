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
