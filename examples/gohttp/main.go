// Command gohttp is a small net/http service whose API is rate limited by
// a regional node: every request to /exports asks the node (through package
// client) whether the caller may spend one token of a policy, and package
// httplimit answers the HTTP contract for callers: 200 with the IETF
// RateLimit and RateLimit-Policy header fields when admitted, 429 with
// Retry-After (whole seconds, rounded up), the same fields and a JSON body
// with code RATE_LIMITED when denied.
//
// Try it against the demo (go run ./cmd/demo -serve prints a node's gRPC
// address) or any regional node:
//
//	go run ./examples/gohttp -node 127.0.0.1:8081 -policy exports -window 1m
//	curl -i -H 'X-Tenant: acme' http://127.0.0.1:8000/exports
//
// The caller is identified by -subject: "tenant" reads a ready-made tenant
// id from the header named by -header (default X-Tenant), "apikey" hashes
// that header's value on the node, "ip" uses the client address (believing
// the one header named by -forwarded-header, and only from
// -trusted-proxies), and "identity" takes the first of X-Tenant, X-Api-Key,
// X-User (set by an authenticating proxy; e-mail addresses case folded)
// and the client address (IPv6 by /64), normalized and hashed
// (httplimit.Identify).
//
// Plans: -tiers free=exports-free,pro=exports-pro with -tier-header X-Plan
// checks each request against its plan's policy (-policy for requests
// without a plan). Dimensions: -ip-policy, -endpoint-policy and
// -global-policy charge each request also to its client address, its
// route and the whole service; the RateLimit fields then show the most
// restrictive result. They are one all-or-nothing check: a request one
// dimension refuses is charged to none.
//
//	curl -i -H 'X-Tenant: acme' -H 'X-Plan: pro' http://127.0.0.1:8000/exports
//
// Surviving the node: with -emergency-clients N, -emergency-capacity and
// -emergency-refill (the policy's limits as its policy file states them),
// a node that stops answering leaves each of the N copies of the service
// its own bucket of the region's share / N of -policy (package client's
// Emergency); -unreachable still decides what that bucket cannot. GET
// /metrics counts those decisions (quota_client_local_decisions_total).
//
//	go run ./examples/gohttp -node 127.0.0.1:8081 -unreachable closed \
//	    -emergency-clients 3 -emergency-capacity 50 -emergency-refill 16.667
//
// A body that is not JSON is refused with 400 and code INVALID_BODY after
// the limiter admitted it; with -refund-invalid the service gives its
// charges back (Limiter.Refund), so a malformed request costs no quota.
// The node must grant this service refund (-grants, docs/security.md).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/client"
	"github.com/quotacoord/quota/httplimit"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "gohttp:", err)
		os.Exit(1)
	}
}

// options are the parsed flags.
type options struct {
	listen, node, policy, subject, header, unreachable string
	window, timeout                                    time.Duration
	proxies                                            httplimit.Proxies
	// tiers maps a plan to its policy; tierHeader names the plan header.
	tiers      map[string]string
	tierHeader string
	// ipPolicy, endpointPolicy and globalPolicy name the further
	// dimensions' policies ("" leaves a dimension out).
	ipPolicy, endpointPolicy, globalPolicy string
	// emergency keeps -policy's emergency bucket while the node is
	// unreachable (Clients 0: none).
	emergency client.Emergency
	// refundInvalid gives a malformed request's charges back.
	refundInvalid bool
}

