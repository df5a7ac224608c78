package httplimit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/quotacoord/quota/client"
)

// Checker decides admission; *client.Client satisfies it.
type Checker interface {
	Check(ctx context.Context, req client.Request) (client.Decision, error)
}

// ErrInvalidConfig reports a Config New cannot use.
var ErrInvalidConfig = errors.New("httplimit: invalid config")

// Policy is one policy the middleware checks.
type Policy struct {
	// Name is the policy's name on the node.
	Name string
	// Window is the policy's time window, shown as w in RateLimit-Policy;
	// zero leaves w out. For a token bucket a natural window is the time
	// of a full refill, capacity / refill rate.
	Window time.Duration
}

// Config configures a Limiter.
type Config struct {
	// Checker decides; required. With Dimensions it must also be an
	// AllChecker (as *client.Client is).
	Checker Checker
	// Policies are checked together, all or nothing, for the subject; 1
	// to 16. With Tiers they are the policies of requests whose Tier is
	// "", and may be left empty (such requests are then refused).
	Policies []Policy
	// Subject derives the subject from a request; required.
	Subject SubjectFunc
	// Tiers maps a tier name (free, pro, enterprise) to the policies the
	// subject is checked against for requests of that tier, 1 to 16 each,
	// so one handler serves every plan. Nil: every request is checked
	// against Policies.
	Tiers map[string][]Policy
	// Tier picks a request's tier, from the request itself or from a claim
	// an authenticating middleware stored in its context; required with
	// Tiers. An error, or a name that is neither in Tiers nor "" with
	// Policies set, is answered through OnError.
	Tier func(*http.Request) (string, error)
	// Dimensions are further subjects charged for each request beside
	// Subject (the client address, the endpoint, the whole API); at most
	// MaxDimensions, and at most client.MaxCharges policies over the
	// subject's and every dimension's. The request is one all-or-nothing
	// check: admitted when every dimension admits it, and then charged to
	// every one; a refused request is charged to none. The headers show
	// the most restrictive result.
	Dimensions []Dimension
	// Cost returns the request's cost; nil means 1.
	Cost func(*http.Request) int64
	// OnError answers when the subject or tier cannot be derived or the
	// checker fails. Nil: 400 with code INVALID_SUBJECT for subject
	// errors, 400 with code INVALID_TIER for tier errors, 503 with code
	// RATE_LIMIT_UNAVAILABLE for checker errors.
	OnError func(w http.ResponseWriter, r *http.Request, err error)
}

// Dimension is one more subject a request is charged to, under its own
// policies.
type Dimension struct {
	// Name names the dimension in errors ("ip", "endpoint", "global").
	Name string
	// Subject derives the dimension's subject; see Endpoint and Fixed for
	// the endpoint and global dimensions.
	Subject SubjectFunc
	// Policies are checked for this subject, 1 to 16.
	Policies []Policy
}

// MaxDimensions bounds Config.Dimensions.
const MaxDimensions = 8

// AllChecker decides one request charged to several subjects, all or
// nothing; *client.Client satisfies it.
type AllChecker interface {
	CheckAll(ctx context.Context, charges []client.Charge) (client.Decision, error)
}

// Refunder gives charges back; *client.Client satisfies it.
type Refunder interface {
	Refund(ctx context.Context, charges []client.Charge) ([]client.Refund, error)
}

// Limiter is the middleware.
type Limiter struct {
	cfg     Config
	names   []string
	tiers   map[string][]string
	dims    [][]string
	all     AllChecker
	windows map[string]time.Duration
}

