package faultproxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echo starts a line echo server and returns its address.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

func start(t *testing.T, cfg Config) *Proxy {
	t.Helper()
	p, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func dial(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

// roundTrip sends line and reads the echo, with a deadline.
func roundTrip(c net.Conn, r *bufio.Reader, line string, within time.Duration) (string, error) {
	_ = c.SetDeadline(time.Now().Add(within))
	if _, err := c.Write([]byte(line + "\n")); err != nil {
		return "", err
	}
	got, err := r.ReadString('\n')
	if len(got) > 0 {
		got = got[:len(got)-1]
	}
	return got, err
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"no target", Config{}},
		{"target without port", Config{Target: "127.0.0.1"}},
		{"negative conns", Config{Target: "127.0.0.1:1", MaxConns: -1}},
		{"negative dial timeout", Config{Target: "127.0.0.1:1", DialTimeout: -time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Start(tc.cfg); !errors.Is(err, ErrConfig) {
				t.Fatalf("Start(%+v) = %v, want ErrConfig", tc.cfg, err)
			}
		})
	}
	p := start(t, Config{Target: echo(t)})
	if err := p.SetLatency(-time.Millisecond); !errors.Is(err, ErrConfig) {
		t.Fatalf("SetLatency(-1ms) = %v", err)
	}
	if err := p.SetMode(Mode(9)); !errors.Is(err, ErrConfig) {
		t.Fatalf("SetMode(9) = %v", err)
	}
	p.Close()
	if err := p.SetMode(Pass); !errors.Is(err, ErrClosed) {
		t.Fatalf("SetMode after Close = %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close = %v", err)
	}
}

func TestPassAndLatency(t *testing.T) {
	p := start(t, Config{Target: echo(t)})
	c, r := dial(t, p.Addr())
	if got, err := roundTrip(c, r, "hello", 5*time.Second); err != nil || got != "hello" {
		t.Fatalf("echo = %q, %v", got, err)
	}
	const d = 60 * time.Millisecond
	if err := p.SetLatency(d); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	if got, err := roundTrip(c, r, "slow", 10*time.Second); err != nil || got != "slow" {
		t.Fatalf("echo = %q, %v", got, err)
	}
	// Both directions are delayed: a round trip takes at least 2d.
	if el := time.Since(began); el < 2*d {
		t.Fatalf("round trip took %v with latency %v each way", el, d)
	}
	// The counter moves just after the write the client already read.
	want := int64(2 * len("hello\nslow\n"))
	deadline := time.Now().Add(5 * time.Second)
	for p.Stats().Forwarded < want && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if s := p.Stats(); s.Accepted != 1 || s.Forwarded != want || s.Live != 1 {
		t.Fatalf("stats %+v, want 1 accepted, %d forwarded, 1 live", s, want)
	}
}

