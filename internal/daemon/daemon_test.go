package daemon

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func TestMain(m *testing.M) {
	if os.Getenv("DAEMON_AWAKE_CHILD") == "1" {
		// TestStayAwakeReexecutes: StayAwake re-executes this binary once,
		// then finds the setting and returns.
		err := StayAwake()
		fmt.Printf("GODEBUG=%s err=%v\n", os.Getenv("GODEBUG"), err)
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

type settings struct {
	addr    string
	timeout time.Duration
	count   int
	log     LogFlags
}

func newFlags(s *settings, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("d", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&s.addr, "grpc-addr", ":1", "address")
	fs.DurationVar(&s.timeout, "store-timeout", time.Second, "timeout")
	fs.IntVar(&s.count, "count", 3, "count")
	s.log.Register(fs)
	return fs
}

func TestParse(t *testing.T) {
	cases := []struct {
		name      string
		args, env []string
		want      settings
		err       string // "" = no error
	}{
		{"defaults", nil, nil, settings{addr: ":1", timeout: time.Second, count: 3, log: LogFlags{Level: "info"}}, ""},
		{"env sets the default", nil, []string{"QUOTA_GRPC_ADDR=127.0.0.1:9", "QUOTA_STORE_TIMEOUT=5ms", "QUOTA_JSON_LOGS=true", "OTHER=x"},
			settings{addr: "127.0.0.1:9", timeout: 5 * time.Millisecond, count: 3, log: LogFlags{Level: "info", JSON: true}}, ""},
		{"flag wins", []string{"-grpc-addr", "127.0.0.1:7"}, []string{"QUOTA_GRPC_ADDR=127.0.0.1:9", "QUOTA_COUNT=4"},
			settings{addr: "127.0.0.1:7", timeout: time.Second, count: 4, log: LogFlags{Level: "info"}}, ""},
		{"variable of no flag", nil, []string{"QUOTA_REGION=eu"}, settings{addr: ":1", timeout: time.Second, count: 3, log: LogFlags{Level: "info"}}, ""},
		{"bad variable", nil, []string{"QUOTA_STORE_TIMEOUT=soon"}, settings{}, `QUOTA_STORE_TIMEOUT="soon" (flag -store-timeout)`},
		{"unknown flag", []string{"-nope"}, nil, settings{}, "flag provided but not defined: -nope"},
		{"bad value", []string{"-count", "many"}, nil, settings{}, `invalid value "many" for flag -count`},
		{"stray argument", []string{"serve"}, nil, settings{}, `unexpected arguments ["serve"]`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var s settings
			var out bytes.Buffer
			err := Parse(newFlags(&s, &out), c.args, c.env)
			if c.err != "" {
				var ue *UsageError
				if !errors.As(err, &ue) || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want a UsageError containing %q", err, c.err)
				}
				return
			}
			if err != nil || s != c.want {
				t.Fatalf("got %+v, %v; want %+v", s, err, c.want)
			}
		})
	}
	var s settings
	var out bytes.Buffer
	if err := Parse(newFlags(&s, &out), []string{"-h"}, nil); !errors.Is(err, flag.ErrHelp) || !strings.Contains(out.String(), "-grpc-addr") {
		t.Fatalf("-h: %v, usage %q", err, out.String())
	}
}

func TestEnvName(t *testing.T) {
	if got := EnvName("redis-tls-server-name"); got != "QUOTA_REDIS_TLS_SERVER_NAME" {
		t.Fatal(got)
	}
}

func TestSecret(t *testing.T) {
	env := []string{"QUOTA_REDIS_PASSWORD_FILE=/f", "QUOTA_REDIS_PASSWORD=p=w", "REDIS_PASSWORD=x"}
	if got := Secret(env, "redis-password"); got != "p=w" {
		t.Fatalf("Secret = %q, want p=w", got)
	}
	if got := Secret(env[:1], "redis-password"); got != "" {
		t.Fatalf("Secret of an unset variable = %q", got)
	}
}

