package regional

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"

	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

// otlpReceiver is an in-process OTLP/gRPC trace collector: it keeps every
// span exported to it.
type otlpReceiver struct {
	collectortrace.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []*tracepb.Span
}

func (r *otlpReceiver) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			r.spans = append(r.spans, ss.GetSpans()...)
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

// startOTLPReceiver serves an otlpReceiver on loopback until the test ends.
func startOTLPReceiver(t *testing.T) (*otlpReceiver, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rcv := &otlpReceiver{}
	srv := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(srv, rcv)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return rcv, lis.Addr().String()
}

func attrString(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_BoolValue:
		if x.BoolValue {
			return "true"
		}
		return "false"
	case *commonpb.AnyValue_ArrayValue:
		var parts []string
		for _, e := range x.ArrayValue.GetValues() {
			parts = append(parts, attrString(e))
		}
		return strings.Join(parts, ",")
	}
	return v.String()
}

// TestCheckSpansReachAnOTLPCollector: a node exporting to a real OTLP
// gRPC endpoint sends one regional.Check span per check carrying the
// policies and the decision, and no span, attribute or event holds the
// raw subject.
func TestCheckSpansReachAnOTLPCollector(t *testing.T) {
	rcv, addr := startOTLPReceiver(t)
	api, _, stop := nodeAdmission(t, DaemonConfig{Policies: "../../examples/policies", OTLPEndpoint: addr, OTLPInsecure: true})
	const rawKey = "sk_live_RAWKEY_must_not_leak"
	checks := []*quotav1.CheckRequest{
		{Subject: "acme", Policies: []string{"exports"}, Cost: 1},
		{Subject: rawKey, HashSubject: true, Policies: []string{"api-requests"}, Cost: 1},
		{Subject: "acme", Policies: []string{"exports"}, Cost: 50}, // above the 49 left: denied
	}
	var want []string
	for _, c := range checks {
		resp, err := api.Check(context.Background(), c)
		if err != nil {
			t.Fatal(err)
		}
		allowed := "false"
		if resp.GetAllowed() {
			allowed = "true"
		}
		want = append(want, c.GetPolicies()[0]+" allowed="+allowed+" decided_by="+resp.GetDecidedBy())
	}
	// Stopping the node flushes its batch of spans to the collector.
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	var got []string
	for _, s := range rcv.spans {
		attrs := map[string]string{}
		for _, kv := range s.GetAttributes() {
			attrs[kv.GetKey()] = attrString(kv.GetValue())
			if strings.Contains(attrs[kv.GetKey()], rawKey) || strings.Contains(attrs[kv.GetKey()], "acme") {
				t.Errorf("span %s attribute %s holds a raw subject: %q", s.GetName(), kv.GetKey(), attrs[kv.GetKey()])
			}
		}
		for _, ev := range s.GetEvents() {
			for _, kv := range ev.GetAttributes() {
				if v := attrString(kv.GetValue()); strings.Contains(v, rawKey) || strings.Contains(v, "acme") {
					t.Errorf("span %s event %s holds a raw subject: %q", s.GetName(), ev.GetName(), v)
				}
			}
		}
		if s.GetName() == "regional.Check" {
			got = append(got, attrs["quota.policies"]+" allowed="+attrs["quota.allowed"]+" decided_by="+attrs["quota.decided_by"])
		}
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("regional.Check spans:\n%s\nwant:\n%s\n(%d spans exported)", strings.Join(got, "\n"), strings.Join(want, "\n"), len(rcv.spans))
	}
}
