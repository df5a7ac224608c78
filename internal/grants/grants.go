package grants

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"go.yaml.in/yaml/v3"
)

// ErrGrants reports an invalid grants or tokens file.
var ErrGrants = errors.New("grants: invalid")

// Action is one thing a caller may do to a policy.
type Action uint8

const (
	// Check charges a policy's bucket.
	Check Action = 1 << iota
	// Peek reads a bucket without charging it.
	Peek
	// Refund gives tokens back to a bucket.
	Refund
	// Override replaces a matched rule with the caller's own limit.
	Override
)

// actionNames are the names of the actions in files and metrics.
var actionNames = [...]struct {
	a    Action
	name string
}{{Check, "check"}, {Peek, "peek"}, {Refund, "refund"}, {Override, "override"}}

// String returns the action's name ("check", "peek", "refund",
// "override"), or a list of them joined by "+".
func (a Action) String() string {
	var names []string
	for _, an := range actionNames {
		if a&an.a != 0 {
			names = append(names, an.name)
		}
	}
	return strings.Join(names, "+")
}

// Limits on a grants file, so that its compiled form is bounded.
const (
	MaxCallers    = 10000 // caller entries
	MaxIdentities = 64    // identities of one caller entry
	MaxRules      = 64    // rules of one caller entry, or of default
	MaxPolicies   = 1024  // policy names of one rule
	MaxNameLen    = 1024  // bytes of an identity or a policy name
	// MaxFileBytes bounds a grants or tokens file.
	MaxFileBytes = 4 << 20
)

// Perms are the actions granted to one caller: on every policy, and per
// policy name. The zero Perms allows nothing.
type Perms struct {
	all      Action
	byPolicy map[string]Action
}

// Allows reports whether p grants every action of a on policy.
func (p Perms) Allows(a Action, policy string) bool {
	if p.all&a == a {
		return true
	}
	return (p.all|p.byPolicy[policy])&a == a
}

// AllowsEverywhere reports whether p grants a on every policy.
func (p Perms) AllowsEverywhere(a Action) bool { return p.all&a == a }

// union returns p with q's grants added.
func (p Perms) union(q Perms) Perms {
	out := Perms{all: p.all | q.all}
	if len(p.byPolicy)+len(q.byPolicy) == 0 {
		return out
	}
	out.byPolicy = make(map[string]Action, len(p.byPolicy)+len(q.byPolicy))
	for _, m := range []map[string]Action{p.byPolicy, q.byPolicy} {
		for name, a := range m {
			if a &^= out.all; a != 0 {
				out.byPolicy[name] |= a
			}
		}
	}
	return out
}

// Grants maps caller identities to Perms. Build it with Parse, Load or
// Default.
type Grants struct {
	def  Perms
	byID map[string]Perms
}

// Default grants check on every policy to every caller, and nothing
// else: the grants of a node without a grants file.
func Default() *Grants { return &Grants{def: Perms{all: Check}} }

// For returns the perms of a caller with identities ids: the default
// grants and those of every listed identity.
func (g *Grants) For(ids []string) Perms {
	p := g.def
	for _, id := range ids {
		if q, ok := g.byID[id]; ok {
			p = p.union(q)
		}
	}
	return p
}

// Identified reports whether any identity has grants of its own; without
// them every caller gets the default and identifying callers is moot.
func (g *Grants) Identified() bool { return len(g.byID) > 0 }

// file is the grants file's format (see the package documentation).
type file struct {
	Default *[]rule   `yaml:"default"`
	Callers []callers `yaml:"callers"`
}

type rule struct {
	Actions  []string `yaml:"actions"`
	Policies []string `yaml:"policies"`
}

type callers struct {
	Identities []string `yaml:"identities"`
	Grants     []rule   `yaml:"grants"`
}

// Load reads and parses the grants file at path.
func Load(path string) (*Grants, error) {
	data, err := readFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data)
}

