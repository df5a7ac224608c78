package regional

import (
	"net"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/quotacoord/quota/internal/grpctest"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

// TestReflectionOffByDefault: a node serves no gRPC reflection (which
// lists every service to anyone who reaches the port) unless
// GRPCReflection (-grpc-reflection) asks for it.
func TestReflectionOffByDefault(t *testing.T) {
	g, _, _, stop := runNode(t, DaemonConfig{Policies: "../../examples/policies"})
	_, err := grpctest.ReflectionServices(ctxT(t), g)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("reflection by default: %v, want Unimplemented", err)
	}
	g, _, _, stop = runNode(t, DaemonConfig{Policies: "../../examples/policies", GRPCReflection: true})
	names, err := grpctest.ReflectionServices(ctxT(t), g)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if err != nil || !strings.Contains(strings.Join(names, " "), quotav1.Admission_ServiceDesc.ServiceName) {
		t.Fatalf("reflection with GRPCReflection: %v, %v", names, err)
	}
}

// TestOTLPPlaintextOnlyWhenAsked: the trace exporter speaks TLS to
// -otlp-endpoint unless OTLPInsecure (-otlp-insecure) is set. A plaintext
// collector receives the node's spans only with OTLPInsecure; without it
// the exporter's TLS handshake fails and nothing arrives in plaintext.
func TestOTLPPlaintextOnlyWhenAsked(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var exports atomic.Int64
	// The collector answers TraceService/Export with an empty message (an
	// empty ExportTraceServiceResponse on the wire) and counts the calls.
	collector := grpc.NewServer(grpc.UnknownServiceHandler(func(_ any, stream grpc.ServerStream) error {
		if m, _ := grpc.MethodFromServerStream(stream); m == "/opentelemetry.proto.collector.trace.v1.TraceService/Export" {
			exports.Add(1)
		}
		if err := stream.RecvMsg(&emptypb.Empty{}); err != nil {
			return err
		}
		return stream.SendMsg(&emptypb.Empty{})
	}))
	go func() { _ = collector.Serve(l) }()
	defer collector.Stop()
	for _, insecure := range []bool{false, true} {
		before := exports.Load()
		adm, _, stop := nodeAdmission(t, DaemonConfig{Policies: "../../examples/policies", OTLPEndpoint: l.Addr().String(), OTLPInsecure: insecure})
		if _, err := adm.Check(ctxT(t), &quotav1.CheckRequest{Subject: "acme", Policies: []string{"exports"}}); err != nil {
			t.Fatal(err)
		}
		if err := stop(); err != nil { // flushes the spans
			t.Fatal(err)
		}
		if got := exports.Load() - before; (got > 0) != insecure {
			t.Errorf("OTLPInsecure=%v: %d plaintext exports", insecure, got)
		}
	}
}
