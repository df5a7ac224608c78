package regional

import (
	"context"
	"errors"
	"fmt"

	"github.com/hashicorp/go-hclog"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quotacoord/quota/internal/grants"
)

// callerPerms identifies the caller of ctx and returns what it may do
// (Config.Grants). A bearer token the node does not know is an error
// (Unauthenticated) with the perms of an anonymous caller: the own API
// refuses it, the Envoy API goes on with those perms (an error there
// would admit the request).
func (n *Node) callerPerms(ctx context.Context) (grants.Caller, grants.Perms, error) {
	if !n.cfg.Grants.Identified() && n.cfg.Tokens == nil {
		// Every caller has the default grants: nobody to tell apart.
		return grants.Caller{}, n.anonymous, nil
	}
	c, err := grants.Identify(ctx, n.cfg.Tokens)
	p := n.cfg.Grants.For(c.IDs)
	if errors.Is(err, grants.ErrUnknownToken) {
		return c, p, status.Error(codes.Unauthenticated, "unknown bearer token")
	}
	return c, p, err
}

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
