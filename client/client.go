package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/quotacoord/quota/internal/operatortoken"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

// ErrInvalidRequest reports a request the client refuses to send.
var ErrInvalidRequest = errors.New("client: invalid request")

// ErrInvalidConfig reports bad options given to New.
var ErrInvalidConfig = errors.New("client: invalid config")

// Unreachable says what Check does when the node cannot answer.
type Unreachable string

const (
	// UnreachableError returns the error (the default).
	UnreachableError Unreachable = "error"
	// UnreachableOpen admits and marks the decision Degraded "client_open".
	UnreachableOpen Unreachable = "open"
	// UnreachableClosed denies and marks the decision Degraded
	// "client_closed", with RetryAfter set by WithUnreachableRetryAfter.
	UnreachableClosed Unreachable = "closed"
)

// Degraded values set by the client itself.
const (
	DegradedClientOpen   = "client_open"
	DegradedClientClosed = "client_closed"
)

// Limits on requests, as the admission API defines them.
const (
	MaxPolicies       = 16
	MaxCharges        = 16 // charges of one CheckAll or Refund
	MaxBatch          = 256
	MaxIdempotencyKey = 128
)

// Defaults for New.
const (
	DefaultTimeout               = 250 * time.Millisecond
	DefaultUnreachableRetryAfter = time.Second
)

// Request is one admission check.
type Request struct {
	// Subject is the identity limited: [A-Za-z0-9_-]{1,96}, or any string
	// up to 1024 bytes when HashSubject is set.
	Subject string
	// HashSubject asks the node to hash Subject (raw API keys, IPs).
	HashSubject bool
	// Policies are checked all or nothing: 1 to 16 names.
	Policies []string
	// Cost is the request's weight; 0 means 1.
	Cost int64
	// IdempotencyKey makes a retry return the first decision without
	// charging again. At most 128 bytes. The node binds the key to the
	// request (subject, policies in order, cost, peek): reusing it for a
	// different request within the node's window is an InvalidArgument
	// error.
	IdempotencyKey string
	// Peek reports the buckets without charging them.
	Peek bool
}

// Decision is the answer to one Request.
type Decision struct {
	// Allowed is true when every policy admitted the cost.
	Allowed bool
	// DecidedBy is the policy whose bucket decided.
	DecidedBy string
	// Limit and Remaining describe the deciding bucket in this region.
	Limit, Remaining int64
	// RetryAfter is how long until a denied cost would be admitted.
	RetryAfter time.Duration
	// ResetAfter is how long until the deciding bucket is full again.
	ResetAfter time.Duration
	// Degraded is empty for a normal decision; the node's failure mode
	// ("open", "closed", "local") when Redis could not decide; or
	// "client_local" (its emergency bucket), "client_open" or
	// "client_closed" when this client decided because the node could not
	// answer.
	Degraded string
	// Replayed is true when the node repeated an earlier decision for the
	// same idempotency key.
	Replayed bool
	// Policies has one entry per requested policy (per charge for
	// CheckAll), in request order (empty when the unreachable mode
	// decided).
	Policies []PolicyDecision
	// DecidedAt is the node's store's instant of the deciding bucket's
	// decision (Redis TIME); zero when the client decided.
	DecidedAt time.Time
	// Cause is the error behind a client-made decision.
	Cause error
}

// PolicyDecision is one policy's part of a Decision.
type PolicyDecision struct {
	Policy           string
	Allowed          bool
	Limit, Remaining int64
	RetryAfter       time.Duration
	ResetAfter       time.Duration
	// Share is the fraction of the global budget this region enforced;
	// for an emergency bucket's decision, the fraction this client
	// enforced (the region's share over Emergency.Clients).
	Share float64
	// DecidedAt is the store's instant of this bucket's decision.
	DecidedAt time.Time
}

// Charge is one subject charged under one policy: an element of CheckAll
// and Refund.
type Charge struct {
	// Policy is the policy's name.
	Policy string
	// Subject is the identity charged: [A-Za-z0-9_-]{1,96}, or any string
	// up to 1024 bytes when HashSubject is set (the policy may ask the node
	// to hash it too).
	Subject string
	// HashSubject asks the node to hash Subject.
	HashSubject bool
	// Cost is the charge's weight; 0 means 1.
	Cost int64
}

// Refund is what one refunded Charge left in its bucket.
type Refund struct {
	Policy string
	// Refunded is false when there was nothing to give back to (an
	// unlimited policy, a zero share) or the node's store was unreachable.
	Refunded         bool
	Limit, Remaining int64
	ResetAfter       time.Duration
	// DecidedAt is the store's instant of the refund.
	DecidedAt time.Time
}

