package faultproxy_test

import (
	"fmt"
	"net"
	"time"

	"github.com/quotacoord/quota/internal/faultproxy"
)

// A proxy in front of a server: clients dial p.Addr(); the test slows or
// cuts the path while they run.
func Example() {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	defer ln.Close()
	p, err := faultproxy.Start(faultproxy.Config{Target: ln.Addr().String()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer p.Close()
	_ = p.SetLatency(20 * time.Millisecond) // each direction
	_ = p.SetMode(faultproxy.Blackhole)     // a partition
	_ = p.SetMode(faultproxy.Pass)          // healed
	fmt.Println(p.Mode(), p.Latency())
	// Output: pass 20ms
}
