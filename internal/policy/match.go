package policy

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/quotacoord/quota/bucket"
)

// ErrBadDescriptor reports descriptors MatchDescriptors will not look at:
// too many, too deep, empty keys or oversize strings.
var ErrBadDescriptor = errors.New("policy: invalid descriptor")

// Bounds on one Envoy request, checked by MatchDescriptors.
const (
	// MaxDescriptors is the most descriptors in one request.
	MaxDescriptors = 64
	// MaxEntries is the most entries in one descriptor.
	MaxEntries = MaxDescriptorDepth
	// MaxEntryBytes is the longest key of an entry. Values are not
	// bounded here (only by the size of the gRPC message): they come from
	// clients (header values, addresses), and a long one is hashed like
	// any other rather than refused, since Envoy admits a request whose
	// rate limit call fails.
	MaxEntryBytes = 1024
	// MaxDomainBytes is the longest domain.
	MaxDomainBytes = 256
)

// Entry is one key/value pair of an Envoy rate limit descriptor.
type Entry struct{ Key, Value string }

// DescriptorMatch is what one request descriptor matched.
type DescriptorMatch struct {
	// Policy is the matched rule; nil when no rule matched (Envoy answers
	// OK with no limit).
	Policy *Policy
	// Subject is a valid bucket subject derived from the descriptor's
	// entries (see EnvoySubjects): a salted hash of every key and value,
	// or, when every key is listed in EnvoySubjects.PlainKeys and every
	// value is [A-Za-z0-9-]+ and short, the values joined by "_". Each
	// distinct set of values gets its own bucket, as in Envoy; values
	// matched by a share_threshold wildcard count as the wildcard itself.
	// Empty when Policy is nil or Unlimited.
	Subject string
	// BucketSubject is Subject as a bucket.Subject, for
	// bucket.NewSubjectKey (which does not check it again); zero when
	// Subject is empty.
	BucketSubject bucket.Subject
	// Unlimited: the rule admits everything without a bucket.
	Unlimited bool
	// Shadow: decide and count, but always answer OK.
	Shadow bool
	// Replaced: another matched rule's replaces names this rule's
	// rate_limit name, so this descriptor is not limited (answer OK).
	Replaced bool
}

// MaxPlainKeys bounds EnvoySubjects.PlainKeys.
const MaxPlainKeys = 64

// EnvoySubjects says how descriptor values become bucket subjects.
// Descriptor values come from the requests Envoy forwards (headers, client
// addresses, API keys) and are untrusted: by default every value is hashed
// with the salt (bucket.HashSubject), so no raw value reaches a Redis key.
// The zero value hashes every value with an empty salt.
type EnvoySubjects struct {
	// Salt salts every hashed subject; every region of a deployment must
	// use the same salt (the node's -subject-salt).
	Salt string
	// PlainKeys lists the descriptor keys the operator declares not secret
	// (for example tenant or path): a descriptor whose keys are all listed
	// keeps its values readable in the subject, when they are
	// [A-Za-z0-9-]+, do not start with "h-" and fit bucket.MaxSubjectLen.
	// At most MaxPlainKeys.
	PlainKeys []string
}

// Validate reports an EnvoySubjects that Match would not accept: too many
// plain keys, or an empty or oversize one.
func (es EnvoySubjects) Validate() error {
	if len(es.PlainKeys) > MaxPlainKeys {
		return fmt.Errorf("%w: %d plain keys, at most %d", ErrBadDescriptor, len(es.PlainKeys), MaxPlainKeys)
	}
	for i, k := range es.PlainKeys {
		if k == "" || len(k) > MaxEntryBytes {
			return fmt.Errorf("%w: plain key %d must be 1 to %d bytes", ErrBadDescriptor, i, MaxEntryBytes)
		}
	}
	return nil
}

// plain reports whether key is listed as not secret.
func (es *EnvoySubjects) plain(key string) bool {
	for _, k := range es.PlainKeys {
		if k == key {
			return true
		}
	}
	return false
}

