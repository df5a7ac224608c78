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
	"google.golang.org/protobuf/types/known/timestamppb"

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
	if len(req.GetPolicies()) == 0 || len(req.GetPolicies()) > 16 {
		return status.Error(codes.InvalidArgument, "want 1 to 16 policies")
	}
	for _, p := range req.GetPolicies() {
		if _, err := s.validCharge(p, req.GetSubject(), req.GetHashSubject(), req.GetCost()); err != nil {
			return err
		}
	}
	return nil
}

// validCharge checks one (policy, subject, cost) and returns the subject
// as buckets are keyed (hashed when asked).
func (s *Server) validCharge(policy, subject string, hash bool, cost int64) (string, error) {
	if hash {
		if subject == "" || len(subject) > 1024 {
			return "", status.Error(codes.InvalidArgument, "subject must be 1 to 1024 bytes")
		}
		subject = bucket.HashSubject("clienttest", subject)
	} else if err := bucket.ValidateSubject(subject); err != nil {
		return "", status.Error(codes.InvalidArgument, err.Error())
	}
	limit, ok := s.limits[policy]
	if !ok {
		return "", status.Errorf(codes.NotFound, "unknown policy %q", policy)
	}
	if cost > limit {
		return "", status.Errorf(codes.InvalidArgument, "cost %d is more than the capacity %d of policy %q", cost, limit, policy)
	}
	if cost < 0 {
		return "", status.Error(codes.InvalidArgument, "negative cost")
	}
	return subject, nil
}

// charge is one bucket of a check: used[policy+"\x00"+subject].
type charge struct {
	policy, subject string
	cost            int64
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
	cost := max(req.GetCost(), 1)
	if req.GetPeek() {
		cost = 0
	}
	charges := make([]charge, len(req.GetPolicies()))
	for i, p := range req.GetPolicies() {
		charges[i] = charge{policy: p, subject: subject, cost: cost}
	}
	resp := s.decide(charges)
	if k := req.GetIdempotencyKey(); k != "" && len(s.replays) < maxReplays {
		s.replays[subject+"\x00"+k] = resp
	}
	return resp, nil
}

// decide charges every bucket of charges, all or nothing.
func (s *Server) decide(charges []charge) *quotav1.CheckResponse {
	now := timestamppb.Now()
	resp := &quotav1.CheckResponse{Allowed: true, Degraded: s.degraded, DecidedAt: now, DecidedIndex: -1}
	var minRemaining int64 = -1
	for i, c := range charges {
		limit, used := s.limits[c.policy], s.used[c.policy+"\x00"+c.subject]
		pd := &quotav1.PolicyDecision{Policy: c.policy, Limit: limit, Share: s.share, ResetAfter: durationpb.New(ResetAfter), DecidedAt: now}
		if used+c.cost <= limit {
			pd.Allowed = true
			pd.Remaining = limit - used - c.cost
			pd.RetryAfter = durationpb.New(0)
		} else {
			pd.Remaining = limit - used
			pd.RetryAfter = durationpb.New(RetryAfter)
			if resp.Allowed {
				resp.Allowed = false
				resp.DecidedIndex = int32(i)
			}
		}
		resp.Policies = append(resp.Policies, pd)
		if resp.Allowed && (minRemaining < 0 || pd.Remaining < minRemaining) {
			minRemaining = pd.Remaining
			resp.DecidedIndex = int32(i)
		}
	}
	for i, c := range charges {
		if resp.Allowed {
			s.used[c.policy+"\x00"+c.subject] += c.cost
		} else {
			// Nothing was charged: every bucket still holds what it held.
			resp.Policies[i].Remaining = resp.Policies[i].Limit - s.used[c.policy+"\x00"+c.subject]
		}
	}
	pd := resp.Policies[resp.DecidedIndex]
	resp.DecidedBy, resp.Limit, resp.Remaining, resp.RetryAfter, resp.ResetAfter = pd.Policy, pd.Limit, pd.Remaining, pd.RetryAfter, pd.ResetAfter
	return resp
}

// lockCharges waits the set delay, locks the server and checks the
// charges of a CheckAll or Refund. On success the caller holds s.mu and
// must unlock it; on error it is unlocked.
func (s *Server) lockCharges(ctx context.Context, in []*quotav1.Charge) ([]charge, error) {
	if err := s.wait(ctx); err != nil {
		return nil, err
	}
	s.mu.Lock()
	charges, err := s.validCharges(in)
	if err != nil {
		s.mu.Unlock()
		return nil, err
	}
	return charges, nil
}

func (s *Server) validCharges(in []*quotav1.Charge) ([]charge, error) {
	if len(in) == 0 || len(in) > 16 {
		return nil, status.Error(codes.InvalidArgument, "want 1 to 16 charges")
	}
	out := make([]charge, len(in))
	for i, c := range in {
		subject, err := s.validCharge(c.GetPolicy(), c.GetSubject(), c.GetHashSubject(), c.GetCost())
		if err != nil {
			return nil, status.Errorf(status.Code(err), "charge %d: %s", i, status.Convert(err).Message())
		}
		out[i] = charge{policy: c.GetPolicy(), subject: subject, cost: max(c.GetCost(), 1)}
	}
	return out, nil
}

// CheckAll implements quotav1.AdmissionServer: the charges all or
// nothing, counted as one check.
func (s *Server) CheckAll(ctx context.Context, req *quotav1.CheckAllRequest) (*quotav1.CheckResponse, error) {
	charges, err := s.lockCharges(ctx, req.GetCharges())
	if err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	s.calls++
	return s.decide(charges), nil
}

// Refund implements quotav1.AdmissionServer: each charge's cost is given
// back, never below nothing spent. The server grants refunds to every
// caller; a regional node asks for the refund grant.
func (s *Server) Refund(ctx context.Context, req *quotav1.RefundRequest) (*quotav1.RefundResponse, error) {
	charges, err := s.lockCharges(ctx, req.GetCharges())
	if err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	now := timestamppb.Now()
	out := &quotav1.RefundResponse{}
	for _, c := range charges {
		k := c.policy + "\x00" + c.subject
		s.used[k] = max(s.used[k]-c.cost, 0)
		limit := s.limits[c.policy]
		out.Refunds = append(out.Refunds, &quotav1.RefundDecision{Policy: c.policy, Refunded: true, Limit: limit,
			Remaining: limit - s.used[k], ResetAfter: durationpb.New(ResetAfter), DecidedAt: now})
	}
	return out, nil
}

// String describes the server for test logs.
func (s *Server) String() string { return fmt.Sprintf("clienttest.Server(%s)", s.Addr) }
