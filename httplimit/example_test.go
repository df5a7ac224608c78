package httplimit_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"time"

	"github.com/quotacoord/quota/client"
	"github.com/quotacoord/quota/client/clienttest"
	"github.com/quotacoord/quota/httplimit"
)

func ExampleLimiter_Wrap() {
	// A stand-in node for the example; use a regional node's address.
	node, err := clienttest.Serve(map[string]int64{"exports": 1}, nil)
	if err != nil {
		panic(err)
	}
	defer node.Stop()
	c, err := client.New(node.Addr, client.WithUnreachable(client.UnreachableOpen))
	if err != nil {
		panic(err)
	}
	defer c.Close()

	limiter, err := httplimit.New(httplimit.Config{
		Checker:  c,
		Policies: []httplimit.Policy{{Name: "exports", Window: time.Minute}},
		Subject:  httplimit.Tenant("X-Tenant"),
	})
	if err != nil {
		panic(err)
	}
	h := limiter.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "exported")
	}))

	for i := 0; i < 2; i++ {
		req := httptest.NewRequest("POST", "/exports", nil)
		req.Header.Set("X-Tenant", "acme")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		fmt.Printf("%d RateLimit-Policy: %s | RateLimit: %s | Retry-After: %q\n",
			rec.Code, rec.Header().Get("RateLimit-Policy"), rec.Header().Get("RateLimit"), rec.Header().Get("Retry-After"))
		fmt.Print(rec.Body.String())
	}
	// Output:
	// 200 RateLimit-Policy: "exports";q=1;w=60 | RateLimit: "exports";r=0;t=60 | Retry-After: ""
	// exported
	// 429 RateLimit-Policy: "exports";q=1;w=60 | RateLimit: "exports";r=0;t=60 | Retry-After: "2"
	// {"error":{"code":"RATE_LIMITED","message":"rate limit exceeded for policy \"exports\"","policy":"exports","retry_after_seconds":2}}
}

func ExampleClientAddr() {
	// Behind a load balancer in 10.0.0.0/8 that appends X-Forwarded-For.
	proxies := httplimit.Proxies{
		Trusted: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
		Header:  "X-Forwarded-For",
	}
	req := httptest.NewRequest("GET", "/", nil)
	req.RemoteAddr = "10.0.0.2:41000"
	req.Header.Set("Forwarded", "for=192.0.2.1")                 // written by the client: ignored
	req.Header.Set("X-Forwarded-For", "192.0.2.99, 203.0.113.7") // the client wrote the first hop
	a, err := httplimit.ClientAddr(req, proxies)
	fmt.Println(a, err)
	// Output: 203.0.113.7 <nil>
}