// MatchDescriptors is Match with the zero EnvoySubjects: every subject is
// a hash of the descriptor's values with an empty salt.
func (s *Set) MatchDescriptors(domain string, descriptors [][]Entry) ([]DescriptorMatch, error) {
	return s.Match(domain, descriptors, EnvoySubjects{})
}

// Match finds the rule for each descriptor of one Envoy
// request in domain, following the reference service
// (github.com/envoyproxy/ratelimit): at each level the exact "key_value"
// child wins, then the first wildcard child in file order whose prefix the
// "key_value" text starts with, then the key-only default child; a rule
// applies only when the descriptor's last entry lands on it, and a level
// without children ends the walk. An unknown domain matches nothing.
// The result has one entry per descriptor, in order; subjects follow subj.
// Bad input (see the Max constants and EnvoySubjects.Validate) is an error
// wrapping ErrBadDescriptor.
func (s *Set) Match(domain string, descriptors [][]Entry, subj EnvoySubjects) ([]DescriptorMatch, error) {
	var out []DescriptorMatch
	if len(descriptors) <= MaxDescriptors { // else MatchTo refuses the count
		out = make([]DescriptorMatch, len(descriptors))
	}
	if err := s.MatchTo(out, domain, descriptors, subj); err != nil {
		return nil, err
	}
	return out, nil
}

// MatchTo is Match writing into out, which must have one element per
// descriptor (a caller that already allocates per request keeps it there).
// Its elements are overwritten.
func (s *Set) MatchTo(out []DescriptorMatch, domain string, descriptors [][]Entry, subj EnvoySubjects) error {
	if err := subj.Validate(); err != nil {
		return err
	}
	if domain == "" || len(domain) > MaxDomainBytes {
		return fmt.Errorf("%w: domain must be 1 to %d bytes", ErrBadDescriptor, MaxDomainBytes)
	}
	if len(descriptors) == 0 || len(descriptors) > MaxDescriptors {
		return fmt.Errorf("%w: %d descriptors, want 1 to %d", ErrBadDescriptor, len(descriptors), MaxDescriptors)
	}
	for i, d := range descriptors {
		if len(d) == 0 || len(d) > MaxEntries {
			return fmt.Errorf("%w: descriptor %d has %d entries, want 1 to %d", ErrBadDescriptor, i, len(d), MaxEntries)
		}
		for j, e := range d {
			if e.Key == "" || len(e.Key) > MaxEntryBytes {
				return fmt.Errorf("%w: descriptor %d entry %d: key must be 1 to %d bytes", ErrBadDescriptor, i, j, MaxEntryBytes)
			}
		}
	}
	if len(out) != len(descriptors) {
		return fmt.Errorf("policy: MatchTo given room for %d matches of %d descriptors", len(out), len(descriptors))
	}
	clear(out)
	var dom *envoyDomain
	if s != nil {
		dom = s.domains[domain]
	}
	if dom == nil {
		return nil
	}
	var replacing map[string]bool
	var sh sharedValues
	for i, d := range descriptors {
		p := dom.lookup(d, &sh)
		if p == nil {
			continue
		}
		out[i].Policy = p
		out[i].Shadow = p.Shadow
		out[i].Unlimited = p.Unlimited
		if !p.Unlimited {
			out[i].BucketSubject = envoySubject(p, d, &sh, &subj)
			out[i].Subject = out[i].BucketSubject.String()
		}
		for _, r := range p.Envoy.Replaces {
			if replacing == nil {
				replacing = map[string]bool{}
			}
			replacing[r] = true
		}
	}
	for i := range out {
		if p := out[i].Policy; p != nil && p.Envoy.LimitName != "" && replacing[p.Envoy.LimitName] {
			out[i].Replaced = true
		}
	}
	return nil
}

// sharedValues records, for one descriptor, the entries whose value a
// share_threshold wildcard replaces in the subject: bit i of mask set means
// entry i counts as pattern[i].
type sharedValues struct {
	mask    uint32
	pattern [MaxEntries]string
}

