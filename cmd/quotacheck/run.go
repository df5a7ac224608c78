package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/quotacoord/quota/client"
)

var errUsage = errors.New("usage")

// maxChecks bounds -n.
const maxChecks = 1_000_000

type config struct {
	addr        string
	subject     string
	policies    []string
	cost        int64
	n           int
	asJSON      bool
	hash        bool
	peek        bool
	interval    time.Duration
	timeout     time.Duration
	unreachable string
	useTLS      bool
	caFile      string
	idemKey     string
	tokenFile   string
	refund      bool
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	var policies string
	fs := flag.NewFlagSet("quotacheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.addr, "addr", "127.0.0.1:8081", "regional node gRPC `address`")
	fs.StringVar(&c.subject, "subject", "", "subject to check, [A-Za-z0-9_-]{1,96} (any string with -hash)")
	fs.StringVar(&policies, "policy", "", "policy `names`, comma separated, checked all or nothing")
	fs.Int64Var(&c.cost, "cost", 1, "cost of each check")
	fs.IntVar(&c.n, "n", 1, "number of checks")
	fs.BoolVar(&c.asJSON, "json", false, "print one JSON object per check")
	fs.BoolVar(&c.hash, "hash", false, "ask the node to hash the subject (raw API keys, IPs)")
	fs.BoolVar(&c.peek, "peek", false, "report the buckets without charging them")
	fs.DurationVar(&c.interval, "interval", 0, "pause between checks")
	fs.DurationVar(&c.timeout, "timeout", time.Second, "timeout of each check")
	fs.StringVar(&c.unreachable, "unreachable", "error", "when the node cannot answer: error, open or closed")
	fs.BoolVar(&c.useTLS, "tls", false, "connect with TLS (system roots unless -ca)")
	fs.StringVar(&c.caFile, "ca", "", "PEM `file` of CA certificates to trust (implies -tls)")
	fs.StringVar(&c.idemKey, "idempotency-key", "", "idempotency key sent with every check")
	fs.StringVar(&c.tokenFile, "token-file", "", "`file` holding a bearer token the node knows (its -auth-tokens), sent over TLS or to loopback only; -peek needs a caller granted peek")
	fs.BoolVar(&c.refund, "refund", false, "give -cost back to the subject under each policy instead of checking (the node must grant the caller refund, see -token-file)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args())
	}
	for _, p := range strings.Split(policies, ",") {
		if p = strings.TrimSpace(p); p != "" {
			c.policies = append(c.policies, p)
		}
	}
	switch {
	case c.subject == "":
		return c, fmt.Errorf("%w: -subject is required", errUsage)
	case len(c.policies) == 0:
		return c, fmt.Errorf("%w: -policy is required", errUsage)
	case c.n < 1 || c.n > maxChecks:
		return c, fmt.Errorf("%w: -n must be 1 to %d", errUsage, maxChecks)
	case c.cost < 0:
		return c, fmt.Errorf("%w: -cost must not be negative", errUsage)
	case c.interval < 0:
		return c, fmt.Errorf("%w: -interval must not be negative", errUsage)
	case c.refund && (c.peek || c.idemKey != ""):
		return c, fmt.Errorf("%w: -refund goes without -peek and -idempotency-key", errUsage)
	}
	return c, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	opts := []client.Option{client.WithTimeout(cfg.timeout), client.WithUnreachable(client.Unreachable(cfg.unreachable))}
	if cfg.useTLS || cfg.caFile != "" {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if cfg.caFile != "" {
			pem, err := os.ReadFile(cfg.caFile)
			if err != nil {
				return fmt.Errorf("read -ca: %w", err)
			}
			tc.RootCAs = x509.NewCertPool()
			if !tc.RootCAs.AppendCertsFromPEM(pem) {
				return fmt.Errorf("-ca %s: no PEM certificates", cfg.caFile)
			}
		}
		opts = append(opts, client.WithTLS(tc))
	}
	if cfg.tokenFile != "" {
		tok, err := os.ReadFile(cfg.tokenFile)
		if err != nil {
			return fmt.Errorf("read -token-file: %w", err)
		}
		if len(bytes.TrimSpace(tok)) == 0 {
			return fmt.Errorf("%w: -token-file %s is empty", errUsage, cfg.tokenFile)
		}
		opts = append(opts, client.WithBearerToken(string(bytes.TrimSpace(tok))))
	}
	c, err := client.New(cfg.addr, opts...)
	if err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	defer c.Close()

	enc := json.NewEncoder(stdout)
	var allowed, denied int
	for i := 1; i <= cfg.n; i++ {
		if i > 1 && cfg.interval > 0 {
			t := time.NewTimer(cfg.interval)
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
			}
		}
		if cfg.refund {
			if err := refund(ctx, c, cfg, i, enc, stdout); err != nil {
				return err
			}
			continue
		}
		d, err := c.Check(ctx, client.Request{
			Subject: cfg.subject, HashSubject: cfg.hash, Policies: cfg.policies,
			Cost: cfg.cost, Peek: cfg.peek, IdempotencyKey: cfg.idemKey,
		})
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("check %d against %s: %w", i, cfg.addr, err)
		}
		if d.Allowed {
			allowed++
		} else {
			denied++
		}
		if cfg.asJSON {
			if err := enc.Encode(toJSON(i, d)); err != nil {
				return fmt.Errorf("write: %w", err)
			}
			continue
		}
		if _, err := fmt.Fprintln(stdout, human(i, d)); err != nil {
			return fmt.Errorf("write: %w", err)
		}
	}
	if !cfg.asJSON && !cfg.refund {
		if _, err := fmt.Fprintf(stdout, "%d allowed, %d denied of %d checks\n", allowed, denied, cfg.n); err != nil {
			return fmt.Errorf("write: %w", err)
		}
	}
	return nil
}

