package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	"google.golang.org/grpc/reflection"
)

// DefaultShutdownTimeout is Servers.ShutdownTimeout when zero.
const DefaultShutdownTimeout = 10 * time.Second

// Listen opens the gRPC and the HTTP listener, closing the first when the
// second fails.
func Listen(grpcAddr, httpAddr string) (grpcLis, httpLis net.Listener, err error) {
	grpcLis, err = net.Listen("tcp", grpcAddr)
	if err != nil {
		return nil, nil, fmt.Errorf("listen for gRPC on %q: %w", grpcAddr, err)
	}
	httpLis, err = net.Listen("tcp", httpAddr)
	if err != nil {
		_ = grpcLis.Close()
		return nil, nil, fmt.Errorf("listen for HTTP on %q: %w", httpAddr, err)
	}
	return grpcLis, httpLis, nil
}

// Servers is what a daemon serves.
type Servers struct {
	// GRPC serves on GRPCListener; required.
	GRPC         *grpc.Server
	GRPCListener net.Listener
	// HTTP serves on HTTPListener; required.
	HTTP         *http.Server
	HTTPListener net.Listener
	// Health is GRPC's health service; when the daemon stops it reports
	// NOT_SERVING for every service before connections drain. May be nil.
	Health *health.Server
	// Reflection registers gRPC server reflection on GRPC (the
	// -grpc-reflection flag): it lists every service and message to
	// anyone who reaches the port, so it is off unless asked for.
	Reflection bool
	// Drain is how long the daemon keeps serving, not ready, once ctx
	// ends and before the graceful stop: Health reports NOT_SERVING and
	// OnDrain runs at once, so that load balancers and proxies (Envoy)
	// move their traffic away while calls still succeed, rather than
	// meeting closed connections. Zero stops at once.
	Drain time.Duration
	// OnDrain, when set, is called once when ctx ends, before the drain
	// (the daemon turns its HTTP readiness off there).
	OnDrain func()
	// ShutdownTimeout bounds each graceful stop, gRPC's and HTTP's; then
	// open connections are closed. Default DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
	// Announce, when set, receives "grpc listening on ADDR" and
	// "http listening on ADDR" lines once both listen (tools and tests
	// read the bound addresses there when a port was 0).
	Announce io.Writer
	// Logger defaults to hclog.NewNullLogger().
	Logger hclog.Logger
}

// Serve serves s until ctx ends or a server fails, then stops both
// gracefully (see the package doc) and returns the first server error, or
// nil when ctx ended. It blocks; the servers run on goroutines of their
// own, all ended when it returns.
func Serve(ctx context.Context, s Servers) error {
	if s.ShutdownTimeout <= 0 {
		s.ShutdownTimeout = DefaultShutdownTimeout
	}
	if s.Logger == nil {
		s.Logger = hclog.NewNullLogger()
	}
	if s.Reflection {
		reflection.Register(s.GRPC)
	}
	if s.Announce != nil {
		fmt.Fprintf(s.Announce, "grpc listening on %s\nhttp listening on %s\n", s.GRPCListener.Addr(), s.HTTPListener.Addr())
	}
	errc := make(chan error, 2)
	go func() {
		if err := s.GRPC.Serve(s.GRPCListener); err != nil {
			errc <- fmt.Errorf("gRPC server: %w", err)
			return
		}
		errc <- nil
	}()
	go func() {
		if err := s.HTTP.Serve(s.HTTPListener); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("HTTP server: %w", err)
			return
		}
		errc <- nil
	}()
	var err error
	pending := 2
	select {
	case <-ctx.Done():
	case err = <-errc:
		pending--
	}
	if s.Health != nil {
		s.Health.Shutdown()
	}
	if s.OnDrain != nil {
		s.OnDrain()
	}
	if err == nil && s.Drain > 0 {
		s.Logger.Info("draining: not ready, still serving", "drain", s.Drain)
		drain := time.NewTimer(s.Drain)
		select {
		case <-drain.C:
		case err = <-errc:
			pending--
			drain.Stop()
		}
	}
	s.Logger.Info("shutting down")
	stopped := make(chan struct{})
	go func() { s.GRPC.GracefulStop(); close(stopped) }()
	timer := time.NewTimer(s.ShutdownTimeout)
	defer timer.Stop()
	select {
	case <-stopped:
	case <-timer.C:
		s.Logger.Warn("graceful gRPC stop timed out; closing connections", "timeout", s.ShutdownTimeout)
		s.GRPC.Stop()
		<-stopped
	}
	sctx, cancel := context.WithTimeout(context.Background(), s.ShutdownTimeout)
	defer cancel()
	if serr := s.HTTP.Shutdown(sctx); serr != nil {
		s.Logger.Warn("graceful HTTP stop timed out; closing connections", "error", serr)
		_ = s.HTTP.Close()
	}
	for ; pending > 0; pending-- {
		if serr := <-errc; err == nil {
			err = serr
		}
	}
	return err
}

// Cleanup is a stack of functions that undo what a daemon's start built
// (close a client, stop an embedded server); Run calls them newest first.
// The zero Cleanup is empty and ready to use; it is not safe for
// concurrent use.
type Cleanup struct{ fns []func() }

// Push adds f to run before everything pushed so far.
func (c *Cleanup) Push(f func()) { c.fns = append(c.fns, f) }

// Run calls the pushed functions, newest first, and empties the stack.
func (c *Cleanup) Run() {
	for i := len(c.fns) - 1; i >= 0; i-- {
		c.fns[i]()
	}
	c.fns = nil
}
