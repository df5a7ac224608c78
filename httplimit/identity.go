package httplimit

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/netip"
	"strings"

	"github.com/quotacoord/quota/bucket"
)

// IdentityKind names the source a subject was derived from.
type IdentityKind string

// The identity kinds, in the order Identify tries them.
const (
	KindTenant IdentityKind = "tenant"
	KindAPIKey IdentityKind = "api_key"
	KindUser   IdentityKind = "user"
	KindIP     IdentityKind = "ip"
)

// DefaultIPv6PrefixBits is the IPv6 prefix an address is grouped by when
// Identity.IPv6PrefixBits is zero: one host usually owns a whole /64.
const DefaultIPv6PrefixBits = 64

// Identity says where a request's caller is named, for Identify. The
// subject is taken from the first source that is present, in the
// documented order: tenant, then API key, then user, then client address.
// A source left empty (no header name, nil User) is skipped.
type Identity struct {
	// TenantHeader holds a tenant id set by an authenticating proxy; it
	// must be a valid subject ([A-Za-z0-9_-]{1,96}) and is used as it is,
	// so it stays readable in operator tools.
	TenantHeader string
	// APIKeyHeader holds a raw API key.
	APIKeyHeader string
	// User returns the authenticated user (an e-mail address or an id,
	// usually a verified token's claim), or "" when there is none.
	User func(*http.Request) string
	// Proxies says which forwarding header to believe for the client
	// address (see ClientAddr).
	Proxies Proxies
	// NoIP leaves the client address out: a request naming no tenant, key
	// or user is then an error wrapping ErrNoSubject.
	NoIP bool
	// IPv6PrefixBits groups IPv6 clients by this prefix length (1 to
	// 128); zero means DefaultIPv6PrefixBits. IPv4 addresses are used
	// whole.
	IPv6PrefixBits int
}

// Validate reports an Identity that Identify cannot use.
func (id Identity) Validate() error {
	if err := id.Proxies.Validate(); err != nil {
		return err
	}
	for _, h := range []string{id.TenantHeader, id.APIKeyHeader} {
		if h != "" && (!isToken(h) || len(h) > maxHeaderName) {
			return fmt.Errorf("%w: %q is not a header name", ErrInvalidConfig, h)
		}
	}
	if id.IPv6PrefixBits < 0 || id.IPv6PrefixBits > 128 {
		return fmt.Errorf("%w: IPv6 prefix of %d bits, want 1 to 128", ErrInvalidConfig, id.IPv6PrefixBits)
	}
	if id.NoIP && id.TenantHeader == "" && id.APIKeyHeader == "" && id.User == nil {
		return fmt.Errorf("%w: no identity source: name a tenant or API key header, a User function, or allow the client address", ErrInvalidConfig)
	}
	return nil
}

// Identify returns the SubjectFunc that applies id's precedence. It
// returns an error wrapping ErrInvalidConfig when id is not valid.
func Identify(id Identity) (SubjectFunc, error) {
	if err := id.Validate(); err != nil {
		return nil, err
	}
	return func(r *http.Request) (Subject, error) {
		kind, raw, err := id.source(r)
		if err != nil {
			return Subject{}, err
		}
		return IdentitySubject(kind, raw, id.IPv6PrefixBits)
	}, nil
}

// source picks the first identity r carries, by precedence.
func (id Identity) source(r *http.Request) (IdentityKind, string, error) {
	if id.TenantHeader != "" {
		if v := strings.TrimSpace(r.Header.Get(id.TenantHeader)); v != "" {
			return KindTenant, v, nil
		}
	}
	if id.APIKeyHeader != "" {
		if v := strings.TrimSpace(r.Header.Get(id.APIKeyHeader)); v != "" {
			return KindAPIKey, v, nil
		}
	}
	if id.User != nil {
		if v := strings.TrimSpace(id.User(r)); v != "" {
			return KindUser, v, nil
		}
	}
	if id.NoIP {
		return "", "", fmt.Errorf("%w: no tenant, API key or user", ErrNoSubject)
	}
	a, err := ClientAddr(r, id.Proxies)
	if err != nil {
		return "", "", err
	}
	return KindIP, a.String(), nil
}

// IdentitySubject normalizes raw, an identity of the given kind, and
// returns its subject:
//
//   - a tenant is used as it is and must be a valid subject;
//   - an API key is used byte for byte (keys are case sensitive);
//   - a user that is an e-mail address (contains "@") is case folded, so
//     Alice@Example.COM and alice@example.com share one budget; other
//     user ids are kept as they are;
//   - an IP address is parsed (IPv4-mapped IPv6 becomes IPv4) and an IPv6
//     address is replaced by its prefix of ipv6Bits (0 means
//     DefaultIPv6PrefixBits).
//
// Every kind but tenant is then hashed here, SHA-256 over the kind and the
// normalized value, so the raw key, address or e-mail never leaves the
// process, and Hash is set so that the node also applies its keyed hash
// (a bare SHA-256 of an IPv4 address is easy to reverse). The kind is part
// of the hash: a user named like an API key is a different subject.
func IdentitySubject(kind IdentityKind, raw string, ipv6Bits int) (Subject, error) {
	raw = strings.TrimSpace(raw)
	if raw == "" {
		return Subject{}, fmt.Errorf("%w: empty %s", ErrNoSubject, kind)
	}
	if len(raw) > MaxRawSubject {
		return Subject{}, fmt.Errorf("%w: %s longer than %d bytes", ErrNoSubject, kind, MaxRawSubject)
	}
	var norm string
	switch kind {
	case KindTenant:
		if err := bucket.ValidateSubject(raw); err != nil {
			return Subject{}, fmt.Errorf("%w: tenant: %w", ErrNoSubject, err)
		}
		return Subject{Value: raw}, nil
	case KindAPIKey:
		norm = raw
	case KindUser:
		norm = raw
		if strings.Contains(raw, "@") {
			norm = strings.ToLower(raw)
		}
	case KindIP:
		a, err := netip.ParseAddr(raw)
		if err != nil {
			return Subject{}, fmt.Errorf("%w: client address %q: %w", ErrNoSubject, raw, err)
		}
		norm, err = addrGroup(a.Unmap().WithZone(""), ipv6Bits)
		if err != nil {
			return Subject{}, err
		}
	default:
		return Subject{}, fmt.Errorf("%w: unknown identity kind %q", ErrInvalidConfig, kind)
	}
	sum := sha256.Sum256([]byte(string(kind) + "\x00" + norm))
	return Subject{Value: string(kind) + "_" + hex.EncodeToString(sum[:]), Hash: true}, nil
}

// addrGroup is a's text, or its IPv6 prefix of bits (0: the default).
func addrGroup(a netip.Addr, bits int) (string, error) {
	if !a.Is6() {
		return a.String(), nil
	}
	if bits == 0 {
		bits = DefaultIPv6PrefixBits
	}
	p, err := a.Prefix(bits)
	if err != nil {
		return "", fmt.Errorf("%w: IPv6 prefix of %d bits: %w", ErrInvalidConfig, bits, err)
	}
	return p.String(), nil
}