func TestBlackholeHoldsThenDelivers(t *testing.T) {
	p := start(t, Config{Target: echo(t)})
	c, r := dial(t, p.Addr())
	if _, err := roundTrip(c, r, "before", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := p.SetMode(Blackhole); err != nil {
		t.Fatal(err)
	}
	if _, err := roundTrip(c, r, "held", 150*time.Millisecond); err == nil {
		t.Fatal("a blackholed connection answered")
	}
	// A connection made during the partition is accepted but not connected.
	c2, r2 := dial(t, p.Addr())
	_ = c2.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c2.Write([]byte("new\n")); err != nil {
		t.Fatal(err)
	}
	if err := p.SetMode(Pass); err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if got, err := r.ReadString('\n'); err != nil || got != "held\n" {
		t.Fatalf("after the partition: %q, %v", got, err)
	}
	if got, err := r2.ReadString('\n'); err != nil || got != "new\n" {
		t.Fatalf("held connection after the partition: %q, %v", got, err)
	}
}

// TestDropLosesWhatTheBlackholeHeld: a partition that ends in a cut
// loses what it held; no byte of it reaches either side, however the
// cut races the goroutines that hold the bytes.
func TestDropLosesWhatTheBlackholeHeld(t *testing.T) {
	target := echo(t)
	for _, mode := range []Mode{Drop, Reset} {
		for i := 0; i < 50; i++ {
			p := start(t, Config{Target: target})
			c, r := dial(t, p.Addr())
			if _, err := roundTrip(c, r, "before", 5*time.Second); err != nil {
				t.Fatal(err)
			}
			if err := p.SetMode(Blackhole); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Write([]byte("held\n")); err != nil {
				t.Fatal(err)
			}
			// Let the proxy read the line into its queue.
			time.Sleep(2 * time.Millisecond)
			if err := p.SetMode(mode); err != nil {
				t.Fatal(err)
			}
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			if got, err := r.ReadString('\n'); got != "" || err == nil {
				t.Fatalf("%v after a blackhole: read %q, %v; want nothing and an error", mode, got, err)
			}
			if s := p.Stats(); s.Forwarded != 2*int64(len("before\n")) {
				t.Fatalf("%v after a blackhole forwarded %d bytes, want only the first round trip's %d", mode, s.Forwarded, 2*len("before\n"))
			}
			_ = p.Close()
		}
	}
}

func TestDropAndReset(t *testing.T) {
	for _, tc := range []struct {
		mode  Mode
		check func(error) bool
	}{
		{Drop, func(err error) bool { return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) }},
		{Reset, func(err error) bool { return errors.Is(err, syscall.ECONNRESET) }},
	} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			p := start(t, Config{Target: echo(t)})
			c, r := dial(t, p.Addr())
			if _, err := roundTrip(c, r, "x", 5*time.Second); err != nil {
				t.Fatal(err)
			}
			if err := p.SetMode(tc.mode); err != nil {
				t.Fatal(err)
			}
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := r.ReadString('\n'); !tc.check(err) {
				t.Fatalf("live connection after %v: %v", tc.mode, err)
			}
			// A new connection is refused: at dial (a reset may beat the
			// handshake's end) or at the first read.
			if c2, err := net.DialTimeout("tcp", p.Addr(), 2*time.Second); err == nil {
				_ = c2.SetDeadline(time.Now().Add(5 * time.Second))
				_, _ = c2.Write([]byte("y\n"))
				if _, err := bufio.NewReader(c2).ReadString('\n'); err == nil {
					t.Fatalf("new connection answered in mode %v", tc.mode)
				}
				c2.Close()
			}
			if err := p.SetMode(Pass); err != nil {
				t.Fatal(err)
			}
			c3, r3 := dial(t, p.Addr())
			if got, err := roundTrip(c3, r3, "back", 5*time.Second); err != nil || got != "back" {
				t.Fatalf("after %v: %q, %v", tc.mode, got, err)
			}
			if s := p.Stats(); s.Faulted != 2 {
				t.Fatalf("faulted %d, want 2 (one live, one new)", s.Faulted)
			}
		})
	}
}

func TestMaxConns(t *testing.T) {
	p := start(t, Config{Target: echo(t), MaxConns: 1})
	c, r := dial(t, p.Addr())
	if _, err := roundTrip(c, r, "one", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	c2, r2 := dial(t, p.Addr())
	if _, err := roundTrip(c2, r2, "two", 5*time.Second); err == nil {
		t.Fatal("a connection over MaxConns was served")
	}
}

func TestUpstreamDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	p := start(t, Config{Target: addr})
	c, r := dial(t, p.Addr())
	if _, err := roundTrip(c, r, "nobody", 5*time.Second); err == nil {
		t.Fatal("answer from a dead upstream")
	}
}

func TestModeString(t *testing.T) {
	for m, want := range map[Mode]string{Pass: "pass", Blackhole: "blackhole", Drop: "drop", Reset: "reset", Mode(7): "Mode(7)"} {
		if got := m.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", int32(m), got, want)
		}
	}
}
