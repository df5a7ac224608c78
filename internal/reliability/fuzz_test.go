package reliability

import (
	"errors"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/httplimit"
)

// FuzzSubjectNormalization: any header value and remote address becomes
// either an error wrapping httplimit.ErrNoSubject or a subject that,
// hashed when it must be, makes a valid bucket key that contains no byte
// of a raw value that needed hashing. The forwarded text is tried as
// X-Forwarded-For and as Forwarded, each read only by the ClientIP whose
// proxies set that header: the other header never changes its answer,
// and from a peer that is not a trusted proxy neither header does. Header
// and Tenant refuse exactly the values their rules refuse.
func FuzzSubjectNormalization(f *testing.F) {
	f.Add("sk_live_abc", "tenant-1", "203.0.113.7:443", "198.51.100.1, 10.0.0.1")
	f.Add("", "bad tenant", "[::1]:80", "")
	f.Add(strings.Repeat("k", 2000), strings.Repeat("t", 97), "not-an-addr", "1.2.3.4,,,")
	f.Add("a\x00b", "ok_-", "10.0.0.1:1", "::ffff:1.2.3.4")
	f.Add("k", "t", "10.0.0.1:1", `for=192.0.2.1;proto=https, for="[2001:db8::1]:80"`)
	f.Add("k", "t", "10.0.0.1:1", `for="192.0.2.1`)
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("::1/128")}
	xffIP, err := httplimit.ClientIP(httplimit.Proxies{Trusted: trusted, Header: "X-Forwarded-For"})
	if err != nil {
		f.Fatal(err)
	}
	fwdIP, err := httplimit.ClientIP(httplimit.Proxies{Trusted: trusted, Header: "Forwarded"})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, apiKey, tenant, remote, forwarded string) {
		r, err := http.NewRequest("GET", "http://x/", nil)
		if err != nil {
			t.Fatal(err)
		}
		r.RemoteAddr = remote
		r.Header.Set("X-Api-Key", apiKey)
		r.Header.Set("X-Tenant", tenant)
		r.Header.Set("X-Forwarded-For", forwarded)
		r.Header.Set("Forwarded", forwarded)
		for _, only := range []struct {
			fn     httplimit.SubjectFunc
			other  string
			header string
		}{{xffIP, "Forwarded", "X-Forwarded-For"}, {fwdIP, "X-Forwarded-For", "Forwarded"}} {
			with, errWith := only.fn(r)
			alone := r.Clone(r.Context())
			alone.Header.Del(only.other)
			without, errWithout := only.fn(alone)
			if with != without || (errWith == nil) != (errWithout == nil) {
				t.Fatalf("ClientIP reading %s: %v, %v with %s; %v, %v without it", only.header, with, errWith, only.other, without, errWithout)
			}
		}
		// A peer that is not a trusted proxy is the client, whatever
		// forwarding headers it sends.
		if peer, err := netip.ParseAddrPort(remote); err == nil && !trustedPeer(trusted, peer.Addr()) {
			bare := r.Clone(r.Context())
			bare.Header.Del("X-Forwarded-For")
			bare.Header.Del("Forwarded")
			want, werr := xffIP(bare)
			for name, fn := range map[string]httplimit.SubjectFunc{"X-Forwarded-For": xffIP, "Forwarded": fwdIP} {
				if got, err := fn(r); got != want || (err == nil) != (werr == nil) {
					t.Fatalf("untrusted peer %s: ClientIP reading %s chose %v, %v; the peer alone is %v, %v", remote, name, got, err, want, werr)
				}
			}
		}
		// When each subject function must refuse, by its own rule.
		apiKeyBad := strings.TrimSpace(r.Header.Get("X-Api-Key")) == "" || len(strings.TrimSpace(r.Header.Get("X-Api-Key"))) > httplimit.MaxRawSubject
		tenantBad := bucket.ValidateSubject(strings.TrimSpace(r.Header.Get("X-Tenant"))) != nil
		for name, tc := range map[string]struct {
			fn httplimit.SubjectFunc
			// mustFail: the input is bad for fn; nil when the rule is not
			// known here (addresses), then only the error's kind is checked.
			mustFail *bool
		}{
			"header": {httplimit.Header("X-Api-Key"), &apiKeyBad}, "tenant": {httplimit.Tenant("X-Tenant"), &tenantBad},
			"ip (X-Forwarded-For)": {xffIP, nil}, "ip (Forwarded)": {fwdIP, nil},
		} {
			s, err := tc.fn(r)
			if tc.mustFail != nil && (err != nil) != *tc.mustFail {
				t.Fatalf("%s: error %v, want an error %v", name, err, *tc.mustFail)
			}
			if err != nil {
				if !errors.Is(err, httplimit.ErrNoSubject) {
					t.Fatalf("%s: error %v does not wrap ErrNoSubject", name, err)
				}
				continue
			}
			subject := s.Value
			if s.Hash {
				subject = bucket.HashSubject("salt", s.Value)
			}
			k, err := bucket.NewKey("pol", 1, subject)
			if err != nil {
				t.Fatalf("%s: subject %q (hash %v) makes no key: %v", name, s.Value, s.Hash, err)
			}
			if s.Hash && len(s.Value) >= 8 && strings.Contains(k.String(), s.Value) {
				t.Fatalf("%s: raw value %q in key %s", name, s.Value, k)
			}
		}
	})
}

// trustedPeer reports whether a is in one of the trusted prefixes.
func trustedPeer(trusted []netip.Prefix, a netip.Addr) bool {
	for _, p := range trusted {
		if p.Contains(a.Unmap()) || p.Contains(a) {
			return true
		}
	}
	return false
}