// value returns the value entry i of e counts as in the subject.
func (sh *sharedValues) value(i int, e Entry) (v string, shared bool) {
	if sh.mask&(1<<i) != 0 {
		return sh.pattern[i], true
	}
	return e.Value, false
}

// kvStackBytes sizes the stack buffer lookup builds "key_value" in; longer
// pairs grow it on the heap.
const kvStackBytes = 128

// lookup walks the tree for one descriptor and records in sh the entries
// a share_threshold wildcard matched. It allocates nothing for pairs up to
// kvStackBytes.
func (d *envoyDomain) lookup(entries []Entry, sh *sharedValues) *Policy {
	sh.mask = 0
	node := &d.root
	var buf [kvStackBytes]byte
	for i, e := range entries {
		kv := append(append(append(buf[:0], e.Key...), '_'), e.Value...)
		next := node.children[string(kv)]
		if next == nil {
			for _, w := range node.wildcards {
				if pre := w[:len(w)-1]; len(kv) >= len(pre) && string(kv[:len(pre)]) == pre {
					next = node.children[w]
					if next.shareThreshold {
						sh.mask |= 1 << i
						sh.pattern[i] = next.pattern
					}
					break
				}
			}
		}
		if next == nil {
			next = node.children[e.Key]
		}
		if next == nil {
			return nil
		}
		if i == len(entries)-1 {
			return next.policy
		}
		if len(next.children) == 0 {
			return nil
		}
		node = next
	}
	return nil
}

// subjectStackBytes sizes the stack buffer envoySubject builds a hash
// input in; a longer input (long values) grows it on the heap.
const subjectStackBytes = 512

// envoySubject derives the bucket subject of one matched descriptor. It
// allocates only the subject for inputs up to subjectStackBytes.
func envoySubject(p *Policy, entries []Entry, sh *sharedValues, subj *EnvoySubjects) bucket.Subject {
	readable := len(entries) == len(p.Envoy.Keys)
	n := 0
	for i, e := range entries {
		if !readable {
			break
		}
		v, _ := sh.value(i, e)
		if e.Key != p.Envoy.Keys[i] || !readableValue(v) || !subj.plain(e.Key) {
			readable = false
		}
		n += len(v) + 1
	}
	if readable && n-1 <= bucket.MaxSubjectLen && !strings.HasPrefix(entries[0].Value, "h-") {
		var buf [bucket.MaxSubjectLen]byte
		b := buf[:0]
		for i, e := range entries {
			if i > 0 {
				b = append(b, '_')
			}
			v, _ := sh.value(i, e)
			b = append(b, v...)
		}
		// Valid by construction ([A-Za-z0-9-]+ joined by "_", at most
		// MaxSubjectLen bytes); ParseSubject checks it once more.
		if s, err := bucket.ParseSubject(string(b)); err == nil {
			return s
		}
	}
	var buf [subjectStackBytes]byte
	b := append(buf[:0], p.Name...)
	b = append(b, 0)
	for i, e := range entries {
		v, shared := sh.value(i, e)
		b = strconv.AppendInt(b, int64(len(e.Key)), 10)
		b = append(b, ':')
		b = append(b, e.Key...)
		if shared {
			b = strconv.AppendInt(b, int64(len(v)+len(sharedMark)), 10)
			b = append(b, ':')
			b = append(b, v...)
			b = append(b, sharedMark...)
		} else {
			b = strconv.AppendInt(b, int64(len(v)), 10)
			b = append(b, ':')
			b = append(b, v...)
		}
	}
	return bucket.HashedSubjectBytes(subj.Salt, b)
}

// sharedMark follows a share_threshold wildcard's pattern in the hash
// input, so it cannot be confused with a value equal to the pattern.
const sharedMark = "\x00shared"

// readableValue reports whether v is [A-Za-z0-9-]+: such values joined by
// "_" cannot be confused with another list of values.
func readableValue(v string) bool {
	if v == "" {
		return false
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}