// New validates cfg and returns its Limiter.
func New(cfg Config) (*Limiter, error) {
	if cfg.Checker == nil {
		return nil, fmt.Errorf("%w: no Checker", ErrInvalidConfig)
	}
	if cfg.Subject == nil {
		return nil, fmt.Errorf("%w: no Subject function", ErrInvalidConfig)
	}
	if (cfg.Tiers == nil) != (cfg.Tier == nil) {
		return nil, fmt.Errorf("%w: Tiers and Tier go together", ErrInvalidConfig)
	}
	l := &Limiter{cfg: cfg, windows: map[string]time.Duration{}}
	var err error
	if cfg.Tiers == nil || len(cfg.Policies) > 0 {
		if l.names, err = l.policyNames("policies", cfg.Policies); err != nil {
			return nil, err
		}
	}
	if cfg.Tiers != nil {
		if len(cfg.Tiers) == 0 {
			return nil, fmt.Errorf("%w: no tiers", ErrInvalidConfig)
		}
		l.tiers = make(map[string][]string, len(cfg.Tiers))
		for tier, pols := range cfg.Tiers {
			if tier == "" {
				return nil, fmt.Errorf("%w: a tier without a name (use Policies for requests without a tier)", ErrInvalidConfig)
			}
			if l.tiers[tier], err = l.policyNames("tier "+strconv.Quote(tier), pols); err != nil {
				return nil, err
			}
		}
	}
	if len(cfg.Dimensions) > MaxDimensions {
		return nil, fmt.Errorf("%w: %d dimensions, want at most %d", ErrInvalidConfig, len(cfg.Dimensions), MaxDimensions)
	}
	if len(cfg.Dimensions) > 0 {
		a, ok := cfg.Checker.(AllChecker)
		if !ok {
			return nil, fmt.Errorf("%w: Dimensions need a Checker that is also an AllChecker", ErrInvalidConfig)
		}
		l.all = a
	}
	for i, d := range cfg.Dimensions {
		if d.Name == "" || d.Subject == nil {
			return nil, fmt.Errorf("%w: dimension %d: no name or no Subject function", ErrInvalidConfig, i)
		}
		names, err := l.policyNames("dimension "+strconv.Quote(d.Name), d.Policies)
		if err != nil {
			return nil, err
		}
		l.dims = append(l.dims, names)
	}
	if len(l.dims) > 0 {
		charges := 0
		for _, d := range l.dims {
			charges += len(d)
		}
		most := len(l.names)
		for _, names := range l.tiers {
			most = max(most, len(names))
		}
		if most+charges > client.MaxCharges {
			return nil, fmt.Errorf("%w: %d policies for the subject and %d over the dimensions, want at most %d in all", ErrInvalidConfig, most, charges, client.MaxCharges)
		}
	}
	return l, nil
}

// policyNames validates one list of policies (what names it in errors)
// and records their windows; a name may recur across lists only with one
// window.
func (l *Limiter) policyNames(what string, pols []Policy) ([]string, error) {
	if len(pols) == 0 || len(pols) > client.MaxPolicies {
		return nil, fmt.Errorf("%w: %s: %d policies, want 1 to %d", ErrInvalidConfig, what, len(pols), client.MaxPolicies)
	}
	names := make([]string, 0, len(pols))
	seen := make(map[string]bool, len(pols))
	for i, p := range pols {
		if p.Name == "" || p.Window < 0 {
			return nil, fmt.Errorf("%w: %s: policy %d: empty name or negative window", ErrInvalidConfig, what, i)
		}
		if seen[p.Name] {
			return nil, fmt.Errorf("%w: %s: policy %q listed twice", ErrInvalidConfig, what, p.Name)
		}
		seen[p.Name] = true
		if w, ok := l.windows[p.Name]; ok && w != p.Window {
			return nil, fmt.Errorf("%w: %s: policy %q has windows %v and %v", ErrInvalidConfig, what, p.Name, w, p.Window)
		}
		l.windows[p.Name] = p.Window
		names = append(names, p.Name)
	}
	return names, nil
}

