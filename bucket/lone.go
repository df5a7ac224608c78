package bucket

import (
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotacoord/quota/internal/clock"
)

// loneIdle is how long the lone connection may sit unused and still carry
// a call unchecked. One idle longer goes back to the pool before the next
// lone call, which borrows a connection again; the pool checks it then,
// as it checks every connection it hands out. Redis closes an idle client
// only after whole seconds (its timeout setting), and load balancers and
// NAT tables later still, so a connection that answered less than
// loneIdle ago is open unless the server was restarted, killed the client
// or failed over in that instant, when a pooled call could meet the same
// closed connection.
const loneIdle = 100 * time.Millisecond

// pipeliner starts the pipelines a flush is sent in: the client (its
// pool), or the lone connection.
type pipeliner interface {
	Pipeline() redis.Pipeliner
}

// loneConn is the connection that lone calls (see Redis.direct) go out on:
// one connection of a single server's pool, held by the store from one
// lone call to the next. A call through the pool takes a connection from
// it and puts it back, and go-redis checks the health of every connection
// it takes (a non-blocking recvfrom on the socket); a lone call on the
// held connection pays neither. One call uses it at a time: a call that
// finds it in use goes through the pool.
type loneConn struct {
	mu sync.Mutex
	// client is the pool the connection is borrowed from; nil when the
	// store has no lone connection (a cluster or ring client, or a pool
	// that the flushers need whole: see newLoneConn).
	client *redis.Client
	// conn is nil until a lone call borrows a connection, after a call
	// on it failed, after it sat idle for loneIdle, and after it was held
	// for lifetime.
	conn *redis.Conn
	// lifetime is the client's ConnMaxLifetime (0: none): the pool closes
	// a connection older than that when it would lend it, so the store
	// holds one no longer.
	lifetime time.Duration
	// borrowedAt and usedAt are the clock's monotonic readings when conn
	// was borrowed and when it last answered.
	borrowedAt, usedAt time.Duration
	closed             bool
	clock              clock.Monotonic
}

// newLoneConn returns the lone connection of a store on client with the
// given number of flushers. Only a single server's client has one, and
// only when
//   - its pool holds more connections than the flushers use: the held
//     connection is one of the pool's, and neither a flusher (whose
//     pipelines take the pool's connections when the client has no
//     pipeline pool, or its pipeline pool is busy) nor the client's other
//     commands must wait for it;
//   - it speaks RESP2, as DialRedis's clients do: go-redis sets up a
//     connection borrowed through a redis.Conn with the client's options
//     but not under the client's lock, and on RESP3 it may rewrite those
//     options (turning maintenance notifications off) while the client
//     reads them.
func newLoneConn(client RedisClient, flushers int) *loneConn {
	l := &loneConn{clock: clock.Real{}}
	if c, ok := client.(*redis.Client); ok {
		if o := c.Options(); o.PoolSize > flushers && o.Protocol == 2 {
			l.client, l.lifetime = c, o.ConnMaxLifetime
		}
	}
	return l
}

// take returns the lone connection for one call, borrowing one from the
// pool when none is held, or the one held sat idle for loneIdle or was
// held for the client's ConnMaxLifetime; ok is false when there is none,
// when another call uses it, or once the store is closed: the call then
// goes through the pool. A call that got ok hands the connection back
// with give.
func (l *loneConn) take() (conn *redis.Conn, ok bool) {
	if l.client == nil || !l.mu.TryLock() {
		return nil, false
	}
	if l.closed {
		l.mu.Unlock()
		return nil, false
	}
	now := l.clock.Mono()
	if l.conn != nil && (now-l.usedAt >= loneIdle || l.lifetime > 0 && now-l.borrowedAt >= l.lifetime) {
		l.drop()
	}
	if l.conn == nil {
		l.conn = l.client.Conn() // borrows a connection at its first command
		l.borrowedAt = now
	}
	return l.conn, true
}

// give hands the lone connection back after a call on it that ended with
// err. A connection that met any error is dropped (back to the pool, which
// closes it when go-redis found it broken): after a network error, a
// timeout or an ended context it may be closed or still owe a reply that
// the next call would read as its own. The next lone call borrows another.
func (l *loneConn) give(err error) {
	if err != nil {
		l.drop()
	} else {
		l.usedAt = l.clock.Mono()
	}
	l.mu.Unlock()
}

// drop gives the held connection back to the pool; l.mu is held.
func (l *loneConn) drop() {
	_ = l.conn.Close()
	l.conn = nil
}

// close gives the held connection back to the pool for good, once the call
// on it (if any) has ended; later takes find none.
func (l *loneConn) close() {
	if l.client == nil {
		return
	}
	l.mu.Lock()
	l.closed = true
	if l.conn != nil {
		l.drop()
	}
	l.mu.Unlock()
}
