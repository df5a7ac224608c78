package faultproxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Mode is the fault a Proxy applies.
type Mode int32

const (
	// Pass forwards traffic after the configured latency.
	Pass Mode = iota
	// Blackhole holds all traffic and new connections (a partition).
	Blackhole
	// Drop closes every connection, live and new.
	Drop
	// Reset resets every connection, live and new.
	Reset
)

// String names the mode.
func (m Mode) String() string {
	switch m {
	case Pass:
		return "pass"
	case Blackhole:
		return "blackhole"
	case Drop:
		return "drop"
	case Reset:
		return "reset"
	}
	return fmt.Sprintf("Mode(%d)", int32(m))
}

// Bounds on buffering and connections.
const (
	// ChunkSize is the most bytes read at once from one side.
	ChunkSize = 32 << 10
	// MaxQueuedChunks is how many chunks one direction holds while they
	// wait out the latency or a blackhole.
	MaxQueuedChunks = 64
	// DefaultMaxConns bounds the connections proxied at once.
	DefaultMaxConns = 1024
	// MaxLatency bounds SetLatency.
	MaxLatency = time.Hour
)

// ErrConfig reports an unusable Config or setting.
var ErrConfig = errors.New("faultproxy: invalid config")

// ErrClosed reports a call on a closed Proxy.
var ErrClosed = errors.New("faultproxy: proxy closed")

// Config configures a Proxy.
type Config struct {
	// Target is the upstream host:port. Required.
	Target string
	// Listen is where the proxy listens; default 127.0.0.1:0.
	Listen string
	// MaxConns bounds the connections proxied at once; default
	// DefaultMaxConns.
	MaxConns int
	// DialTimeout bounds a dial of the upstream; default 2s.
	DialTimeout time.Duration
}

// Stats counts what a Proxy did since Start.
type Stats struct {
	// Accepted connections, including those closed by a fault at once.
	Accepted int64
	// Faulted connections: closed or reset by Drop or Reset, or over
	// MaxConns.
	Faulted int64
	// Forwarded bytes, both directions.
	Forwarded int64
	// Live connections now.
	Live int64
}

// Proxy is a running fault-injecting TCP proxy.
type Proxy struct {
	cfg Config
	ln  net.Listener

	mode    atomic.Int32
	latency atomic.Int64

	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every mode change
	links   map[*link]struct{}
	closed  bool
	done    chan struct{}
	wg      sync.WaitGroup

	accepted, faulted, forwarded atomic.Int64
}

// Start listens on cfg.Listen and proxies to cfg.Target in mode Pass with
// no latency. It starts the accept goroutine; Close stops it.
func Start(cfg Config) (*Proxy, error) {
	if cfg.Target == "" {
		return nil, fmt.Errorf("%w: empty Target", ErrConfig)
	}
	if _, _, err := net.SplitHostPort(cfg.Target); err != nil {
		return nil, fmt.Errorf("%w: Target %q: %w", ErrConfig, cfg.Target, err)
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	switch {
	case cfg.MaxConns == 0:
		cfg.MaxConns = DefaultMaxConns
	case cfg.MaxConns < 0:
		return nil, fmt.Errorf("%w: MaxConns %d is negative", ErrConfig, cfg.MaxConns)
	}
	switch {
	case cfg.DialTimeout == 0:
		cfg.DialTimeout = 2 * time.Second
	case cfg.DialTimeout < 0:
		return nil, fmt.Errorf("%w: DialTimeout %v is negative", ErrConfig, cfg.DialTimeout)
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen on %s: %w", cfg.Listen, err)
	}
	p := &Proxy{cfg: cfg, ln: ln, changed: make(chan struct{}), links: map[*link]struct{}{}, done: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address clients dial instead of the target.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Target is the upstream address.
func (p *Proxy) Target() string { return p.cfg.Target }

// Mode returns the current mode.
func (p *Proxy) Mode() Mode { return Mode(p.mode.Load()) }

// Latency returns the current added latency per direction.
func (p *Proxy) Latency() time.Duration { return time.Duration(p.latency.Load()) }

// SetLatency holds every chunk read from now on for d before it is
// forwarded, in each direction. d must be in [0, MaxLatency].
func (p *Proxy) SetLatency(d time.Duration) error {
	if d < 0 || d > MaxLatency {
		return fmt.Errorf("%w: latency %v, want 0 to %v", ErrConfig, d, MaxLatency)
	}
	p.latency.Store(int64(d))
	return nil
}

// SetMode switches the fault. Drop and Reset close every live connection
// before SetMode returns.
func (p *Proxy) SetMode(m Mode) error {
	if m < Pass || m > Reset {
		return fmt.Errorf("%w: %v", ErrConfig, m)
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return ErrClosed
	}
	p.mode.Store(int32(m))
	close(p.changed)
	p.changed = make(chan struct{})
	var victims []*link
	if m == Drop || m == Reset {
		for l := range p.links {
			victims = append(victims, l)
		}
	}
	p.mu.Unlock()
	for _, l := range victims {
		if l.shut(m == Reset) {
			p.faulted.Add(1)
		}
	}
	return nil
}

// Stats returns the counters.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	live := int64(len(p.links))
	p.mu.Unlock()
	return Stats{Accepted: p.accepted.Load(), Faulted: p.faulted.Load(), Forwarded: p.forwarded.Load(), Live: live}
}

// Close stops listening, closes every connection and waits for every
// goroutine of the proxy. It is idempotent.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	close(p.done)
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	err := p.ln.Close()
	for _, l := range links {
		l.shut(false)
	}
	p.wg.Wait()
	return err
}

// waitWhileBlackholed blocks while the mode is Blackhole. It returns false
// when the proxy or the link (stop) closed meanwhile, or when the mode
// became Drop or Reset: what a partition held is lost with its cut, never
// forwarded in the moment before SetMode shuts the link.
func (p *Proxy) waitWhileBlackholed(stop <-chan struct{}) bool {
	for {
		p.mu.Lock()
		ch := p.changed
		m := p.Mode()
		p.mu.Unlock()
		switch m {
		case Drop, Reset:
			return false
		case Pass:
			return true
		}
		select {
		case <-ch:
		case <-stop:
			return false
		case <-p.done:
			return false
		}
	}
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return // closed
		}
		p.accepted.Add(1)
		l := &link{client: c, stop: make(chan struct{})}
		p.mu.Lock()
		m := p.Mode()
		refuse := p.closed || m == Drop || m == Reset || len(p.links) >= p.cfg.MaxConns
		if !refuse {
			p.links[l] = struct{}{}
			p.wg.Add(1)
		}
		p.mu.Unlock()
		if refuse {
			l.shut(m == Reset)
			p.faulted.Add(1)
			continue
		}
		go p.serve(l)
	}
}