// refund sends refund i: cfg.cost back to the subject under each policy,
// printed one line (or JSON object) per policy.
func refund(ctx context.Context, c *client.Client, cfg config, i int, enc *json.Encoder, stdout io.Writer) error {
	charges := make([]client.Charge, len(cfg.policies))
	for k, p := range cfg.policies {
		charges[k] = client.Charge{Policy: p, Subject: cfg.subject, HashSubject: cfg.hash, Cost: cfg.cost}
	}
	rs, err := c.Refund(ctx, charges)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("refund %d against %s: %w", i, cfg.addr, err)
	}
	for _, r := range rs {
		if cfg.asJSON {
			err = enc.Encode(jsonRefund{N: i, Policy: r.Policy, Refunded: r.Refunded, Limit: r.Limit, Remaining: r.Remaining,
				ResetAfterMS: r.ResetAfter.Milliseconds(), DecidedAt: r.DecidedAt})
		} else {
			verdict := "refunded"
			if !r.Refunded {
				verdict = "NOT refunded"
			}
			_, err = fmt.Fprintf(stdout, "#%-3d %s  %s: %d of %d left\n", i, verdict, r.Policy, r.Remaining, r.Limit)
		}
		if err != nil {
			return fmt.Errorf("write: %w", err)
		}
	}
	return nil
}

type jsonRefund struct {
	N            int       `json:"n"`
	Policy       string    `json:"policy"`
	Refunded     bool      `json:"refunded"`
	Limit        int64     `json:"limit"`
	Remaining    int64     `json:"remaining"`
	ResetAfterMS int64     `json:"reset_after_ms"`
	DecidedAt    time.Time `json:"decided_at"`
}

func human(i int, d client.Decision) string {
	var b strings.Builder
	verdict := "allowed"
	if !d.Allowed {
		verdict = "DENIED "
	}
	fmt.Fprintf(&b, "#%-3d %s", i, verdict)
	if d.DecidedBy != "" {
		fmt.Fprintf(&b, "  %s: %d of %d left", d.DecidedBy, d.Remaining, d.Limit)
	}
	if !d.Allowed {
		fmt.Fprintf(&b, ", retry after %v", d.RetryAfter)
	}
	if d.ResetAfter > 0 {
		fmt.Fprintf(&b, ", full in %v", d.ResetAfter.Round(time.Millisecond))
	}
	if d.Replayed {
		b.WriteString(" (replayed)")
	}
	if d.Degraded != "" {
		fmt.Fprintf(&b, " (degraded: %s)", d.Degraded)
	}
	if d.Cause != nil {
		fmt.Fprintf(&b, " [%v]", d.Cause)
	}
	return b.String()
}

type jsonDecision struct {
	N            int            `json:"n"`
	Allowed      bool           `json:"allowed"`
	DecidedBy    string         `json:"decided_by,omitempty"`
	Limit        int64          `json:"limit"`
	Remaining    int64          `json:"remaining"`
	RetryAfterMS int64          `json:"retry_after_ms"`
	ResetAfterMS int64          `json:"reset_after_ms"`
	Degraded     string         `json:"degraded,omitempty"`
	Replayed     bool           `json:"replayed,omitempty"`
	Cause        string         `json:"cause,omitempty"`
	DecidedAt    *time.Time     `json:"decided_at,omitempty"`
	Policies     []jsonPolicyDn `json:"policies,omitempty"`
}

type jsonPolicyDn struct {
	Policy       string  `json:"policy"`
	Allowed      bool    `json:"allowed"`
	Limit        int64   `json:"limit"`
	Remaining    int64   `json:"remaining"`
	RetryAfterMS int64   `json:"retry_after_ms"`
	ResetAfterMS int64   `json:"reset_after_ms"`
	Share        float64 `json:"share"`
}

func toJSON(i int, d client.Decision) jsonDecision {
	out := jsonDecision{
		N: i, Allowed: d.Allowed, DecidedBy: d.DecidedBy, Limit: d.Limit, Remaining: d.Remaining,
		RetryAfterMS: d.RetryAfter.Milliseconds(), ResetAfterMS: d.ResetAfter.Milliseconds(),
		Degraded: d.Degraded, Replayed: d.Replayed,
	}
	if d.Cause != nil {
		out.Cause = d.Cause.Error()
	}
	if !d.DecidedAt.IsZero() {
		out.DecidedAt = &d.DecidedAt
	}
	for _, p := range d.Policies {
		out.Policies = append(out.Policies, jsonPolicyDn{
			Policy: p.Policy, Allowed: p.Allowed, Limit: p.Limit, Remaining: p.Remaining,
			RetryAfterMS: p.RetryAfter.Milliseconds(), ResetAfterMS: p.ResetAfter.Milliseconds(), Share: p.Share,
		})
	}
	return out
}
