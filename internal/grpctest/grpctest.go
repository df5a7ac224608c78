// Package grpctest holds gRPC helpers for tests that play an attacker: a
// tap that records the bearer tokens sent to it, and a reflection probe.
// Everything listens on loopback and stops at the test's cleanup.
package grpctest

import (
	"context"
	"net"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
)

// TokenTap is a gRPC server on loopback that answers every call
// Unimplemented ("token tap") and records the authorization headers it
// received: whoever sits on the path of a plaintext call sees as much.
type TokenTap struct {
	// Addr is the tap's loopback host:port.
	Addr string
	mu   sync.Mutex
	seen []string
}

// StartTokenTap starts a TokenTap, stopped at tb's cleanup.
func StartTokenTap(tb testing.TB) *TokenTap {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tap := &TokenTap{Addr: l.Addr().String()}
	s := grpc.NewServer(grpc.UnknownServiceHandler(func(_ any, ss grpc.ServerStream) error {
		md, _ := metadata.FromIncomingContext(ss.Context())
		tap.mu.Lock()
		tap.seen = append(tap.seen, md.Get("authorization")...)
		tap.mu.Unlock()
		return status.Error(codes.Unimplemented, "token tap")
	}))
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Serve(l) }()
	tb.Cleanup(func() { s.Stop(); <-done })
	return tap
}

// Tokens returns the authorization headers received so far, in order.
func (tap *TokenTap) Tokens() []string {
	tap.mu.Lock()
	defer tap.mu.Unlock()
	return append([]string(nil), tap.seen...)
}

// ReflectionServices asks the gRPC server at addr (plaintext) for its
// services by reflection; a server without reflection answers
// Unimplemented.
func ReflectionServices(ctx context.Context, addr string) ([]string, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		return nil, err
	}
	// A stream the server ended makes Send return io.EOF; Recv then
	// returns the server's status.
	_ = stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}})
	r, err := stream.Recv()
	if err != nil {
		return nil, err
	}
	var names []string
	for _, s := range r.GetListServicesResponse().GetService() {
		names = append(names, s.Name)
	}
	return names, nil
}
