package regional

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/hashicorp/go-hclog"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/quotacoord/quota/internal/grants"
)

// callerPerms identifies the caller of ctx and returns its key for the
// in-flight bound and what it may do (Config.Grants). A bearer token the
// node does not know is an error (Unauthenticated) with the perms of an
// anonymous caller: the own API refuses it, the Envoy API goes on with
// those perms (an error there would admit the request).
func (n *Node) callerPerms(ctx context.Context) (callerKey, grants.Perms, error) {
	a := n.access.Load()
	if !a.grants.Identified() && a.tokens == nil {
		// Every caller has the default grants: only its address matters.
		var addr net.Addr
		if p, ok := peer.FromContext(ctx); ok {
			addr = p.Addr
		}
		return keyOf(nil, addr), a.anonymous, nil
	}
	c, err := grants.Identify(ctx, a.tokens)
	k, p := keyOf(c.IDs, c.Addr), a.grants.For(c.IDs)
	if errors.Is(err, grants.ErrUnknownToken) {
		return k, p, status.Error(codes.Unauthenticated, "unknown bearer token")
	}
	return k, p, err
}

// access is one version of what callers may do: the grants, the tokens
// that identify callers, and the perms of an anonymous caller.
type access struct {
	grants    *grants.Grants
	tokens    *grants.Tokens
	anonymous grants.Perms
}

// SetGrants swaps in new grants and tokens (nil grants: grants.Default();
// nil tokens: none); requests already identified finish with the old.
func (n *Node) SetGrants(g *grants.Grants, toks *grants.Tokens) {
	if g == nil {
		g = grants.Default()
	}
	n.access.Store(&access{grants: g, tokens: toks, anonymous: g.For(nil)})
}

// admitOps takes ops bucket operations for caller k (see inflight) and
// counts them under api; false when k is at Config.CallerMaxInflight,
// counted in quota_regional_caller_limited_total. On true the caller must
// call n.inflight.release(k, ops) when its bucket calls returned.
func (n *Node) admitOps(api string, k callerKey, ops int) bool {
	if !n.inflight.acquire(k, ops) {
		n.m.callerLimited.WithLabelValues(api).Inc()
		return false
	}
	ops64 := float64(ops)
	if c, ok := n.apiOps[api]; ok {
		c.Add(ops64)
	} else {
		n.m.bucketOps.WithLabelValues(api).Add(ops64)
	}
	return true
}

// errCallerBusy is the reason given to an Envoy caller at its in-flight
// bound (the own API denies, see busyResponse).
var errCallerBusy = status.Error(codes.ResourceExhausted, "caller has too many bucket operations in flight on this node; retry later")

// forbid counts an action a caller was not granted.
func (n *Node) forbid(api string, a grants.Action) {
	n.m.forbidden.WithLabelValues(api, a.String()).Inc()
}

// loadGrants reads c.GrantsFile and c.TokensFile (nil for an empty name).
func loadGrants(c DaemonConfig, log hclog.Logger) (*grants.Grants, *grants.Tokens, error) {
	var g *grants.Grants
	var toks *grants.Tokens
	var err error
	if c.GrantsFile != "" {
		if g, err = grants.Load(c.GrantsFile); err != nil {
			return nil, nil, fmt.Errorf("regional: -grants: %w", err)
		}
		log.Info("caller grants loaded", "path", c.GrantsFile)
	}
	if c.TokensFile != "" {
		if toks, err = grants.LoadTokens(c.TokensFile); err != nil {
			return nil, nil, fmt.Errorf("regional: -auth-tokens: %w", err)
		}
		if c.TLSCert == "" {
			log.Warn("bearer tokens accepted over plaintext gRPC: anyone on the path can read and replay them; serve TLS (-tls-cert)")
		}
	}
	if c.GrantsFile != "" && c.TLSClientCA == "" && c.TokensFile == "" {
		log.Warn("-grants without -tls-client-ca or -auth-tokens: no caller can prove an identity, every caller gets the default grants")
	}
	return g, toks, nil
}
