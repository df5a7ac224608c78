package policy

import (
	"strings"
	"testing"
)

// vectorsYAML exercises every way envoySubject builds a subject: plain
// values, hashed values, nested entries, wildcards with and without
// share_threshold.
const vectorsYAML = `domain: v
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 600}
    descriptors:
      - key: path
        value: /api/export*
        rate_limit: {unit: hour, requests_per_unit: 100}
      - key: path
        value: bulk*
        share_threshold: true
        rate_limit: {unit: hour, requests_per_unit: 10}
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 300}
  - key: api_key
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: shared
    value: "bot*"
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 3}
`

// TestEnvoySubjectVectors pins the subjects Match derives, bit for bit:
// they name Redis buckets, so a change would reset every bucket of a
// deployment. The hashed values are HMAC-SHA256 keyed with the salt
// (bucket.HashSubject).
func TestEnvoySubjectVectors(t *testing.T) {
	s, err := Parse("v.yaml", []byte(vectorsYAML))
	if err != nil {
		t.Fatal(err)
	}
	plain := EnvoySubjects{Salt: "pepper", PlainKeys: []string{"tenant", "path", "shared"}}
	hashed := EnvoySubjects{Salt: "pepper"}
	long := strings.Repeat("v", MaxEntryBytes)
	tests := []struct {
		name string
		subj EnvoySubjects
		d    []Entry
		want string
	}{
		{"plain one", plain, e("tenant", "acme"), "acme"},
		{"plain nested", plain, e("tenant", "acme", "path", "x-1"), "acme_x-1"},
		{"plain but unreadable value", plain, e("tenant", "acme", "path", "/api/v1"), "h-GhywUoJu_b_KnREByKdbJSYG31LdmDPy"},
		{"plain wildcard", plain, e("tenant", "acme", "path", "/api/export/9"), "h-mAfAWi0-RoFwA2OyAyO7sA2B4w78NC5G"},
		{"plain shared wildcard", plain, e("tenant", "acme", "path", "bulk-7"), "h-7BmZk7dipYFToCzMEo68_Lwi4uNiTS6Y"},
		{"plain shared top", plain, e("shared", "bot1"), "h-u8-riNMrQUJyv_G0azWESenRfnm3gait"},
		{"plain looks hashed", plain, e("tenant", "h-abc"), "h-QRlzhVLZ2z9bZ68czOSMfG7sXcMWUJ6z"},
		{"plain too long", plain, e("tenant", strings.Repeat("a", 97)), "h-sRUVA2rcjqa2yAJM4DpM2FiqyH4AQ2sZ"},
		{"hashed one", hashed, e("tenant", "acme"), "h-QM-wT6egkj3BrLdtZ7AhT1w9Iglt7EDA"},
		{"hashed nested", hashed, e("tenant", "acme", "path", "/api/v1"), "h-GhywUoJu_b_KnREByKdbJSYG31LdmDPy"},
		{"hashed shared", hashed, e("tenant", "acme", "path", "bulkier"), "h-7BmZk7dipYFToCzMEo68_Lwi4uNiTS6Y"},
		{"hashed empty value", hashed, e("api_key", ""), "h-QGJ-_t_4AUgSzAje826VdFiy_QWbM023"},
		{"hashed long value", hashed, e("api_key", long), "h-JoVokLjst_gCHDoOQNlH5H3Ktw8UR192"},
		{"hashed long nested", hashed, e("tenant", long, "path", long), "h-bqdXeXBJqcDYY_dw-nZwl5XmiRt6sZU_"},
		{"no salt", EnvoySubjects{}, e("api_key", "k-123"), "h-K8NOVFholVko88_llvq5Py9uipvTet9J"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := s.Match("v", [][]Entry{tt.d}, tt.subj)
			if err != nil {
				t.Fatal(err)
			}
			if got := m[0].Subject; got != tt.want {
				t.Errorf("subject %q, want %q", got, tt.want)
			}
		})
	}
}

// BenchmarkMatch10 matches a request of 10 one-entry descriptors, each
// with its own rule and a hashed subject, as scripts/bench-regional.sh
// sends them.
func BenchmarkMatch10(b *testing.B) {
	var y strings.Builder
	y.WriteString("domain: bench\ndescriptors:\n")
	descs := make([][]Entry, 10)
	for i := range descs {
		k := "tenant" + string(rune('0'+i))
		y.WriteString("  - key: " + k + "\n    rate_limit: {unit: second, requests_per_unit: 100}\n")
		descs[i] = e(k, "s4711")
	}
	s, err := Parse("bench.yaml", []byte(y.String()))
	if err != nil {
		b.Fatal(err)
	}
	subj := EnvoySubjects{Salt: "salt"}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Match("bench", descs, subj); err != nil {
			b.Fatal(err)
		}
	}
}