// Option configures New.
type Option func(*options)

type options struct {
	tls         *tls.Config
	timeout     time.Duration
	unreachable Unreachable
	retryAfter  time.Duration
	dialOpts    []grpc.DialOption
	conn        grpc.ClientConnInterface
	token       string
	emergency   *Emergency
	registerer  prometheus.Registerer
}

// WithTLS connects with TLS. Without it the connection is plaintext, for
// loopback and meshes that encrypt for you.
func WithTLS(cfg *tls.Config) Option { return func(o *options) { o.tls = cfg } }

// WithTimeout bounds every call (default DefaultTimeout). A context
// deadline that comes earlier wins.
func WithTimeout(d time.Duration) Option { return func(o *options) { o.timeout = d } }

// WithUnreachable chooses what Check does when the node cannot answer.
func WithUnreachable(u Unreachable) Option { return func(o *options) { o.unreachable = u } }

// WithEmergency gives the client local emergency buckets that decide
// checks of e's policies while the node is unreachable (see Emergency);
// the unreachable mode (WithUnreachable) still decides the checks they
// cannot.
func WithEmergency(e Emergency) Option { return func(o *options) { o.emergency = &e } }

// WithRegisterer registers the client's metrics with reg:
// quota_client_local_decisions_total{outcome}, the checks it decided
// without its node. Clients sharing a registry share the counter.
func WithRegisterer(reg prometheus.Registerer) Option {
	return func(o *options) { o.registerer = reg }
}

// WithUnreachableRetryAfter sets RetryAfter of UnreachableClosed decisions
// and of emergency denials for want of any share (default
// DefaultUnreachableRetryAfter).
func WithUnreachableRetryAfter(d time.Duration) Option {
	return func(o *options) { o.retryAfter = d }
}

// WithDialOptions adds gRPC dial options (interceptors, keepalive, ...).
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *options) { o.dialOpts = append(o.dialOpts, opts...) }
}

// WithBearerToken sends token with every call as "authorization: Bearer
// TOKEN": a node that lists it in its -auth-tokens file knows the caller
// as token:NAME and grants it what its -grants file says (peek, for
// instance). The token travels only over TLS (WithTLS), or in plaintext
// to a loopback address (a service mesh's sidecar); New refuses it
// otherwise. With WithConn it is not sent: give that connection its own
// credentials.
func WithBearerToken(token string) Option { return func(o *options) { o.token = token } }

// bearer is the per-call credential of WithBearerToken.
type bearer struct {
	token  string
	secure bool
}

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

func (b bearer) RequireTransportSecurity() bool { return b.secure }

// WithConn uses an existing connection instead of dialing; Close then
// leaves it open. The address given to New is ignored.
func WithConn(cc grpc.ClientConnInterface) Option { return func(o *options) { o.conn = cc } }

// Client checks admission against one regional node (or a load balancer in
// front of several).
type Client struct {
	api   quotav1.AdmissionClient
	conn  *grpc.ClientConn // nil with WithConn
	opts  options
	local *emergency // nil without WithEmergency
	m     localDecisions
}

// New returns a client of the node at addr (host:port, or any gRPC target
// such as dns:///quota.internal:8081). It does not wait for the connection:
// the first check does.
func New(addr string, opts ...Option) (*Client, error) {
	o := options{timeout: DefaultTimeout, unreachable: UnreachableError, retryAfter: DefaultUnreachableRetryAfter}
	for _, opt := range opts {
		opt(&o)
	}
	switch o.unreachable {
	case UnreachableError, UnreachableOpen, UnreachableClosed:
	default:
		return nil, fmt.Errorf("%w: unreachable mode %q is not error, open or closed", ErrInvalidConfig, o.unreachable)
	}
	if o.timeout <= 0 {
		return nil, fmt.Errorf("%w: timeout %v must be > 0", ErrInvalidConfig, o.timeout)
	}
	if o.retryAfter < 0 {
		return nil, fmt.Errorf("%w: unreachable retry-after %v must not be negative", ErrInvalidConfig, o.retryAfter)
	}
	c := &Client{opts: o}
	if o.emergency != nil {
		em, err := newEmergency(o.emergency, o.retryAfter)
		if err != nil {
			return nil, err
		}
		c.local = em
	}
	m, err := newLocalDecisions(o.registerer)
	if err != nil {
		return nil, err
	}
	c.m = m
	if o.conn != nil {
		c.api = quotav1.NewAdmissionClient(o.conn)
		return c, nil
	}
	if addr == "" {
		return nil, fmt.Errorf("%w: empty address", ErrInvalidConfig)
	}
	creds := insecure.NewCredentials()
	if o.tls != nil {
		creds = credentials.NewTLS(o.tls)
	}
	dial := append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, o.dialOpts...)
	if o.token != "" {
		if o.tls == nil && !operatortoken.LoopbackAddr(addr) {
			return nil, fmt.Errorf("%w: a bearer token goes only over TLS (WithTLS) or to a loopback address, not in plaintext to %s", ErrInvalidConfig, addr)
		}
		dial = append(dial, grpc.WithPerRPCCredentials(bearer{token: o.token, secure: o.tls != nil}))
	}
	conn, err := grpc.NewClient(addr, dial...)
	if err != nil {
		return nil, fmt.Errorf("client: connect to %s: %w", addr, err)
	}
	c.conn = conn
	c.api = quotav1.NewAdmissionClient(conn)
	return c, nil
}

