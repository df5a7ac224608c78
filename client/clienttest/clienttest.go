// Package clienttest runs a small in-process admission server for tests of
// callers (the client, HTTP middleware, CLIs). It implements the
// quota.v1.Admission API over real gRPC on 127.0.0.1 with plain counters:
// each (policy, subject) may spend the policy's limit in total, nothing
// refills, and a denial reports RetryAfter. It is not the regional node;
// use internal/regional to test admission itself.
//
// A Server is safe for concurrent use. Its goroutines stop with Stop, which
// Start arranges in t.Cleanup.
package clienttest

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/quotacoord/quota/bucket"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

// RetryAfter is the retry-after of every denial.
const RetryAfter = 1500 * time.Millisecond

// ResetAfter is the reset-after of every decision.
const ResetAfter = time.Minute

// maxReplays bounds the idempotency memory.
const maxReplays = 10000

// Server is an admission server with fixed per-policy limits.
type Server struct {
	quotav1.UnimplementedAdmissionServer

	// Addr is the server's 127.0.0.1:port.
	Addr string

	mu       sync.Mutex
	limits   map[string]int64
	used     map[string]int64
	replays  map[string]*quotav1.CheckResponse
	delay    time.Duration
	degraded string
	share    float64
	calls    int

	gs   *grpc.Server
	done chan struct{}
}

// Start serves limits (policy name to total budget per subject) until the
// test ends. With tlsCfg non-nil the server speaks TLS.
func Start(t testing.TB, limits map[string]int64, tlsCfg *tls.Config) *Server {
	t.Helper()
	s, err := Serve(limits, tlsCfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// Serve is Start for code without a testing.TB (examples): the caller
// must call Stop.
func Serve(limits map[string]int64, tlsCfg *tls.Config) (*Server, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("clienttest: listen: %w", err)
	}
	s := &Server{Addr: lis.Addr().String(), limits: limits, used: map[string]int64{}, replays: map[string]*quotav1.CheckResponse{}, share: 1}
	var opts []grpc.ServerOption
	if tlsCfg != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tlsCfg)))
	}
	s.gs = grpc.NewServer(opts...)
	quotav1.RegisterAdmissionServer(s.gs, s)
	s.done = make(chan struct{})
	go func() {
		defer close(s.done)
		_ = s.gs.Serve(lis)
	}()
	return s, nil
}

// Stop closes the server and waits for its goroutines.
func (s *Server) Stop() {
	s.gs.Stop()
	<-s.done
}

// SetDelay makes every call wait d (or until its deadline) before answering.
func (s *Server) SetDelay(d time.Duration) {
	s.mu.Lock()
	s.delay = d
	s.mu.Unlock()
}

// SetDegraded makes every reply carry degraded mode m ("" for none).
func (s *Server) SetDegraded(m string) {
	s.mu.Lock()
	s.degraded = m
	s.mu.Unlock()
}

// SetShare makes every policy decision report share f as the region's
// (default 1); the limits stay as given.
func (s *Server) SetShare(f float64) {
	s.mu.Lock()
	s.share = f
	s.mu.Unlock()
}

// Calls returns how many checks reached the server (batch entries count
// one each).
func (s *Server) Calls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

// Used returns what subject has spent under policy.
func (s *Server) Used(policy, subject string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.used[policy+"\x00"+subject]
}

// Check implements quotav1.AdmissionServer.
func (s *Server) Check(ctx context.Context, req *quotav1.CheckRequest) (*quotav1.CheckResponse, error) {
	if err := s.wait(ctx); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.check(req)
}

// CheckBatch implements quotav1.AdmissionServer.
func (s *Server) CheckBatch(ctx context.Context, req *quotav1.CheckBatchRequest) (*quotav1.CheckBatchResponse, error) {
	if err := s.wait(ctx); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := &quotav1.CheckBatchResponse{}
	for _, c := range req.GetChecks() {
		if err := s.validate(c); err != nil {
			return nil, err
		}
	}
	for _, c := range req.GetChecks() {
		r, err := s.check(c)
		if err != nil {
			return nil, err
		}
		out.Responses = append(out.Responses, r)
	}
	return out, nil
}

