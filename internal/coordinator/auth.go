package coordinator

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/hashicorp/go-hclog"
	"github.com/quotacoord/quota/internal/operatortoken"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// readMethods are the operator methods a read credential may call.
var readMethods = map[string]bool{
	"ListPolicies": true, "ShowPolicy": true, "ShowAllocation": true, "DryRun": true, "ListAudit": true,
}

type token struct {
	sum  [32]byte
	role operatortoken.Role
}

// authorizer checks credentials. It is immutable after construction.
type authorizer struct {
	tokens     []token
	writeNames map[string]bool
	log        hclog.Logger
}

func newAuthorizer(tokens map[string]operatortoken.Role, writeNames []string, log hclog.Logger) *authorizer {
	a := &authorizer{writeNames: map[string]bool{}, log: log}
	for t, r := range tokens {
		a.tokens = append(a.tokens, token{sum: sha256.Sum256([]byte(t)), role: r})
	}
	for _, n := range writeNames {
		if n = strings.TrimSpace(n); n != "" {
			a.writeNames[n] = true
		}
	}
	return a
}

type actorKey struct{}

// actor returns who is calling, as recorded in the audit log.
func actor(ctx context.Context) string {
	if s, ok := ctx.Value(actorKey{}).(string); ok {
		return s
	}
	return "unknown"
}

// identify returns the caller's role and name.
func (a *authorizer) identify(ctx context.Context) (operatortoken.Role, string) {
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		for _, v := range md.Get("authorization") {
			tok, ok := strings.CutPrefix(v, "Bearer ")
			if !ok {
				continue
			}
			sum := sha256.Sum256([]byte(strings.TrimSpace(tok)))
			for _, t := range a.tokens {
				if subtle.ConstantTimeCompare(sum[:], t.sum[:]) == 1 {
					return t.role, fmt.Sprintf("token:%s:%s", t.role, hex.EncodeToString(sum[:4]))
				}
			}
			return operatortoken.RoleNone, ""
		}
	}
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.VerifiedChains) > 0 && len(ti.State.VerifiedChains[0]) > 0 {
			cn := ti.State.VerifiedChains[0][0].Subject.CommonName
			if a.writeNames["*"] || a.writeNames[cn] {
				return operatortoken.RoleWrite, "cert:" + cn
			}
			return operatortoken.RoleRead, "cert:" + cn
		}
	}
	return operatortoken.RoleNone, ""
}

func exempt(fullMethod string) bool {
	return strings.HasPrefix(fullMethod, "/grpc.health.v1.Health/") || strings.HasPrefix(fullMethod, "/grpc.reflection.")
}

func (a *authorizer) check(ctx context.Context, fullMethod string) (context.Context, error) {
	if exempt(fullMethod) {
		return ctx, nil
	}
	role, name := a.identify(ctx)
	addr := ""
	if p, ok := peer.FromContext(ctx); ok {
		addr = p.Addr.String()
	}
	if role == operatortoken.RoleNone {
		a.log.Warn("refused unauthenticated operator call", "method", fullMethod, "peer", addr)
		return nil, status.Error(codes.Unauthenticated, "operator API: send a bearer token (quotactl --token-file) or a client certificate")
	}
	method := fullMethod[strings.LastIndex(fullMethod, "/")+1:]
	if role == operatortoken.RoleRead && !readMethods[method] {
		a.log.Warn("refused operator write with a read credential", "method", fullMethod, "actor", name, "peer", addr)
		return nil, status.Errorf(codes.PermissionDenied, "operator API: %s needs a write credential; %s may only read", method, name)
	}
	return context.WithValue(ctx, actorKey{}, name), nil
}

func (a *authorizer) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	ctx, err := a.check(ctx, info.FullMethod)
	if err != nil {
		return nil, err
	}
	return h(ctx, req)
}

func (a *authorizer) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if _, err := a.check(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return h(srv, ss)
}
