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
	// Checker decides; required.
	Checker Checker
	// Policies are checked together, all or nothing; 1 to 16.
	Policies []Policy
	// Subject derives the subject from a request; required.
	Subject SubjectFunc
	// Cost returns the request's cost; nil means 1.
	Cost func(*http.Request) int64
	// OnError answers when the subject cannot be derived or the checker
	// fails. Nil: 400 with code INVALID_SUBJECT for subject errors, 503
	// with code RATE_LIMIT_UNAVAILABLE for checker errors.
	OnError func(w http.ResponseWriter, r *http.Request, err error)
}

// Limiter is the middleware.
type Limiter struct {
	cfg     Config
	names   []string
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
	if len(cfg.Policies) == 0 || len(cfg.Policies) > client.MaxPolicies {
		return nil, fmt.Errorf("%w: %d policies, want 1 to %d", ErrInvalidConfig, len(cfg.Policies), client.MaxPolicies)
	}
	l := &Limiter{cfg: cfg, windows: map[string]time.Duration{}}
	for i, p := range cfg.Policies {
		if p.Name == "" || p.Window < 0 {
			return nil, fmt.Errorf("%w: policy %d: empty name or negative window", ErrInvalidConfig, i)
		}
		if _, dup := l.windows[p.Name]; dup {
			return nil, fmt.Errorf("%w: policy %q listed twice", ErrInvalidConfig, p.Name)
		}
		l.names = append(l.names, p.Name)
		l.windows[p.Name] = p.Window
	}
	return l, nil
}

// Wrap returns next behind the limiter.
func (l *Limiter) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		subj, err := l.cfg.Subject(r)
		if err != nil {
			l.fail(w, r, fmt.Errorf("%w: %w", errSubject, err))
			return
		}
		var cost int64 = 1
		if l.cfg.Cost != nil {
			cost = l.cfg.Cost(r)
		}
		d, err := l.cfg.Checker.Check(r.Context(), client.Request{
			Subject:     subj.Value,
			HashSubject: subj.Hash,
			Policies:    l.names,
			Cost:        cost,
		})
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

var errSubject = errors.New("httplimit: no subject")

func (l *Limiter) fail(w http.ResponseWriter, r *http.Request, err error) {
	if l.cfg.OnError != nil {
		l.cfg.OnError(w, r, err)
		return
	}
	if errors.Is(err, errSubject) {
		writeError(w, http.StatusBadRequest, "INVALID_SUBJECT", "the request does not identify who is calling", nil)
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
