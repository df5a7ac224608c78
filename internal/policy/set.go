package policy

import (
	"errors"
	"fmt"
	"sort"
)

// ErrDuplicate reports two policies with one name, or two Envoy files with
// one domain, in one Set.
var ErrDuplicate = errors.New("policy: duplicate")

// Set is an immutable collection of validated policies: the project's own
// policies and those derived from Envoy rate limit service files, with the
// Envoy descriptor trees used by MatchDescriptors. Build one with Parse,
// Load or Merge. A Set is safe for concurrent use; the *Policy values it
// returns are shared and must not be modified. The zero Set is empty.
type Set struct {
	policies []*Policy // sorted by name
	byName   map[string]*Policy
	domains  map[string]*envoyDomain
}

// Policies returns every policy, sorted by name. The slice is a copy; the
// policies are shared.
func (s *Set) Policies() []*Policy {
	if s == nil {
		return nil
	}
	out := make([]*Policy, len(s.policies))
	copy(out, s.policies)
	return out
}

// Get returns the policy called name.
func (s *Set) Get(name string) (*Policy, bool) {
	if s == nil {
		return nil, false
	}
	p, ok := s.byName[name]
	return p, ok
}

// Len returns the number of policies.
func (s *Set) Len() int {
	if s == nil {
		return 0
	}
	return len(s.policies)
}

// Domains returns the Envoy domains in the set, sorted.
func (s *Set) Domains() []string {
	if s == nil {
		return nil
	}
	out := make([]string, 0, len(s.domains))
	for d := range s.domains {
		out = append(out, d)
	}
	sort.Strings(out)
	return out
}

// Merge combines sets into one. Two policies with one name, or two Envoy
// configurations with one domain, are an error naming both sources. Nil
// sets are skipped.
func Merge(sets ...*Set) (*Set, error) {
	b := newBuilder()
	for _, s := range sets {
		if s == nil {
			continue
		}
		for _, d := range s.domainsInOrder() {
			if err := b.addDomain(d); err != nil {
				return nil, err
			}
		}
		for _, p := range s.policies {
			if err := b.add(p); err != nil {
				return nil, err
			}
		}
	}
	return b.set(), nil
}

func (s *Set) domainsInOrder() []*envoyDomain {
	out := make([]*envoyDomain, 0, len(s.domains))
	for _, name := range s.Domains() {
		out = append(out, s.domains[name])
	}
	return out
}

type builder struct {
	byName  map[string]*Policy
	domains map[string]*envoyDomain
}

func newBuilder() *builder {
	return &builder{byName: map[string]*Policy{}, domains: map[string]*envoyDomain{}}
}

func (b *builder) add(p *Policy) error {
	if prev, ok := b.byName[p.Name]; ok {
		return fmt.Errorf("%w: policy %q in %s and in %s", ErrDuplicate, p.Name, sourceName(prev), sourceName(p))
	}
	b.byName[p.Name] = p
	return nil
}

func (b *builder) addDomain(d *envoyDomain) error {
	if prev, ok := b.domains[d.name]; ok {
		return fmt.Errorf("%w: Envoy domain %q in %s and in %s", ErrDuplicate, d.name, prev.source, d.source)
	}
	b.domains[d.name] = d
	return nil
}

func (b *builder) set() *Set {
	s := &Set{byName: b.byName, domains: b.domains}
	s.policies = make([]*Policy, 0, len(b.byName))
	for _, p := range b.byName {
		s.policies = append(s.policies, p)
	}
	sort.Slice(s.policies, func(i, j int) bool { return s.policies[i].Name < s.policies[j].Name })
	return s
}

func sourceName(p *Policy) string {
	if p.Source == "" {
		return "(no file)"
	}
	return p.Source
}
