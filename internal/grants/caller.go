package grants

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"net"
	"strings"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// MinTokenLen is the shortest bearer token accepted in a tokens file.
const MinTokenLen = 16

// MaxTokens bounds the tokens of one file.
const MaxTokens = 10000

// Tokens maps bearer tokens, by their SHA-256, to caller names. A nil
// *Tokens knows no token.
type Tokens struct {
	byHash map[[sha256.Size]byte]string
}

// LoadTokens reads a tokens file: "NAME TOKEN" per line.
func LoadTokens(path string) (*Tokens, error) {
	data, err := readFile(path)
	if err != nil {
		return nil, err
	}
	return ParseTokens(path, data)
}

// ParseTokens parses a tokens file named name in errors.
func ParseTokens(name string, data []byte) (*Tokens, error) {
	t := &Tokens{byHash: make(map[[sha256.Size]byte]string)}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), MaxFileBytes)
	for line := 1; sc.Scan(); line++ {
		s := strings.TrimSpace(sc.Text())
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		fields := strings.Fields(s)
		if len(fields) != 2 {
			return nil, fmt.Errorf("%w: %s:%d: want NAME TOKEN", ErrGrants, name, line)
		}
		who, tok := fields[0], fields[1]
		if err := validIdentity("token:" + who); err != nil {
			return nil, fmt.Errorf("%w: %s:%d: %v", ErrGrants, name, line, err)
		}
		if len(tok) < MinTokenLen {
			return nil, fmt.Errorf("%w: %s:%d: token of %s has %d bytes, want at least %d", ErrGrants, name, line, who, len(tok), MinTokenLen)
		}
		h := sha256.Sum256([]byte(tok))
		if prev, ok := t.byHash[h]; ok {
			return nil, fmt.Errorf("%w: %s:%d: token of %s repeats the token of %s", ErrGrants, name, line, who, prev)
		}
		if len(t.byHash) >= MaxTokens {
			return nil, fmt.Errorf("%w: %s: more than %d tokens", ErrGrants, name, MaxTokens)
		}
		t.byHash[h] = who
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrGrants, name, err)
	}
	return t, nil
}

// name returns the caller name of token, if known.
func (t *Tokens) name(token string) (string, bool) {
	if t == nil {
		return "", false
	}
	who, ok := t.byHash[sha256.Sum256([]byte(token))]
	return who, ok
}

// Caller is who sent a request: the identities it proved and the
// address it connected from (nil when unknown).
type Caller struct {
	IDs  []string
	Addr net.Addr
}

// ErrUnknownToken reports a bearer token that is not in the tokens file.
var ErrUnknownToken = fmt.Errorf("grants: unknown bearer token")

// Identify returns the caller of a gRPC request: the URI and DNS SANs of
// a client certificate the server verified (mutual TLS), and the name of
// its bearer token in tokens. A presented token that tokens does not know
// is ErrUnknownToken, with the rest of the caller filled in.
func Identify(ctx context.Context, tokens *Tokens) (Caller, error) {
	var c Caller
	p, ok := peer.FromContext(ctx)
	if ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.VerifiedChains) > 0 && len(ti.State.VerifiedChains[0]) > 0 {
			leaf := ti.State.VerifiedChains[0][0]
			for _, u := range leaf.URIs {
				c.IDs = append(c.IDs, u.String())
			}
			for _, d := range leaf.DNSNames {
				c.IDs = append(c.IDs, "dns:"+d)
			}
		}
	}
	var err error
	if tokens != nil {
		for _, v := range metadata.ValueFromIncomingContext(ctx, "authorization") {
			tok, ok := strings.CutPrefix(v, "Bearer ")
			if !ok {
				continue
			}
			if who, ok := tokens.name(strings.TrimSpace(tok)); ok {
				c.IDs = append(c.IDs, "token:"+who)
			} else {
				err = ErrUnknownToken
			}
		}
	}
	if ok {
		c.Addr = p.Addr
	}
	return c, err
}