// Close closes the connection New opened.
func (c *Client) Close() error {
	if c.conn == nil {
		return nil
	}
	return c.conn.Close()
}

// Allow checks cost for subject under one policy.
func (c *Client) Allow(ctx context.Context, subject, policy string, cost int64) (Decision, error) {
	return c.Check(ctx, Request{Subject: subject, Policies: []string{policy}, Cost: cost})
}

// Check decides one request. A denial is a Decision with Allowed false. An
// error means no decision: bad input, the caller's context ended, or the
// node could not answer under UnreachableError.
func (c *Client) Check(ctx context.Context, req Request) (Decision, error) {
	if err := req.validate(); err != nil {
		return Decision{}, err
	}
	callCtx, cancel := context.WithTimeout(ctx, c.opts.timeout)
	defer cancel()
	resp, err := c.api.Check(callCtx, req.proto())
	if err != nil {
		cause, local, err := c.failed(ctx, callCtx, err, "check")
		if err != nil {
			return Decision{}, err
		}
		return c.decideAlone(&req, cause, local)
	}
	return c.fromNode(resp), nil
}

// CheckBatch decides independent requests in one round trip; the
// decisions are in request order. When the node cannot answer, the
// unreachable choice applies to every request.
func (c *Client) CheckBatch(ctx context.Context, reqs []Request) ([]Decision, error) {
	if len(reqs) == 0 || len(reqs) > MaxBatch {
		return nil, fmt.Errorf("%w: batch of %d, want 1 to %d", ErrInvalidRequest, len(reqs), MaxBatch)
	}
	in := &quotav1.CheckBatchRequest{Checks: make([]*quotav1.CheckRequest, len(reqs))}
	for i := range reqs {
		if err := reqs[i].validate(); err != nil {
			return nil, fmt.Errorf("check %d: %w", i, err)
		}
		in.Checks[i] = reqs[i].proto()
	}
	callCtx, cancel := context.WithTimeout(ctx, c.opts.timeout)
	defer cancel()
	resp, err := c.api.CheckBatch(callCtx, in)
	if err != nil {
		cause, local, err := c.failed(ctx, callCtx, err, "check batch")
		if err != nil {
			return nil, err
		}
		out := make([]Decision, len(reqs))
		for i := range out {
			if out[i], err = c.decideAlone(&reqs[i], cause, local); err != nil {
				return nil, fmt.Errorf("check %d: %w", i, err)
			}
		}
		return out, nil
	}
	if len(resp.GetResponses()) != len(reqs) {
		return nil, fmt.Errorf("client: check batch: %d responses for %d checks", len(resp.GetResponses()), len(reqs))
	}
	out := make([]Decision, len(reqs))
	for i, r := range resp.GetResponses() {
		out[i] = c.fromNode(r)
	}
	return out, nil
}

// CheckAll decides one request charged to several subjects (an API key,
// the client address, the endpoint, the whole API), each under its own
// policy and cost, all or nothing: when one charge is denied, the node
// charges none. Decision.Policies has one entry per charge of a known
// policy, in order; DecidedBy names the one that decided. When the node
// cannot answer, the unreachable choice applies as for Check.
func (c *Client) CheckAll(ctx context.Context, charges []Charge) (Decision, error) {
	in, err := chargesProto(charges)
	if err != nil {
		return Decision{}, err
	}
	callCtx, cancel := context.WithTimeout(ctx, c.opts.timeout)
	defer cancel()
	resp, err := c.api.CheckAll(callCtx, &quotav1.CheckAllRequest{Charges: in})
	if err != nil {
		cause, _, err := c.failed(ctx, callCtx, err, "check all")
		if err != nil {
			return Decision{}, err
		}
		// The emergency buckets decide one subject at a time; a check of
		// several subjects follows the unreachable mode.
		return c.decideAlone(nil, cause, false)
	}
	return c.fromNode(resp), nil
}

