package loadgen

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// MaxRoundTripConns bounds the Redis connections a round-trip server
// opens: one per check in flight, at most this many.
const MaxRoundTripConns = 64

// roundTripTimeout bounds one PING, dial included.
const roundTripTimeout = time.Second

var (
	pingCommand = []byte("*1\r\n$4\r\nPING\r\n")
	pongReply   = []byte("+PONG\r\n")
)

// roundTrip answers every check OK, as noop does, after one PING to Redis
// and its reply: the least any service that asks Redis once per check
// must do, written as plainly as Go allows (a raw RESP connection, no
// client library, no pipeline, no pool check). Its latency at one caller
// is the floor of such a service on the machine it runs on.
type roundTrip struct {
	noop
	addr  string
	idle  chan net.Conn // connections between checks
	slots chan struct{} // one per open connection, MaxRoundTripConns
}

func newRoundTrip(redisAddr string) *roundTrip {
	return &roundTrip{
		addr:  redisAddr,
		idle:  make(chan net.Conn, MaxRoundTripConns),
		slots: make(chan struct{}, MaxRoundTripConns),
	}
}

func (rt *roundTrip) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if err := rt.ping(ctx); err != nil {
		return nil, status.Errorf(codes.Unavailable, "loadgen: redis %s: %v", rt.addr, err)
	}
	return rt.noop.ShouldRateLimit(ctx, req)
}

// ping sends one PING on an idle connection, or on a new one while fewer
// than MaxRoundTripConns are open, and reads the reply. A connection that
// failed is closed and its slot freed.
func (rt *roundTrip) ping(ctx context.Context) error {
	c, err := rt.conn(ctx)
	if err != nil {
		return err
	}
	var reply [len("+PONG\r\n")]byte
	err = c.SetDeadline(time.Now().Add(roundTripTimeout))
	if err == nil {
		_, err = c.Write(pingCommand)
	}
	if err == nil {
		_, err = io.ReadFull(c, reply[:])
	}
	if err == nil && !bytes.Equal(reply[:], pongReply) {
		err = fmt.Errorf("PING replied %q", reply[:])
	}
	if err != nil {
		c.Close()
		<-rt.slots
		return err
	}
	rt.idle <- c
	return nil
}

func (rt *roundTrip) conn(ctx context.Context) (net.Conn, error) {
	select {
	case c := <-rt.idle:
		return c, nil
	default:
	}
	select {
	case c := <-rt.idle:
		return c, nil
	case rt.slots <- struct{}{}:
		d := net.Dialer{Timeout: roundTripTimeout}
		c, err := d.DialContext(ctx, "tcp", rt.addr)
		if err != nil {
			<-rt.slots
			return nil, err
		}
		return c, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// close closes the idle connections.
func (rt *roundTrip) close() {
	for {
		select {
		case c := <-rt.idle:
			c.Close()
		default:
			return
		}
	}
}
