package policy

import (
	"os"
	"testing"
)

// FuzzParse feeds arbitrary bytes to Parse in both formats: it must never
// panic, and every policy it accepts must validate, have a valid name and
// be found by Get; matching any descriptor against the result must not
// panic either.
func FuzzParse(f *testing.F) {
	for _, path := range []string{"../../examples/policies/policies.yaml", "../../examples/policies/envoy-ratelimit.yaml"} {
		data, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Parse("fuzz.yaml", data)
		if err != nil {
			if s != nil {
				t.Fatal("set returned with an error")
			}
			return
		}
		for _, p := range s.Policies() {
			if err := p.Validate(); err != nil {
				t.Fatalf("accepted policy %q does not validate: %v", p.Name, err)
			}
			if q, ok := s.Get(p.Name); !ok || q != p {
				t.Fatalf("Get(%q) does not return the policy", p.Name)
			}
			p.KeyVersion()
		}
		for _, d := range s.Domains() {
			if _, err := s.MatchDescriptors(d, [][]Entry{{{Key: "key", Value: "value"}}, {{Key: "a", Value: "b"}, {Key: "c", Value: ""}}}); err != nil {
				t.Fatal(err)
			}
		}
	})
}