// Refund gives back the cost of charges whose work did not happen, each
// on its own, never above a bucket's capacity. The node refuses the whole
// call (PermissionDenied) unless the caller holds the refund grant for
// every policy named. Any failure is an error: the unreachable choice
// does not apply to refunds. The results are in the order of charges.
func (c *Client) Refund(ctx context.Context, charges []Charge) ([]Refund, error) {
	in, err := chargesProto(charges)
	if err != nil {
		return nil, err
	}
	callCtx, cancel := context.WithTimeout(ctx, c.opts.timeout)
	defer cancel()
	resp, err := c.api.Refund(callCtx, &quotav1.RefundRequest{Charges: in})
	if err != nil {
		return nil, fmt.Errorf("client: refund: %w", err)
	}
	if len(resp.GetRefunds()) != len(charges) {
		return nil, fmt.Errorf("client: refund: %d results for %d charges", len(resp.GetRefunds()), len(charges))
	}
	out := make([]Refund, len(charges))
	for i, r := range resp.GetRefunds() {
		out[i] = Refund{Policy: r.GetPolicy(), Refunded: r.GetRefunded(), Limit: r.GetLimit(), Remaining: r.GetRemaining(),
			ResetAfter: duration(r.GetResetAfter()), DecidedAt: instant(r.GetDecidedAt())}
	}
	return out, nil
}

// chargesProto validates charges (the bounds the node enforces that the
// client can check) and converts them.
func chargesProto(charges []Charge) ([]*quotav1.Charge, error) {
	if len(charges) == 0 || len(charges) > MaxCharges {
		return nil, fmt.Errorf("%w: %d charges, want 1 to %d", ErrInvalidRequest, len(charges), MaxCharges)
	}
	out := make([]*quotav1.Charge, len(charges))
	for i, ch := range charges {
		switch {
		case ch.Policy == "":
			return nil, fmt.Errorf("%w: charge %d: empty policy", ErrInvalidRequest, i)
		case ch.Subject == "":
			return nil, fmt.Errorf("%w: charge %d: empty subject", ErrInvalidRequest, i)
		case ch.Cost < 0:
			return nil, fmt.Errorf("%w: charge %d: cost %d is negative", ErrInvalidRequest, i, ch.Cost)
		}
		out[i] = &quotav1.Charge{Policy: ch.Policy, Subject: ch.Subject, HashSubject: ch.HashSubject, Cost: ch.Cost}
	}
	return out, nil
}

// failed sorts a call error: an error for the caller (err), or the cause
// of a decision the client makes without the node, with local true when
// the node is unreachable (Unavailable, or the client's own timeout) so
// that the emergency buckets may decide. ctx is the caller's context,
// callCtx the one with the client's timeout. A deadline is the caller's
// (an error, never a decision) when the caller's deadline is the one the
// call ran under: the node may report it before the caller's own context
// notices.
func (c *Client) failed(ctx, callCtx context.Context, callErr error, what string) (cause error, local bool, err error) {
	err = fmt.Errorf("client: %s: %w", what, callErr)
	callerDeadline := false
	if dl, ok := ctx.Deadline(); ok {
		callDl, _ := callCtx.Deadline()
		callerDeadline = !dl.After(callDl)
	}
	code := status.Code(callErr)
	if callerDeadline && code == codes.DeadlineExceeded {
		// The node (which got the deadline with the call) may report it
		// before the caller's context notices: it is the caller's.
		return nil, false, fmt.Errorf("client: %s: %w (%w)", what, context.DeadlineExceeded, callErr)
	}
	if ctx.Err() != nil || !nodeFailure(callErr) {
		return nil, false, err
	}
	local = c.local != nil && (code == codes.Unavailable || code == codes.DeadlineExceeded)
	if !local && c.opts.unreachable == UnreachableError {
		return nil, false, err
	}
	return err, local, nil
}