func (s *Server) wait(ctx context.Context) error {
	s.mu.Lock()
	d := s.delay
	s.mu.Unlock()
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
}

func (s *Server) validate(req *quotav1.CheckRequest) error {
	subject := req.GetSubject()
	if req.GetHashSubject() {
		if subject == "" || len(subject) > 1024 {
			return status.Error(codes.InvalidArgument, "subject must be 1 to 1024 bytes")
		}
	} else if err := bucket.ValidateSubject(subject); err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	if len(req.GetPolicies()) == 0 || len(req.GetPolicies()) > 16 {
		return status.Error(codes.InvalidArgument, "want 1 to 16 policies")
	}
	for _, p := range req.GetPolicies() {
		limit, ok := s.limits[p]
		if !ok {
			return status.Errorf(codes.NotFound, "unknown policy %q", p)
		}
		if req.GetCost() > limit {
			return status.Errorf(codes.InvalidArgument, "cost %d is more than the capacity %d of policy %q", req.GetCost(), limit, p)
		}
	}
	if req.GetCost() < 0 {
		return status.Error(codes.InvalidArgument, "negative cost")
	}
	return nil
}

func (s *Server) check(req *quotav1.CheckRequest) (*quotav1.CheckResponse, error) {
	if err := s.validate(req); err != nil {
		return nil, err
	}
	s.calls++
	subject := req.GetSubject()
	if req.GetHashSubject() {
		subject = bucket.HashSubject("clienttest", subject)
	}
	if k := req.GetIdempotencyKey(); k != "" {
		if r, ok := s.replays[subject+"\x00"+k]; ok {
			out := proto.Clone(r).(*quotav1.CheckResponse)
			out.Replayed = true
			return out, nil
		}
	}
	cost := req.GetCost()
	if cost == 0 {
		cost = 1
	}
	if req.GetPeek() {
		cost = 0
	}
	resp := &quotav1.CheckResponse{Allowed: true, Degraded: s.degraded}
	var minRemaining int64 = -1
	for _, p := range req.GetPolicies() {
		limit, used := s.limits[p], s.used[p+"\x00"+subject]
		pd := &quotav1.PolicyDecision{Policy: p, Limit: limit, Share: s.share, ResetAfter: durationpb.New(ResetAfter)}
		if used+cost <= limit {
			pd.Allowed = true
			pd.Remaining = limit - used - cost
			pd.RetryAfter = durationpb.New(0)
		} else {
			pd.Remaining = limit - used
			pd.RetryAfter = durationpb.New(RetryAfter)
			if resp.Allowed {
				resp.Allowed = false
				resp.DecidedBy = p
			}
		}
		resp.Policies = append(resp.Policies, pd)
		if resp.Allowed && (minRemaining < 0 || pd.Remaining < minRemaining) {
			minRemaining = pd.Remaining
			resp.DecidedBy = p
		}
	}
	if resp.Allowed {
		for _, p := range req.GetPolicies() {
			s.used[p+"\x00"+subject] += cost
		}
	} else {
		// Nothing was charged: every bucket still holds what it held.
		for _, pd := range resp.Policies {
			pd.Remaining = pd.Limit - s.used[pd.Policy+"\x00"+subject]
		}
	}
	for _, pd := range resp.Policies {
		if pd.Policy == resp.DecidedBy {
			resp.Limit, resp.Remaining, resp.RetryAfter, resp.ResetAfter = pd.Limit, pd.Remaining, pd.RetryAfter, pd.ResetAfter
		}
	}
	if k := req.GetIdempotencyKey(); k != "" && len(s.replays) < maxReplays {
		s.replays[subject+"\x00"+k] = resp
	}
	return resp, nil
}

// String describes the server for test logs.
func (s *Server) String() string { return fmt.Sprintf("clienttest.Server(%s)", s.Addr) }
