package coordinator

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Role is what a credential may do.
type Role int

const (
	// RoleNone may do nothing.
	RoleNone Role = iota
	// RoleRead may call the read methods.
	RoleRead
	// RoleWrite may call every method.
	RoleWrite
)

// ErrTokenFile reports a token file that cannot be used.
var ErrTokenFile = errors.New("coordinator: bad token file")

// maxTokens bounds the lines of a token file.
const maxTokens = 1000

// readMethods are the operator methods a read credential may call.
var readMethods = map[string]bool{
	"ListPolicies": true, "ShowPolicy": true, "ShowAllocation": true, "DryRun": true, "ListAudit": true,
}

type token struct {
	sum  [32]byte
	role Role
}

// authorizer checks credentials. It is immutable after construction.
type authorizer struct {
	tokens     []token
	writeNames map[string]bool
	log        hclog.Logger
}

// LoadTokenFile reads path, creating it with one random write token (mode
// 0600) when it does not exist. It returns the tokens by role.
func LoadTokenFile(path string) (map[string]Role, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		b := make([]byte, 32)
		if _, err := rand.Read(b); err != nil {
			return nil, fmt.Errorf("coordinator: generate token: %w", err)
		}
		data = []byte("# operator tokens: one ROLE:TOKEN per line, ROLE read or write\nwrite:" + hex.EncodeToString(b) + "\n")
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return nil, fmt.Errorf("coordinator: create token file: %w", err)
		}
		if _, err := f.Write(data); err != nil {
			f.Close()
			return nil, fmt.Errorf("coordinator: write token file: %w", err)
		}
		if err := f.Close(); err != nil {
			return nil, fmt.Errorf("coordinator: write token file: %w", err)
		}
	} else if err != nil {
		return nil, fmt.Errorf("coordinator: read token file: %w", err)
	}
	out := map[string]Role{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if len(out) >= maxTokens {
			return nil, fmt.Errorf("%w: %s: more than %d tokens", ErrTokenFile, path, maxTokens)
		}
		role, tok, ok := strings.Cut(line, ":")
		if !ok || len(tok) < 16 || strings.ContainsAny(tok, " \t") {
			return nil, fmt.Errorf("%w: %s line %d: want read:TOKEN or write:TOKEN with a token of at least 16 characters", ErrTokenFile, path, n)
		}
		switch role {
		case "read":
			out[tok] = RoleRead
		case "write":
			out[tok] = RoleWrite
		default:
			return nil, fmt.Errorf("%w: %s line %d: role %q is not read or write", ErrTokenFile, path, n, role)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: %s holds no token", ErrTokenFile, path)
	}
	return out, nil
}

// ClientToken picks the token a client should send from a token file's
// content: the first write token, else the first read token, else the
// first non-comment line as a bare token.
func ClientToken(data []byte) (string, error) {
	var read, bare string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		role, tok, ok := strings.Cut(line, ":")
		switch {
		case ok && role == "write":
			return tok, nil
		case ok && role == "read" && read == "":
			read = tok
		case !ok && bare == "":
			bare = line
		}
	}
	if read != "" {
		return read, nil
	}
	if bare != "" {
		return bare, nil
	}
	return "", fmt.Errorf("%w: no token", ErrTokenFile)
}

func newAuthorizer(tokens map[string]Role, writeNames []string, log hclog.Logger) *authorizer {
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
func (a *authorizer) identify(ctx context.Context) (Role, string) {
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		for _, v := range md.Get("authorization") {
			tok, ok := strings.CutPrefix(v, "Bearer ")
			if !ok {
				continue
			}
			sum := sha256.Sum256([]byte(strings.TrimSpace(tok)))
			for _, t := range a.tokens {
				if subtle.ConstantTimeCompare(sum[:], t.sum[:]) == 1 {
					name := "read"
					if t.role == RoleWrite {
						name = "write"
					}
					return t.role, fmt.Sprintf("token:%s:%s", name, hex.EncodeToString(sum[:4]))
				}
			}
			return RoleNone, ""
		}
	}
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.VerifiedChains) > 0 && len(ti.State.VerifiedChains[0]) > 0 {
			cn := ti.State.VerifiedChains[0][0].Subject.CommonName
			if a.writeNames["*"] || a.writeNames[cn] {
				return RoleWrite, "cert:" + cn
			}
			return RoleRead, "cert:" + cn
		}
	}
	return RoleNone, ""
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
	if role == RoleNone {
		a.log.Warn("refused unauthenticated operator call", "method", fullMethod, "peer", addr)
		return nil, status.Error(codes.Unauthenticated, "operator API: send a bearer token (quotactl --token-file) or a client certificate")
	}
	method := fullMethod[strings.LastIndex(fullMethod, "/")+1:]
	if role == RoleRead && !readMethods[method] {
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
