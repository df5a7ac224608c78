package regional

import (
	"net"
	"net/netip"
	"sync"
)

// callerKey names a caller for its in-flight limit: its first proven
// identity and its peer's IP address, so that proxies sharing one
// identity (one SPIFFE ID for every Envoy pod) are bounded each on its
// own. It is comparable and costs an anonymous caller no allocation.
type callerKey struct {
	id   string
	addr netip.Addr
}

// keyOf is the callerKey of identities ids and peer address a.
func keyOf(ids []string, a net.Addr) callerKey {
	var k callerKey
	if len(ids) > 0 {
		k.id = ids[0]
	}
	if ta, ok := a.(*net.TCPAddr); ok {
		ip, _ := netip.AddrFromSlice(ta.IP)
		k.addr = ip.Unmap()
	}
	return k
}

// inflight bounds the bucket operations one caller has in flight on the
// node: a check of k policies holds k while it runs, a batch the sum of
// its checks', an Envoy request one per descriptor. A caller at its bound
// is refused at once rather than queued, so a flood from one caller holds
// at most max operations of Redis time at any moment, and every other
// caller's check waits behind at most that much of it.
//
// The map holds a caller only while it has operations in flight, so it
// is bounded by the node's concurrent requests. A max ≤ 0 turns the
// bound off. The zero value is unusable; build it with newInflight.
type inflight struct {
	max int
	mu  sync.Mutex
	ops map[callerKey]int
}

func newInflight(max int) *inflight {
	return &inflight{max: max, ops: make(map[callerKey]int)}
}

// acquire takes n operations for k and reports whether k stays within
// the bound; on true the caller must release(k, n).
func (l *inflight) acquire(k callerKey, n int) bool {
	if l.max <= 0 {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	cur := l.ops[k]
	if cur+n > l.max {
		return false
	}
	l.ops[k] = cur + n
	return true
}

// release gives back n operations of k.
func (l *inflight) release(k callerKey, n int) {
	if l.max <= 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if cur := l.ops[k] - n; cur > 0 {
		l.ops[k] = cur
	} else {
		delete(l.ops, k)
	}
}