// Wrap returns next behind the limiter.
func (l *Limiter) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, err := l.request(r)
		if err != nil {
			l.fail(w, r, err)
			return
		}
		var d client.Decision
		if l.all == nil {
			d, err = l.cfg.Checker.Check(r.Context(), req)
		} else {
			var charges []client.Charge
			if charges, err = l.charges(r, req); err != nil {
				l.fail(w, r, err)
				return
			}
			if d, err = l.all.CheckAll(r.Context(), charges); err == nil {
				d = MostRestrictive([]client.Decision{d})
			}
		}
		if err != nil {
			l.fail(w, r, fmt.Errorf("httplimit: check: %w", err))
			return
		}
		l.setHeaders(w.Header(), d)
		if !d.Allowed {
			Deny(w, d)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// ErrNoRefunder is Refund's error when the Checker cannot refund.
var ErrNoRefunder = errors.New("httplimit: the Checker is not a Refunder")

// Refund gives back what the limiter charged r (its subject under its
// tier's policies and every dimension's subject, at r's cost), for a
// request admitted whose work then did not happen: a handler calls it
// when it refuses the request after the limiter let it through (a
// malformed body, a failed upstream), so that such a request costs the
// caller no quota. The Checker must also be a Refunder (as
// *client.Client is; ErrNoRefunder otherwise), and the node must grant
// this service the refund action on every policy involved (a node's
// default grants do not: PermissionDenied, nothing refunded). A bucket is
// never filled above its capacity.
func (l *Limiter) Refund(r *http.Request) error {
	rf, ok := l.cfg.Checker.(Refunder)
	if !ok {
		return ErrNoRefunder
	}
	req, err := l.request(r)
	if err != nil {
		return err
	}
	charges, err := l.charges(r, req)
	if err != nil {
		return err
	}
	if _, err := rf.Refund(r.Context(), charges); err != nil {
		return fmt.Errorf("httplimit: refund: %w", err)
	}
	return nil
}

// request builds r's check: the subject under its tier's policies.
func (l *Limiter) request(r *http.Request) (client.Request, error) {
	names := l.names
	if l.tiers != nil {
		tier, err := l.cfg.Tier(r)
		if err != nil {
			return client.Request{}, fmt.Errorf("%w: %w", errTier, err)
		}
		if tier != "" {
			names = l.tiers[tier]
		}
		if names == nil {
			return client.Request{}, fmt.Errorf("%w: unknown tier %q", errTier, tier)
		}
	}
	subj, err := l.cfg.Subject(r)
	if err != nil {
		return client.Request{}, fmt.Errorf("%w: %w", errSubject, err)
	}
	var cost int64 = 1
	if l.cfg.Cost != nil {
		cost = l.cfg.Cost(r)
	}
	return client.Request{Subject: subj.Value, HashSubject: subj.Hash, Policies: names, Cost: cost}, nil
}

// charges lists the charges of r's all-or-nothing check: req's subject
// under each of its policies, then each dimension's subject under each of
// the dimension's, every one at req's cost.
func (l *Limiter) charges(r *http.Request, req client.Request) ([]client.Charge, error) {
	out := make([]client.Charge, 0, client.MaxCharges)
	for _, p := range req.Policies {
		out = append(out, client.Charge{Policy: p, Subject: req.Subject, HashSubject: req.HashSubject, Cost: req.Cost})
	}
	for i, d := range l.cfg.Dimensions {
		s, err := d.Subject(r)
		if err != nil {
			return nil, fmt.Errorf("%w: dimension %s: %w", errSubject, d.Name, err)
		}
		for _, p := range l.dims[i] {
			out = append(out, client.Charge{Policy: p, Subject: s.Value, HashSubject: s.Hash, Cost: req.Cost})
		}
	}
	return out, nil
}

// MostRestrictive folds the decisions of one request's checks (or the
// per-charge results of one CheckAll) into one: allowed only when every one is, degraded when any is, and carrying
// the single most restrictive policy result: the denial that asks to wait
// longest, or when nothing denied, the least remaining budget (the longer
// reset on a tie). A client-made denial (no policy results) counts as a
// denial with its RetryAfter.
func MostRestrictive(ds []client.Decision) client.Decision {
	out := client.Decision{Allowed: true}
	var best client.PolicyDecision
	found := false
	var clientWait time.Duration
	clientDenied := false
	for _, d := range ds {
		out.Allowed = out.Allowed && d.Allowed
		out.Replayed = out.Replayed || d.Replayed
		if out.Degraded == "" {
			out.Degraded, out.Cause = d.Degraded, d.Cause
		}
		pols := d.Policies
		if len(pols) == 0 && d.DecidedBy != "" {
			// A decision without per-policy results still names its bucket.
			pols = []client.PolicyDecision{{Policy: d.DecidedBy, Allowed: d.Allowed, Limit: d.Limit,
				Remaining: d.Remaining, RetryAfter: d.RetryAfter, ResetAfter: d.ResetAfter}}
		}
		if len(pols) == 0 && !d.Allowed {
			clientDenied, clientWait = true, max(clientWait, d.RetryAfter)
		}
		for _, p := range pols {
			if !found || moreRestrictive(p, best) {
				best, found = p, true
			}
		}
	}
	if clientDenied && (!found || best.Allowed || clientWait > best.RetryAfter) {
		out.RetryAfter = clientWait
		return out
	}
	if found {
		out.DecidedBy, out.Limit, out.Remaining = best.Policy, best.Limit, best.Remaining
		out.RetryAfter, out.ResetAfter = best.RetryAfter, best.ResetAfter
		out.Policies, out.DecidedAt = []client.PolicyDecision{best}, best.DecidedAt
	}
	return out
}

// moreRestrictive reports whether p restricts more than q: a denial over
// an admission, the longer wait between denials, the smaller remaining
// budget (then the longer reset) between admissions.
func moreRestrictive(p, q client.PolicyDecision) bool {
	switch {
	case p.Allowed != q.Allowed:
		return !p.Allowed
	case !p.Allowed:
		return p.RetryAfter > q.RetryAfter
	case p.Remaining != q.Remaining:
		return p.Remaining < q.Remaining
	default:
		return p.ResetAfter > q.ResetAfter
	}
}

var (
	errSubject = errors.New("httplimit: no subject")
	errTier    = errors.New("httplimit: no tier")
)

func (l *Limiter) fail(w http.ResponseWriter, r *http.Request, err error) {
	if l.cfg.OnError != nil {
		l.cfg.OnError(w, r, err)
		return
	}
	if errors.Is(err, errSubject) {
		writeError(w, http.StatusBadRequest, "INVALID_SUBJECT", "the request does not identify who is calling", nil)
		return
	}
	if errors.Is(err, errTier) {
		writeError(w, http.StatusBadRequest, "INVALID_TIER", "the request names no known plan", nil)
		return
	}
	writeError(w, http.StatusServiceUnavailable, "RATE_LIMIT_UNAVAILABLE", "admission control is unavailable, retry later", nil)
}

// setHeaders writes RateLimit-Policy and RateLimit for d.
func (l *Limiter) setHeaders(h http.Header, d client.Decision) {
	var pol, cur []string
	if len(d.Policies) > 0 {
		for _, p := range d.Policies {
			pol = append(pol, l.policyItem(p.Policy, p.Limit))
			cur = append(cur, limitItem(p.Policy, p.Remaining, p.ResetAfter))
		}
	} else if d.DecidedBy != "" && d.Limit > 0 {
		pol = append(pol, l.policyItem(d.DecidedBy, d.Limit))
		cur = append(cur, limitItem(d.DecidedBy, d.Remaining, d.ResetAfter))
	}
	if len(pol) == 0 {
		return // a client-made (degraded) decision knows no limits
	}
	h.Set("RateLimit-Policy", strings.Join(pol, ", "))
	h.Set("RateLimit", strings.Join(cur, ", "))
}

func (l *Limiter) policyItem(name string, limit int64) string {
	s := sfString(name) + ";q=" + strconv.FormatInt(max(limit, 0), 10)
	if w := l.windows[name]; w > 0 {
		s += ";w=" + strconv.FormatInt(ceilSeconds(w), 10)
	}
	return s
}

func limitItem(name string, remaining int64, reset time.Duration) string {
	return sfString(name) + ";r=" + strconv.FormatInt(max(remaining, 0), 10) + ";t=" + strconv.FormatInt(ceilSeconds(reset), 10)
}

// sfString encodes s as a Structured Field String (RFC 9651): quoted, with
// backslash and quote escaped; other bytes outside printable ASCII are
// replaced by "?" since sf-strings cannot hold them.
func sfString(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c > 0x7e:
			b.WriteByte('?')
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// ceilSeconds rounds d up to whole seconds; negative durations are 0.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64(math.Ceil(d.Seconds()))
}

// RetryAfterSeconds is the Retry-After value for a denial: d rounded up to
// whole seconds, at least 1.
func RetryAfterSeconds(d time.Duration) int64 { return max(ceilSeconds(d), 1) }

// Deny writes the 429 answer for a denied decision: Retry-After and the
// JSON body. RateLimit header fields, if wanted, must be set before.
func Deny(w http.ResponseWriter, d client.Decision) {
	secs := RetryAfterSeconds(d.RetryAfter)
	w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	msg := "rate limit exceeded"
	if d.DecidedBy != "" {
		msg = fmt.Sprintf("rate limit exceeded for policy %q", d.DecidedBy)
	}
	writeError(w, http.StatusTooManyRequests, "RATE_LIMITED", msg, &details{Policy: d.DecidedBy, RetryAfterSeconds: secs, Degraded: d.Degraded})
}

type details struct {
	Policy            string `json:"policy,omitempty"`
	RetryAfterSeconds int64  `json:"retry_after_seconds"`
	Degraded          string `json:"degraded,omitempty"`
}

type errorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
		*details
	} `json:"error"`
}

func writeError(w http.ResponseWriter, status int, code, msg string, d *details) {
	var body errorBody
	body.Error.Code, body.Error.Message, body.Error.details = code, msg, d
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}