func TestSplitList(t *testing.T) {
	for in, want := range map[string][]string{
		"":                          nil,
		" , ,":                      nil,
		"http://a:2379":             {"http://a:2379"},
		"http://a:2379, http://b:1": {"http://a:2379", "http://b:1"},
		",x,,y ,":                   {"x", "y"},
	} {
		if got := SplitList(in); !slices.Equal(got, want) {
			t.Errorf("SplitList(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestLogger(t *testing.T) {
	for _, name := range []string{"trace", "debug", "info", "warn", "error", "WARN"} {
		if _, err := ParseLevel(name); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	for _, name := range []string{"", "loud", "off"} {
		if _, err := ParseLevel(name); !errors.As(err, new(*UsageError)) || !strings.Contains(err.Error(), "-log-level") {
			t.Errorf("%q: %v, want a UsageError naming -log-level", name, err)
		}
	}
	var out bytes.Buffer
	log, err := LogFlags{Level: "warn", JSON: true}.Logger("d", &out)
	if err != nil {
		t.Fatal(err)
	}
	log.Info("hidden")
	log.Warn("shown", "k", "v")
	if got := out.String(); strings.Contains(got, "hidden") || !strings.Contains(got, `"@message":"shown"`) || !strings.Contains(got, `"k":"v"`) {
		t.Fatalf("log %q", got)
	}
}

func TestExec(t *testing.T) {
	run := func(ctx context.Context, args, env []string, stderr io.Writer) error {
		var s settings
		if err := Parse(newFlags(&s, stderr), args, env); err != nil {
			return err
		}
		switch s.count {
		case 0:
			return errors.New("nothing to count")
		case 1:
			return errors.New("d: one is not enough")
		}
		return nil
	}
	cases := []struct {
		args []string
		code int
		out  string
	}{
		{nil, ExitOK, ""},
		{[]string{"-h"}, ExitOK, "Usage of d"},
		{[]string{"-nope"}, ExitUsage, "d: flag provided but not defined: -nope"},
		{[]string{"-count", "0"}, ExitError, "d: nothing to count\n"},
		{[]string{"-count", "1"}, ExitError, "\nd: one is not enough\n"},
	}
	for _, c := range cases {
		var out bytes.Buffer
		code := Exec(context.Background(), "d", run, c.args, nil, &out)
		if code != c.code || !strings.Contains("\n"+out.String(), c.out) {
			t.Errorf("%v: exit %d, output %q; want %d and %q", c.args, code, out.String(), c.code, c.out)
		}
	}
}

// healthServer is a gRPC server with health checking and the two
// loopback listeners for Serve.
func healthServer(t *testing.T) (gl, hl net.Listener, gs *grpc.Server, hs *health.Server) {
	t.Helper()
	gl, hl, err := Listen("127.0.0.1:0", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs = grpc.NewServer()
	hs = health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	return gl, hl, gs, hs
}

// TestServe: both servers answer, the announce lines name the bound
// addresses, and cancelling stops both gracefully: health turns
// NOT_SERVING, a slow HTTP request in flight completes and Serve returns
// nil with the listeners closed.
func TestServe(t *testing.T) {
	gl, hl, gs, hs := healthServer(t)
	release := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		<-release
		_, _ = w.Write([]byte("done"))
	})
	var announce bytes.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Serve(ctx, Servers{GRPC: gs, GRPCListener: gl, HTTP: &http.Server{Handler: mux}, HTTPListener: hl,
			Health: hs, Announce: &announce, Logger: hclog.NewNullLogger()})
	}()
	conn, err := grpc.NewClient(gl.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	if r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", r, err)
	}
	wctx, stopWatch := context.WithCancel(context.Background())
	defer stopWatch()
	watch, err := hc.Watch(wctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := watch.Recv(); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("watch: %v %v", r, err)
	}
	slow := make(chan string, 1)
	go func() {
		resp, err := http.Get("http://" + hl.Addr().String() + "/slow")
		if err != nil {
			slow <- err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		slow <- string(b)
	}()
	if want := "grpc listening on " + gl.Addr().String() + "\nhttp listening on " + hl.Addr().String() + "\n"; announce.String() != want {
		t.Fatalf("announce %q, want %q", announce.String(), want)
	}
	time.Sleep(50 * time.Millisecond) // the slow request is in flight
	cancel()
	if r, err := watch.Recv(); err != nil || r.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("watch after cancel: %v %v", r, err)
	}
	stopWatch() // the stream would hold the graceful stop
	close(release)
	if got := <-slow; got != "done" {
		t.Fatalf("request in flight: %q", got)
	}
	start := time.Now()
	if err := <-done; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if d := time.Since(start); d > DefaultShutdownTimeout/2 {
		t.Fatalf("graceful stop took %v: something held it", d)
	}
	for _, l := range []net.Listener{gl, hl} {
		if c, err := net.Dial("tcp", l.Addr().String()); err == nil {
			c.Close()
			t.Errorf("%s still accepts", l.Addr())
		}
	}
}

// TestServeShutdownTimeout: a gRPC call that never ends holds the
// graceful stop only for ShutdownTimeout.
func TestServeShutdownTimeout(t *testing.T) {
	gl, hl, gs, hs := healthServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Serve(ctx, Servers{GRPC: gs, GRPCListener: gl, HTTP: &http.Server{}, HTTPListener: hl, Health: hs,
			ShutdownTimeout: 100 * time.Millisecond})
	}()
	conn, err := grpc.NewClient(gl.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// A Watch stream lasts until the client or the server ends it.
	watch, err := healthpb.NewHealthClient(conn).Watch(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := watch.Recv(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after its shutdown timeout")
	}
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Fatalf("returned after %v, before the shutdown timeout with a stream open", d)
	}
}

func TestListenFailure(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	if _, _, err := Listen("127.0.0.1:0", busy.Addr().String()); err == nil || !strings.Contains(err.Error(), "listen for HTTP") {
		t.Fatalf("err %v", err)
	}
	if _, _, err := Listen(busy.Addr().String(), "127.0.0.1:0"); err == nil || !strings.Contains(err.Error(), "listen for gRPC") {
		t.Fatalf("err %v", err)
	}
}

func TestCleanup(t *testing.T) {
	var c Cleanup
	var got []int
	for i := range 3 {
		c.Push(func() { got = append(got, i) })
	}
	c.Run()
	c.Run()
	if !slices.Equal(got, []int{2, 1, 0}) {
		t.Fatalf("order %v, want newest first, once", got)
	}
}

// TestServeDrain: once ctx ends, health turns NOT_SERVING and OnDrain runs
// at once, while both servers keep answering new connections for Drain;
// then Serve stops them and returns.
func TestServeDrain(t *testing.T) {
	const drain = 700 * time.Millisecond
	gl, hl, gs, hs := healthServer(t)
	mux := http.NewServeMux()
	mux.HandleFunc("/ping", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("pong")) })
	var drained atomic.Int32
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Serve(ctx, Servers{GRPC: gs, GRPCListener: gl, HTTP: &http.Server{Handler: mux}, HTTPListener: hl, Health: hs,
			Drain: drain, OnDrain: func() { drained.Add(1) }})
	}()
	health := func() (healthpb.HealthCheckResponse_ServingStatus, error) {
		conn, err := grpc.NewClient(gl.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		r, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
		return r.GetStatus(), err
	}
	if st, err := health(); err != nil || st != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health before: %v %v", st, err)
	}
	start := time.Now()
	cancel()
	for drained.Load() == 0 {
		if time.Since(start) > drain/2 {
			t.Fatal("OnDrain not called at once")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// New connections during the drain: both servers answer, health says
	// NOT_SERVING.
	if st, err := health(); err != nil || st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health during the drain: %v %v", st, err)
	}
	resp, err := http.Get("http://" + hl.Addr().String() + "/ping")
	if err != nil {
		t.Fatalf("HTTP during the drain: %v", err)
	}
	resp.Body.Close()
	if time.Since(start) >= drain {
		t.Fatalf("the checks took the whole drain (%v); the test proves nothing", time.Since(start))
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(drain + 5*time.Second):
		t.Fatal("Serve did not return after the drain")
	}
	if d := time.Since(start); d < drain {
		t.Fatalf("Serve returned after %v, before the drain of %v", d, drain)
	}
	if drained.Load() != 1 {
		t.Fatalf("OnDrain called %d times", drained.Load())
	}
}
