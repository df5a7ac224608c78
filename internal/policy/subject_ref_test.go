package policy

import (
	"strconv"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/quotacoord/quota/bucket"
)

// refLookup and refSubject are the string-building implementation Match
// used before its allocation-free rewrite, kept as the oracle of
// TestMatchSubjectsAgreeWithReference.
func (d *envoyDomain) refLookup(entries []Entry) (p *Policy, shared map[int]string) {
	node := &d.root
	for i, e := range entries {
		kv := e.Key + "_" + e.Value
		next := node.children[kv]
		if next == nil {
			for _, w := range node.wildcards {
				if strings.HasPrefix(kv, w[:len(w)-1]) {
					next = node.children[w]
					if next.shareThreshold {
						if shared == nil {
							shared = map[int]string{}
						}
						shared[i] = next.pattern
					}
					break
				}
			}
		}
		if next == nil {
			next = node.children[e.Key]
		}
		if next == nil {
			return nil, nil
		}
		if i == len(entries)-1 {
			return next.policy, shared
		}
		if len(next.children) == 0 {
			return nil, nil
		}
		node = next
	}
	return nil, nil
}

func refSubject(p *Policy, entries []Entry, shared map[int]string, subj *EnvoySubjects) string {
	readable := len(entries) == len(p.Envoy.Keys)
	n := 0
	for i, e := range entries {
		v := e.Value
		if w, ok := shared[i]; ok {
			v = w
		}
		if !readable {
			break
		}
		if e.Key != p.Envoy.Keys[i] || !readableValue(v) || !subj.plain(e.Key) {
			readable = false
		}
		n += len(v) + 1
	}
	if readable && n-1 <= bucket.MaxSubjectLen && !strings.HasPrefix(entries[0].Value, "h-") {
		var b strings.Builder
		for i, e := range entries {
			if i > 0 {
				b.WriteByte('_')
			}
			if w, ok := shared[i]; ok {
				b.WriteString(w)
			} else {
				b.WriteString(e.Value)
			}
		}
		return b.String()
	}
	var b strings.Builder
	b.WriteString(p.Name)
	b.WriteByte(0)
	for i, e := range entries {
		v := e.Value
		if w, ok := shared[i]; ok {
			v = w + "\x00shared"
		}
		b.WriteString(strconv.Itoa(len(e.Key)))
		b.WriteByte(':')
		b.WriteString(e.Key)
		b.WriteString(strconv.Itoa(len(v)))
		b.WriteByte(':')
		b.WriteString(v)
	}
	return bucket.HashSubject(subj.Salt, b.String())
}

// TestMatchSubjectsAgreeWithReference: for random descriptors (nested,
// wildcard, share_threshold, readable and not, short and past the stack
// buffers) Match picks the same rule and derives the same subject as the
// reference implementation, and BucketSubject carries that subject.
func TestMatchSubjectsAgreeWithReference(t *testing.T) {
	s, err := Parse("v.yaml", []byte(vectorsYAML))
	if err != nil {
		t.Fatal(err)
	}
	dom := s.domains["v"]
	rapid.Check(t, func(t *rapid.T) {
		value := rapid.OneOf(
			rapid.SampledFrom([]string{"acme", "x-1", "/api/export", "/api/export/9", "bulk", "bulk-7", "bot", "bot1", "h-abc", ""}),
			rapid.StringMatching(`[a-z0-9/_.-]{0,12}`),
			rapid.Map(rapid.IntRange(1, MaxEntryBytes), func(n int) string { return strings.Repeat("v", n) }),
		)
		key := rapid.SampledFrom([]string{"tenant", "path", "api_key", "shared", "other"})
		n := rapid.IntRange(1, 3).Draw(t, "entries")
		d := make([]Entry, n)
		for i := range d {
			d[i] = Entry{Key: key.Draw(t, "key"), Value: value.Draw(t, "value")}
		}
		subj := EnvoySubjects{
			Salt:      rapid.SampledFrom([]string{"", "pepper", strings.Repeat("s", 600)}).Draw(t, "salt"),
			PlainKeys: rapid.SliceOfDistinct(key, func(k string) string { return k }).Draw(t, "plain"),
		}
		m, err := s.Match("v", [][]Entry{d}, subj)
		if err != nil {
			t.Fatal(err)
		}
		p, shared := dom.refLookup(d)
		if m[0].Policy != p {
			t.Fatalf("policy %v, reference %v", m[0].Policy, p)
		}
		want := ""
		if p != nil && !p.Unlimited {
			want = refSubject(p, d, shared, &subj)
		}
		if m[0].Subject != want || m[0].BucketSubject.String() != want {
			t.Fatalf("subject %q (bucket %q), reference %q", m[0].Subject, m[0].BucketSubject, want)
		}
	})
}