// serve connects l upstream (after any blackhole) and pumps both ways.
func (p *Proxy) serve(l *link) {
	defer p.wg.Done()
	defer func() {
		l.shut(false)
		p.mu.Lock()
		delete(p.links, l)
		p.mu.Unlock()
	}()
	if !p.waitWhileBlackholed(l.stop) {
		return
	}
	d := net.Dialer{Timeout: p.cfg.DialTimeout}
	u, err := d.Dial("tcp", p.cfg.Target)
	if err != nil {
		return
	}
	if !l.setUpstream(u) {
		_ = u.Close()
		return
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.pump(l, l.client, u) }()
	go func() { defer wg.Done(); p.pump(l, u, l.client) }()
	wg.Wait()
}

type chunk struct {
	b   []byte
	due time.Time
}

// pump copies src to dst through a bounded queue that applies the latency
// and the blackhole; any error shuts the whole link.
func (p *Proxy) pump(l *link, src, dst net.Conn) {
	q := make(chan chunk, MaxQueuedChunks)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(q)
		for {
			buf := make([]byte, ChunkSize)
			n, err := src.Read(buf)
			if n > 0 {
				select {
				case q <- chunk{b: buf[:n], due: time.Now().Add(p.Latency())}:
				case <-l.stop:
					return
				}
			}
			if err != nil {
				if errors.Is(err, io.EOF) {
					return // half close: the writer finishes the queue
				}
				l.shut(false)
				return
			}
		}
	}()
	defer wg.Wait()
	for c := range q {
		if wait := time.Until(c.due); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-l.stop:
				t.Stop()
				return
			}
		}
		if !p.waitWhileBlackholed(l.stop) {
			return
		}
		if _, err := dst.Write(c.b); err != nil {
			l.shut(false)
			return
		}
		p.forwarded.Add(int64(len(c.b)))
	}
	// src reached EOF: pass the half close on.
	if tc, ok := dst.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
}

// link is one proxied connection.
type link struct {
	client net.Conn

	mu       sync.Mutex
	upstream net.Conn
	down     bool
	stop     chan struct{}
}

// setUpstream attaches u unless the link was shut meanwhile.
func (l *link) setUpstream(u net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.down {
		return false
	}
	l.upstream = u
	return true
}

// shut closes both sides, with a TCP reset when reset is true. It reports
// whether this call shut the link.
func (l *link) shut(reset bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.down {
		return false
	}
	l.down = true
	close(l.stop)
	for _, c := range []net.Conn{l.client, l.upstream} {
		if c == nil {
			continue
		}
		if tc, ok := c.(*net.TCPConn); ok && reset {
			_ = tc.SetLinger(0)
		}
		_ = c.Close()
	}
	return true
}