// decideAlone decides req without the node: by the emergency buckets when
// local is set and they can, else by the unreachable mode. cause is the
// node's failure.
func (c *Client) decideAlone(req *Request, cause error, local bool) (Decision, error) {
	var d Decision
	if local {
		var err error
		d, err = c.local.decide(req)
		switch {
		case err == nil:
			d.Cause = cause
			c.m.count(&d)
			return d, nil
		case !errors.Is(err, errNoLocal):
			return Decision{}, err
		}
		cause = fmt.Errorf("%w (%w)", cause, err)
	}
	switch c.opts.unreachable {
	case UnreachableOpen:
		d = Decision{Allowed: true, Degraded: DegradedClientOpen, Cause: cause}
	case UnreachableClosed:
		d = Decision{Allowed: false, Degraded: DegradedClientClosed, RetryAfter: c.opts.retryAfter, Cause: cause}
	default:
		return Decision{}, cause
	}
	c.m.count(&d)
	return d, nil
}

// nodeFailure reports whether a gRPC error means the node could not
// answer (unreachable, overloaded, the client's timeout, an internal
// failure), as opposed to a request the node refused. The caller checks
// first that its own context is still live, so a deadline here is the
// client's timeout.
func nodeFailure(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Internal, codes.Unknown, codes.Aborted, codes.ResourceExhausted:
		return true
	}
	return false
}

func (r *Request) validate() error {
	if r.Subject == "" {
		return fmt.Errorf("%w: empty subject", ErrInvalidRequest)
	}
	if len(r.Policies) == 0 || len(r.Policies) > MaxPolicies {
		return fmt.Errorf("%w: %d policies, want 1 to %d", ErrInvalidRequest, len(r.Policies), MaxPolicies)
	}
	for i, p := range r.Policies {
		if p == "" {
			return fmt.Errorf("%w: policy %d is empty", ErrInvalidRequest, i)
		}
	}
	if r.Cost < 0 {
		return fmt.Errorf("%w: cost %d is negative", ErrInvalidRequest, r.Cost)
	}
	if len(r.IdempotencyKey) > MaxIdempotencyKey {
		return fmt.Errorf("%w: idempotency key of %d bytes, at most %d", ErrInvalidRequest, len(r.IdempotencyKey), MaxIdempotencyKey)
	}
	return nil
}

func (r *Request) proto() *quotav1.CheckRequest {
	return &quotav1.CheckRequest{
		Subject:        r.Subject,
		HashSubject:    r.HashSubject,
		Policies:       r.Policies,
		Cost:           r.Cost,
		IdempotencyKey: r.IdempotencyKey,
		Peek:           r.Peek,
	}
}

// fromNode converts the node's answer and tells the emergency buckets the
// shares it reports.
func (c *Client) fromNode(r *quotav1.CheckResponse) Decision {
	d := fromProto(r)
	if c.local != nil {
		c.local.learn(d.Policies)
	}
	return d
}

func fromProto(r *quotav1.CheckResponse) Decision {
	d := Decision{
		Allowed:    r.GetAllowed(),
		DecidedBy:  r.GetDecidedBy(),
		Limit:      r.GetLimit(),
		Remaining:  r.GetRemaining(),
		RetryAfter: duration(r.GetRetryAfter()),
		ResetAfter: duration(r.GetResetAfter()),
		Degraded:   r.GetDegraded(),
		Replayed:   r.GetReplayed(),
		DecidedAt:  instant(r.GetDecidedAt()),
	}
	if ps := r.GetPolicies(); len(ps) > 0 {
		d.Policies = make([]PolicyDecision, len(ps))
		for i, p := range ps {
			d.Policies[i] = PolicyDecision{
				Policy:     p.GetPolicy(),
				Allowed:    p.GetAllowed(),
				Limit:      p.GetLimit(),
				Remaining:  p.GetRemaining(),
				RetryAfter: duration(p.GetRetryAfter()),
				ResetAfter: duration(p.GetResetAfter()),
				Share:      p.GetShare(),
				DecidedAt:  instant(p.GetDecidedAt()),
			}
		}
	}
	return d
}

// instant converts a protobuf timestamp, treating nil and invalid values
// as the zero time.
func instant(t *timestamppb.Timestamp) time.Time {
	if t == nil || t.CheckValid() != nil {
		return time.Time{}
	}
	return t.AsTime()
}

// duration converts a protobuf duration, treating nil, invalid and
// negative values as zero.
func duration(d *durationpb.Duration) time.Duration {
	if d == nil || d.CheckValid() != nil {
		return 0
	}
	if v := d.AsDuration(); v > 0 {
		return v
	}
	return 0
}
