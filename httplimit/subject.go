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

// ClientIP charges requests to the client address (see ClientAddr), with
// IPv6 addresses grouped by their /64 prefix, since one host usually owns
// a whole /64. The address is hashed by the node.
func ClientIP(trusted []netip.Prefix) SubjectFunc {
	return func(r *http.Request) (Subject, error) {
		a, err := ClientAddr(r, trusted)
		if err != nil {
			return Subject{}, err
		}
		if a.Is6() {
			p, _ := a.Prefix(64)
			return Subject{Value: p.String(), Hash: true}, nil
		}
		return Subject{Value: a.String(), Hash: true}, nil
	}
}

// ClientAddr returns the address of the client that sent r. It starts from
// the connection's peer (r.RemoteAddr). Only when the peer is inside one
// of the trusted proxy prefixes does it read the forwarding headers
// (Forwarded if present, else X-Forwarded-For), walking the hops from the
// right and skipping trusted proxies: the first untrusted hop is the
// client. If every hop is trusted, the leftmost one is. A hop that is not
// an address (or more than MaxForwardedHops) is an error.
func ClientAddr(r *http.Request, trusted []netip.Prefix) (netip.Addr, error) {
	peer, err := parseHost(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%w: peer address %q: %w", ErrNoSubject, r.RemoteAddr, err)
	}
	if !isTrusted(peer, trusted) {
		return peer, nil
	}
	hops, err := forwardedHops(r.Header)
	if err != nil {
		return netip.Addr{}, err
	}
	client := peer
	for i := len(hops) - 1; i >= 0; i-- {
		a, err := parseHost(hops[i])
		if err != nil {
			return netip.Addr{}, fmt.Errorf("%w: forwarded hop %q: %w", ErrNoSubject, hops[i], err)
		}
		client = a
		if !isTrusted(a, trusted) {
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

// forwardedHops lists the forwarding chain, client first.
func forwardedHops(h http.Header) ([]string, error) {
	var hops []string
	if fw := h.Values("Forwarded"); len(fw) > 0 {
		for _, line := range fw {
			for _, elem := range splitQuoted(line, ',') {
				for _, pair := range splitQuoted(elem, ';') {
					k, v, ok := strings.Cut(strings.TrimSpace(pair), "=")
					if ok && strings.EqualFold(strings.TrimSpace(k), "for") {
						hops = append(hops, strings.Trim(strings.TrimSpace(v), `"`))
					}
				}
				if len(hops) > MaxForwardedHops {
					return nil, fmt.Errorf("%w: more than %d forwarding hops", ErrNoSubject, MaxForwardedHops)
				}
			}
		}
		return hops, nil
	}
	for _, line := range h.Values("X-Forwarded-For") {
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

// splitQuoted splits s at sep outside double quotes.
func splitQuoted(s string, sep byte) []string {
	var out []string
	quoted, start := false, 0
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '\\' && quoted:
			i++
		case s[i] == '"':
			quoted = !quoted
		case s[i] == sep && !quoted:
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
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