// readFile reads a file of at most MaxFileBytes.
func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("grants: %w", err)
	}
	defer f.Close()
	var b bytes.Buffer
	if _, err := b.ReadFrom(io.LimitReader(f, MaxFileBytes+1)); err != nil {
		return nil, fmt.Errorf("grants: %s: %w", path, err)
	}
	if b.Len() > MaxFileBytes {
		return nil, fmt.Errorf("%w: %s is larger than %d bytes", ErrGrants, path, MaxFileBytes)
	}
	return b.Bytes(), nil
}

// Parse parses a grants file (YAML or JSON) named name in errors.
func Parse(name string, data []byte) (*Grants, error) {
	bad := func(format string, args ...any) (*Grants, error) {
		return nil, fmt.Errorf("%w: %s: "+format, append([]any{ErrGrants, name}, args...)...)
	}
	var f file
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		return bad("%v", err)
	}
	g := Default()
	if f.Default != nil {
		p, err := compile(*f.Default)
		if err != nil {
			return bad("default: %v", err)
		}
		g.def = p
	}
	if len(f.Callers) > MaxCallers {
		return bad("%d callers, at most %d", len(f.Callers), MaxCallers)
	}
	g.byID = make(map[string]Perms)
	for i, c := range f.Callers {
		if len(c.Identities) == 0 || len(c.Identities) > MaxIdentities {
			return bad("callers[%d]: %d identities, want 1 to %d", i, len(c.Identities), MaxIdentities)
		}
		p, err := compile(c.Grants)
		if err != nil {
			return bad("callers[%d]: %v", i, err)
		}
		for _, id := range c.Identities {
			if err := validIdentity(id); err != nil {
				return bad("callers[%d]: %v", i, err)
			}
			g.byID[id] = g.byID[id].union(p)
		}
	}
	return g, nil
}

// compile turns rules into Perms.
func compile(rules []rule) (Perms, error) {
	if len(rules) > MaxRules {
		return Perms{}, fmt.Errorf("%d rules, at most %d", len(rules), MaxRules)
	}
	var p Perms
	for j, r := range rules {
		var a Action
		if len(r.Actions) == 0 {
			return Perms{}, fmt.Errorf("rule %d names no actions", j)
		}
		for _, name := range r.Actions {
			found := false
			for _, an := range actionNames {
				if an.name == name {
					a |= an.a
					found = true
				}
			}
			if !found {
				return Perms{}, fmt.Errorf("rule %d: unknown action %q, want check, peek, refund or override", j, name)
			}
		}
		if len(r.Policies) == 0 || len(r.Policies) > MaxPolicies {
			return Perms{}, fmt.Errorf("rule %d: %d policies, want 1 to %d (\"*\" for every policy)", j, len(r.Policies), MaxPolicies)
		}
		q := Perms{}
		for _, pol := range r.Policies {
			switch {
			case pol == "*":
				q.all |= a
			case pol == "" || len(pol) > MaxNameLen:
				return Perms{}, fmt.Errorf("rule %d: policy name of %d bytes, want 1 to %d", j, len(pol), MaxNameLen)
			default:
				if q.byPolicy == nil {
					q.byPolicy = make(map[string]Action)
				}
				q.byPolicy[pol] |= a
			}
		}
		p = p.union(q)
	}
	return p, nil
}

// validIdentity checks an identity's form: "dns:NAME", "token:NAME" or
// a URI with a scheme ("spiffe://...").
func validIdentity(id string) error {
	if id == "" || len(id) > MaxNameLen {
		return fmt.Errorf("identity of %d bytes, want 1 to %d", len(id), MaxNameLen)
	}
	scheme, rest, ok := strings.Cut(id, ":")
	if !ok || rest == "" || scheme == "" {
		return fmt.Errorf("identity %q: want dns:NAME, token:NAME or a URI such as spiffe://DOMAIN/PATH", id)
	}
	switch scheme {
	case "dns", "token":
		if strings.HasPrefix(rest, "//") {
			return fmt.Errorf("identity %q: want %s:NAME", id, scheme)
		}
		return nil
	}
	if !strings.HasPrefix(rest, "//") {
		return fmt.Errorf("identity %q: want dns:NAME, token:NAME or a URI such as spiffe://DOMAIN/PATH", id)
	}
	return nil
}
