package reliability

import (
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/httplimit"
)

// FuzzSubjectNormalization: any header value and remote address becomes
// either a clear error or a subject that, hashed when it must be, makes a
// valid bucket key that contains no byte of a raw value that needed
// hashing.
func FuzzSubjectNormalization(f *testing.F) {
	f.Add("sk_live_abc", "tenant-1", "203.0.113.7:443", "198.51.100.1, 10.0.0.1")
	f.Add("", "bad tenant", "[::1]:80", "")
	f.Add(strings.Repeat("k", 2000), strings.Repeat("t", 97), "not-an-addr", "1.2.3.4,,,")
	f.Add("a\x00b", "ok_-", "10.0.0.1:1", "::ffff:1.2.3.4")
	clientIP, err := httplimit.ClientIP(httplimit.Proxies{
		Trusted: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("::1/128")},
		Header:  "X-Forwarded-For",
	})
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
		for name, fn := range map[string]httplimit.SubjectFunc{
			"header": httplimit.Header("X-Api-Key"), "tenant": httplimit.Tenant("X-Tenant"), "ip": clientIP,
		} {
			s, err := fn(r)
			if err != nil {
				if err.Error() == "" {
					t.Fatalf("%s: empty error", name)
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