func parse(args []string, out io.Writer) (options, error) {
	var o options
	var trusted string
	fs := flag.NewFlagSet("gohttp", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&o.listen, "listen", "127.0.0.1:8000", "HTTP listen address")
	fs.StringVar(&o.node, "node", "127.0.0.1:8081", "gRPC address of a regional node")
	fs.StringVar(&o.policy, "policy", "exports", "policy that limits /exports")
	fs.DurationVar(&o.window, "window", 0, "the policy's window shown as w in RateLimit-Policy (for a token bucket: capacity / refill); 0 leaves it out")
	fs.StringVar(&o.subject, "subject", "tenant", "who is charged: tenant (header value as is), apikey (header value hashed), ip, or identity (X-Tenant, then X-Api-Key, then X-User, then the address)")
	fs.StringVar(&o.header, "header", "X-Tenant", "header holding the tenant id or API key")
	fs.StringVar(&trusted, "trusted-proxies", "", "comma-separated proxy prefixes whose -forwarded-header is believed (with -subject ip)")
	fs.StringVar(&o.proxies.Header, "forwarded-header", "X-Forwarded-For", "the one forwarding header the trusted proxies set: X-Forwarded-For, Forwarded or another address list; any other is ignored")
	fs.StringVar(&o.unreachable, "unreachable", "error", "when the node cannot answer: error (503), open (admit) or closed (deny)")
	fs.DurationVar(&o.timeout, "timeout", 250*time.Millisecond, "deadline of one check")
	var capacity int64
	var refill float64
	fs.IntVar(&o.emergency.Clients, "emergency-clients", 0, "copies of this service sharing the region: while the node is unreachable, each decides -policy from its own bucket of the region's share / N (0: no emergency bucket)")
	fs.Int64Var(&capacity, "emergency-capacity", 0, "with -emergency-clients: -policy's capacity, as its policy file states it")
	fs.Float64Var(&refill, "emergency-refill", 0, "with -emergency-clients: -policy's refill per second, as its policy file states it")
	var tiers string
	fs.StringVar(&tiers, "tiers", "", "plan=policy pairs, comma-separated (free=exports-free,pro=exports-pro): each plan's policy; -policy serves requests without a plan")
	fs.StringVar(&o.tierHeader, "tier-header", "X-Plan", "with -tiers: the header holding the caller's plan (set by an authenticating proxy)")
	fs.StringVar(&o.ipPolicy, "ip-policy", "", "also charge the client address to this policy")
	fs.StringVar(&o.endpointPolicy, "endpoint-policy", "", "also charge the route (one budget per endpoint) to this policy")
	fs.StringVar(&o.globalPolicy, "global-policy", "", "also charge the whole service (subject \"all\") to this policy")
	fs.BoolVar(&o.refundInvalid, "refund-invalid", false, "give back what a request with a malformed body was charged (the node must grant refund)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	for _, pair := range strings.Split(tiers, ",") {
		if pair = strings.TrimSpace(pair); pair == "" {
			continue
		}
		plan, pol, ok := strings.Cut(pair, "=")
		if !ok || plan == "" || pol == "" {
			return o, fmt.Errorf("-tiers: %q is not plan=policy", pair)
		}
		if o.tiers == nil {
			o.tiers = map[string]string{}
		}
		o.tiers[plan] = pol
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for _, p := range strings.Split(trusted, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		pfx, err := netip.ParsePrefix(p)
		if err != nil {
			return o, fmt.Errorf("-trusted-proxies: %w", err)
		}
		o.proxies.Trusted = append(o.proxies.Trusted, pfx)
	}
	if o.emergency.Clients != 0 {
		o.emergency.Policies = []client.EmergencyPolicy{{Name: o.policy, Limits: bucket.Limits{Capacity: capacity, RefillPerSecond: refill}}}
	} else if capacity != 0 || refill != 0 {
		return o, errors.New("-emergency-capacity and -emergency-refill need -emergency-clients")
	}
	if o.window < 0 || o.timeout <= 0 {
		return o, fmt.Errorf("-window %v must not be negative and -timeout %v must be positive", o.window, o.timeout)
	}
	return o, nil
}

// handler builds the service: /exports behind the limiter, /healthz and
// /metrics (the client's, from g) open.
func handler(o options, c httplimit.Checker, g prometheus.Gatherer) (http.Handler, error) {
	var subject httplimit.SubjectFunc
	var err error
	switch o.subject {
	case "tenant":
		subject = httplimit.Tenant(o.header)
	case "apikey":
		subject = httplimit.Header(o.header)
	case "ip":
		if subject, err = httplimit.ClientIP(o.proxies); err != nil {
			return nil, fmt.Errorf("-forwarded-header: %w", err)
		}
	case "identity":
		subject, err = httplimit.Identify(httplimit.Identity{
			TenantHeader: "X-Tenant", APIKeyHeader: "X-Api-Key",
			User:    func(r *http.Request) string { return r.Header.Get("X-User") },
			Proxies: o.proxies,
		})
		if err != nil {
			return nil, fmt.Errorf("-subject identity: %w", err)
		}
	default:
		return nil, fmt.Errorf("-subject %q, want tenant, apikey, ip or identity", o.subject)
	}
	// The routes, known before the limiter so that the endpoint
	// dimension charges each route pattern.
	// limiter is set below, before the server takes requests.
	var limiter *httplimit.Limiter
	routes := http.NewServeMux()
	routes.HandleFunc("POST /exports", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20)); err != nil || (len(body) > 0 && !json.Valid(body)) {
			// Refused after the limiter admitted it: the export never
			// ran, so with -refund-invalid it costs no quota.
			refunded := false
			if o.refundInvalid {
				refunded = limiter.Refund(r) == nil
			}
			w.WriteHeader(http.StatusBadRequest)
			_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{
				"code": "INVALID_BODY", "message": "the body is not JSON", "refunded": refunded}})
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]string{"status": "export queued"})
	})
	cfg := httplimit.Config{
		Checker:  c,
		Policies: []httplimit.Policy{{Name: o.policy, Window: o.window}},
		Subject:  subject,
	}
	if len(o.tiers) > 0 {
		cfg.Tiers = map[string][]httplimit.Policy{}
		for plan, pol := range o.tiers {
			cfg.Tiers[plan] = []httplimit.Policy{{Name: pol, Window: o.window}}
		}
		header := o.tierHeader
		cfg.Tier = func(r *http.Request) (string, error) { return strings.TrimSpace(r.Header.Get(header)), nil }
	}
	if o.ipPolicy != "" {
		ip, err := httplimit.ClientIP(o.proxies)
		if err != nil {
			return nil, fmt.Errorf("-ip-policy: %w", err)
		}
		cfg.Dimensions = append(cfg.Dimensions, httplimit.Dimension{Name: "ip", Subject: ip, Policies: []httplimit.Policy{{Name: o.ipPolicy}}})
	}
	if o.endpointPolicy != "" {
		cfg.Dimensions = append(cfg.Dimensions, httplimit.Dimension{Name: "endpoint", Subject: httplimit.Endpoint(routes),
			Policies: []httplimit.Policy{{Name: o.endpointPolicy}}})
	}
	if o.globalPolicy != "" {
		all, err := httplimit.Fixed("all")
		if err != nil {
			return nil, err
		}
		cfg.Dimensions = append(cfg.Dimensions, httplimit.Dimension{Name: "global", Subject: all, Policies: []httplimit.Policy{{Name: o.globalPolicy}}})
	}
	limiter, err = httplimit.New(cfg)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /exports", limiter.Wrap(routes))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	return mux, nil
}

// run serves until ctx is done, printing the address it listens on.
func run(ctx context.Context, args []string, stdout io.Writer) error {
	o, err := parse(args, stdout)
	if err != nil {
		return err
	}
	var opts []client.Option
	switch o.unreachable {
	case "error":
	case "open":
		opts = append(opts, client.WithUnreachable(client.UnreachableOpen))
	case "closed":
		opts = append(opts, client.WithUnreachable(client.UnreachableClosed))
	default:
		return fmt.Errorf("-unreachable %q, want error, open or closed", o.unreachable)
	}
	reg := prometheus.NewRegistry()
	opts = append(opts, client.WithTimeout(o.timeout), client.WithRegisterer(reg))
	if o.emergency.Clients != 0 {
		opts = append(opts, client.WithEmergency(o.emergency))
	}
	c, err := client.New(o.node, opts...)
	if err != nil {
		return fmt.Errorf("client for node %s: %w", o.node, err)
	}
	defer c.Close()
	h, err := handler(o, c, reg)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	fmt.Fprintf(stdout, "gohttp: listening on http://%s (POST /exports limited by policy %q on node %s)\n", ln.Addr(), o.policy, o.node)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	<-errc
	return nil
}
