package httplimit

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"

	"github.com/quotacoord/quota/bucket"
)

// Subject is who a request is charged to.
type Subject struct {
	// Value is the subject: a valid bucket subject, or any string up to
	// MaxRawSubject bytes when Hash is set.
	Value string
	// Hash asks the node to hash Value; untrusted identities (raw keys,
	// addresses) are always hashed.
	Hash bool
}

// SubjectFunc derives the subject of a request.
type SubjectFunc func(*http.Request) (Subject, error)

// ErrNoSubject reports a request that does not identify its caller.
var ErrNoSubject = errors.New("httplimit: no subject in request")

// MaxRawSubject is the longest value a hashed subject may have.
const MaxRawSubject = 1024

// MaxForwardedHops is the most forwarding hops ClientIP walks.
const MaxForwardedHops = 32

// Header charges requests to the value of header name (an API key, a
// session id), hashed by the node so the raw value is never stored.
func Header(name string) SubjectFunc {
	return func(r *http.Request) (Subject, error) {
		v := strings.TrimSpace(r.Header.Get(name))
		if v == "" {
			return Subject{}, fmt.Errorf("%w: header %s is empty", ErrNoSubject, name)
		}
		if len(v) > MaxRawSubject {
			return Subject{}, fmt.Errorf("%w: header %s is longer than %d bytes", ErrNoSubject, name, MaxRawSubject)
		}
		return Subject{Value: v, Hash: true}, nil
	}
}

// Tenant charges requests to a tenant id carried in header name (set by an
// authenticating proxy), which must already be a valid subject
// ([A-Za-z0-9_-]{1,96}); it is used as it is, so it stays readable in
// operator tools.
func Tenant(name string) SubjectFunc {
	return func(r *http.Request) (Subject, error) {
		v := strings.TrimSpace(r.Header.Get(name))
		if err := bucket.ValidateSubject(v); err != nil {
			return Subject{}, fmt.Errorf("%w: header %s: %w", ErrNoSubject, name, err)
		}
		return Subject{Value: v}, nil
	}
}

// Proxies describes the forwarding proxies in front of the server, so
// that ClientAddr believes exactly what they wrote and nothing a client
// sent. The zero value trusts no proxy: the client is the connection's
// peer.
type Proxies struct {
	// Trusted are the address prefixes of the proxies (load balancers,
	// ingress, Envoy) that connect to this server.
	Trusted []netip.Prefix
	// Header names the one forwarding header those proxies set: either
	// "Forwarded" (RFC 7239, its for= parameters) or a comma-separated
	// address list such as "X-Forwarded-For". Required when Trusted is
	// not empty. Every other forwarding header is ignored: a client may
	// send any header, and a proxy that appends only X-Forwarded-For
	// passes a client's own Forwarded header through unchanged.
	Header string
}

// forwarded is the canonical name of the RFC 7239 header.
const forwarded = "Forwarded"

// Validate reports a Proxies that ClientAddr cannot use: trusted proxies
// without a header, or a header name that is not an HTTP token.
func (p Proxies) Validate() error {
	if len(p.Trusted) == 0 {
		return nil
	}
	if p.Header == "" {
		return fmt.Errorf("%w: trusted proxies without the forwarding header they set (for example X-Forwarded-For or Forwarded)", ErrInvalidConfig)
	}
	if !isToken(p.Header) || len(p.Header) > maxHeaderName {
		return fmt.Errorf("%w: forwarding header %q is not a header name", ErrInvalidConfig, p.Header)
	}
	for _, t := range p.Trusted {
		if !t.IsValid() {
			return fmt.Errorf("%w: trusted proxy prefix %v is not valid", ErrInvalidConfig, t)
		}
	}
	return nil
}

// ClientIP charges requests to the client address (see ClientAddr), with
// IPv6 addresses grouped by their /64 prefix, since one host usually owns
// a whole /64. The address is hashed by the node. It returns an error
// wrapping ErrInvalidConfig when p is not valid.
func ClientIP(p Proxies) (SubjectFunc, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return func(r *http.Request) (Subject, error) {
		a, err := ClientAddr(r, p)
		if err != nil {
			return Subject{}, err
		}
		g, err := addrGroup(a, DefaultIPv6PrefixBits)
		if err != nil {
			return Subject{}, err
		}
		return Subject{Value: g, Hash: true}, nil
	}, nil
}

// ClientAddr returns the address of the client that sent r. It starts from
// the connection's peer (r.RemoteAddr). Only when the peer is one of the
// trusted proxies does it read a forwarding header, and then only
// p.Header, walking its hops from the right and skipping trusted proxies:
// the rightmost untrusted hop is the client (every hop left of it may have
// been written by the client). If every hop is trusted, the leftmost one
// is; with no such header the peer is. A hop that is not an address, or
// more than MaxForwardedHops, is an error wrapping ErrNoSubject; an
// invalid p is an error wrapping ErrInvalidConfig.
func ClientAddr(r *http.Request, p Proxies) (netip.Addr, error) {
	if err := p.Validate(); err != nil {
		return netip.Addr{}, err
	}
	peer, err := parseHost(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%w: peer address %q: %w", ErrNoSubject, r.RemoteAddr, err)
	}
	if !isTrusted(peer, p.Trusted) {
		return peer, nil
	}
	hops, err := forwardedHops(r.Header, p.Header)
	if err != nil {
		return netip.Addr{}, err
	}
	client := peer
	for i := len(hops) - 1; i >= 0; i-- {
		a, err := parseHost(hops[i])
		if err != nil {
			return netip.Addr{}, fmt.Errorf("%w: %s hop %q: %w", ErrNoSubject, p.Header, hops[i], err)
		}
		client = a
		if !isTrusted(a, p.Trusted) {
			break
		}
	}
	return client, nil
}

