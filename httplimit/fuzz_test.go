package httplimit_test

import (
	"errors"
	"net/http/httptest"
	"net/netip"
	"testing"

	"github.com/quotacoord/quota/httplimit"
)

// FuzzClientAddrForwarded drives the Forwarded parser with client-written
// header text. A trusted proxy at 10.0.0.2 appends the address it saw,
// real (untrusted), either to the client's Forwarded line or as a line of
// its own. Whatever the client wrote, ClientAddr answers real or an error
// wrapping ErrNoSubject, never another address; behind a proxy that sets
// X-Forwarded-For instead, the client's Forwarded text changes nothing.
func FuzzClientAddrForwarded(f *testing.F) {
	for _, seed := range []string{
		"", "for=192.0.2.1", `for="[2001:db8::1]:80"`, `for=192.0.2.1;proto=https, for=10.0.0.9`,
		`for="`, `for="\"`, `for=unknown`, `;;,,for=`, `for=_hidden, by=1.2.3.4`, `FOR=192.0.2.1`,
		`for="192.0.2.1, for=198.51.100.2"`, `for=10.0.0.1, for=10.0.0.2`, "for=::ffff:192.0.2.1",
	} {
		f.Add(seed, "203.0.113.9", false)
		f.Add(seed, "2001:db8:1::7", true)
	}
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	fwd := httplimit.Proxies{Trusted: trusted, Header: "Forwarded"}
	xff := httplimit.Proxies{Trusted: trusted, Header: "X-Forwarded-For"}
	f.Fuzz(func(t *testing.T, client, realText string, ownLine bool) {
		real, err := netip.ParseAddr(realText)
		if err != nil || real.Zone() != "" || real.Is4In6() || fwd.Trusted[0].Contains(real) {
			return
		}
		hop := "for=" + real.String()
		if real.Is6() {
			hop = `for="[` + real.String() + `]"`
		}
		req := httptest.NewRequest("GET", "/", nil)
		req.RemoteAddr = "10.0.0.2:443"
		switch {
		case ownLine && client != "":
			req.Header.Add("Forwarded", client)
			req.Header.Add("Forwarded", hop)
		case client != "":
			req.Header.Add("Forwarded", client+", "+hop)
		default:
			req.Header.Add("Forwarded", hop)
		}
		got, err := httplimit.ClientAddr(req, fwd)
		switch {
		case err != nil && !errors.Is(err, httplimit.ErrNoSubject):
			t.Fatalf("error %v does not wrap ErrNoSubject", err)
		case err == nil && got != real:
			t.Fatalf("Forwarded %q: client %v, want %v (the hop the proxy appended)", req.Header.Values("Forwarded"), got, real)
		}

		// Behind a proxy that sets X-Forwarded-For, no Forwarded text moves
		// the answer.
		req.Header.Set("X-Forwarded-For", real.String())
		got, err = httplimit.ClientAddr(req, xff)
		if err != nil || got != real {
			t.Fatalf("X-Forwarded-For proxy with client Forwarded %q: %v, %v; want %v", client, got, err, real)
		}
		// An untrusted peer is the client, whatever it sent.
		req.RemoteAddr = "198.51.100.1:443"
		if got, err := httplimit.ClientAddr(req, fwd); err != nil || got.String() != "198.51.100.1" {
			t.Fatalf("untrusted peer: %v, %v", got, err)
		}
	})
}