func isTrusted(a netip.Addr, trusted []netip.Prefix) bool {
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// forwardedHops lists the hops of header name in h, client first: the
// for= parameters of a Forwarded header, or the entries of an address
// list (X-Forwarded-For and the like). Its lines are read in order.
func forwardedHops(h http.Header, name string) ([]string, error) {
	var hops []string
	if strings.EqualFold(name, forwarded) {
		for _, line := range h.Values(forwarded) {
			elems, ok := splitQuoted(line, ',')
			if !ok {
				return nil, fmt.Errorf("%w: Forwarded has an unterminated quoted string", ErrNoSubject)
			}
			for _, elem := range elems {
				pairs, _ := splitQuoted(elem, ';')
				for _, pair := range pairs {
					if pair = strings.TrimSpace(pair); pair == "" {
						continue
					}
					k, v, ok := strings.Cut(pair, "=")
					if !ok {
						return nil, fmt.Errorf("%w: Forwarded parameter %q is not name=value", ErrNoSubject, pair)
					}
					if strings.EqualFold(strings.TrimSpace(k), "for") {
						hops = append(hops, unquote(strings.TrimSpace(v)))
					}
				}
				if len(hops) > MaxForwardedHops {
					return nil, fmt.Errorf("%w: more than %d forwarding hops", ErrNoSubject, MaxForwardedHops)
				}
			}
		}
		return hops, nil
	}
	for _, line := range h.Values(name) {
		for _, hop := range strings.Split(line, ",") {
			if hop = strings.TrimSpace(hop); hop != "" {
				hops = append(hops, hop)
			}
			if len(hops) > MaxForwardedHops {
				return nil, fmt.Errorf("%w: more than %d forwarding hops", ErrNoSubject, MaxForwardedHops)
			}
		}
	}
	return hops, nil
}

// maxHeaderName bounds Proxies.Header.
const maxHeaderName = 128

// isToken reports whether s is an RFC 9110 token, as header names are.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// unquote reads an RFC 7230 quoted-string ("..." with \-escapes), or
// returns a token as it is.
func unquote(v string) string {
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
		return v
	}
	var b strings.Builder
	for i := 1; i < len(v)-1; i++ {
		if v[i] == '\\' && i+1 < len(v)-1 {
			i++
		}
		b.WriteByte(v[i])
	}
	return b.String()
}

// splitQuoted splits s at sep outside double quotes; ok is false when a
// quoted string is not terminated (so that a client cannot swallow the
// hops a proxy appends after its text).
func splitQuoted(s string, sep byte) (parts []string, ok bool) {
	quoted, start := false, 0
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '\\' && quoted:
			i++
		case s[i] == '"':
			quoted = !quoted
		case s[i] == sep && !quoted:
			parts = append(parts, s[start:i])
			start = i + 1
		}
	}
	return append(parts, s[start:]), !quoted
}

// parseHost reads "1.2.3.4", "1.2.3.4:80", "::1", "[::1]:80" or "[::1]".
func parseHost(s string) (netip.Addr, error) {
	s = strings.TrimSpace(s)
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap().WithZone(""), nil
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap().WithZone(""), nil
	}
	if host, _, err := net.SplitHostPort(s); err == nil {
		if a, err := netip.ParseAddr(host); err == nil {
			return a.Unmap().WithZone(""), nil
		}
	}
	if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		if a, err := netip.ParseAddr(s[1 : len(s)-1]); err == nil {
			return a.Unmap().WithZone(""), nil
		}
	}
	return netip.Addr{}, errors.New("not an IP address")
}

// Endpoint charges requests to the route pattern mux would serve them
// with ("GET /exports/{id}"), so that each endpoint has one budget
// whatever its path parameters; requests mux has no route for share the
// subject "unmatched". The number of subjects is bounded by the patterns
// registered. The pattern is hashed by the node.
func Endpoint(mux *http.ServeMux) SubjectFunc {
	return func(r *http.Request) (Subject, error) {
		_, pattern := mux.Handler(r)
		if pattern == "" {
			pattern = "unmatched"
		}
		return Subject{Value: pattern, Hash: true}, nil
	}
}

// Fixed charges every request to one subject, such as "all" for a limit
// on the whole API. It returns an error wrapping ErrInvalidConfig when
// name is not a valid subject.
func Fixed(name string) (SubjectFunc, error) {
	if err := bucket.ValidateSubject(name); err != nil {
		return nil, fmt.Errorf("%w: fixed subject: %w", ErrInvalidConfig, err)
	}
	return func(*http.Request) (Subject, error) { return Subject{Value: name}, nil }, nil
}
