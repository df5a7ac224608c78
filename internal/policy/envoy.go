package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/etcdlayout"
)

// envoyFile is an Envoy rate limit service configuration file, field for
// field as github.com/envoyproxy/ratelimit reads it.
type envoyFile struct {
	Domain      string            `yaml:"domain"`
	Descriptors []envoyDescriptor `yaml:"descriptors"`
}

type envoyDescriptor struct {
	Key         string            `yaml:"key"`
	Value       string            `yaml:"value"`
	RateLimit   *envoyRateLimit   `yaml:"rate_limit"`
	Descriptors []envoyDescriptor `yaml:"descriptors"`
	ShadowMode  bool              `yaml:"shadow_mode"`
	// ShareThreshold makes every value matching a wildcard share one bucket.
	ShareThreshold bool `yaml:"share_threshold"`
	// DetailedMetric and ValueToMetric only shape Envoy's own metrics;
	// they are accepted and ignored.
	DetailedMetric bool `yaml:"detailed_metric"`
	ValueToMetric  bool `yaml:"value_to_metric"`
}

type envoyRateLimit struct {
	RequestsPerUnit uint32          `yaml:"requests_per_unit"`
	Unit            string          `yaml:"unit"`
	Unlimited       bool            `yaml:"unlimited"`
	Name            string          `yaml:"name"`
	Replaces        []envoyReplaces `yaml:"replaces"`
	// Burst (this project's extension) makes the rule a token bucket of
	// capacity Burst refilled at requests_per_unit per unit, instead of
	// a fixed window: the shape Envoy's rate_limit_quota filter enforces,
	// so the RLQS server can lease it (internal/rlqs).
	Burst uint32 `yaml:"burst"`
	// Lease (this project's extension, with Burst) lets regional nodes
	// decide the rule's hot subjects in memory from node leases.
	Lease *nodeLeaseSetting `yaml:"lease"`
}

// LeaseHeadroom is what a token-bucket rule's idle TTL has beyond a full
// refill: the longest lease of its buckets (bucket.MaxLeaseFor).
const LeaseHeadroom = time.Minute

type envoyReplaces struct {
	Name string `yaml:"name"`
}

// envoyUnits maps Envoy's rate_limit units to window lengths, as the
// reference service counts them.
var envoyUnits = map[string]time.Duration{
	"second": time.Second,
	"minute": time.Minute,
	"hour":   time.Hour,
	"day":    24 * time.Hour,
	"week":   7 * 24 * time.Hour,
	"month":  30 * 24 * time.Hour,
	"year":   365 * 24 * time.Hour,
}

// MaxDescriptorDepth is the deepest nesting of descriptors accepted in an
// Envoy configuration file.
const MaxDescriptorDepth = 16

// envoyDomain is one Envoy configuration: a tree of descriptor nodes.
type envoyDomain struct {
	name   string
	source string
	root   envoyNode
}

// envoyNode is one level of the descriptor tree. children is keyed like
// the reference service: "key" for a default (any value), "key_value" for
// an exact value, "key_prefix*" for a wildcard.
type envoyNode struct {
	children map[string]*envoyNode
	// wildcards are the children keys ending in "*", in file order.
	wildcards []string
	policy    *Policy
	// shareThreshold: values matching this wildcard share one bucket.
	shareThreshold bool
	pattern        string // the wildcard value, with its "*"
}

func parseEnvoy(filename string, data []byte) (*Set, error) {
	var f envoyFile
	if err := decodeStrict(data, &f); err != nil {
		return nil, fmt.Errorf("%w: %s: %s", ErrInvalid, filename, cleanYAMLError(err))
	}
	if f.Domain == "" {
		return nil, fmt.Errorf("%w: %s: domain: must not be empty", ErrInvalid, filename)
	}
	d := &envoyDomain{name: f.Domain, source: filename, root: envoyNode{children: map[string]*envoyNode{}}}
	b := newBuilder()
	l := &envoyLoader{file: filename, domain: f.Domain, b: b}
	if err := l.load(&d.root, nil, nil, f.Descriptors, 1); err != nil {
		return nil, err
	}
	if err := b.addDomain(d); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrInvalid, filename, err)
	}
	return b.set(), nil
}

type envoyLoader struct {
	file, domain string
	b            *builder
	rules        int
}

func (l *envoyLoader) errorf(path []string, format string, args ...any) error {
	return fmt.Errorf("%w: %s: domain %q: descriptor %q: %s", ErrInvalid, l.file, l.domain,
		strings.Join(path, "."), fmt.Sprintf(format, args...))
}

func (l *envoyLoader) load(parent *envoyNode, path, keys []string, descs []envoyDescriptor, depth int) error {
	if depth > MaxDescriptorDepth && len(descs) > 0 {
		return l.errorf(path, "descriptors: nested deeper than %d levels", MaxDescriptorDepth)
	}
	for i := range descs {
		dc := &descs[i]
		if dc.Key == "" {
			return l.errorf(append(path, fmt.Sprintf("#%d", i+1)), "key: must not be empty")
		}
		l.rules++
		if l.rules > MaxPolicies {
			return l.errorf(path, "more than %d descriptors in the file", MaxPolicies)
		}
		final := dc.Key
		if dc.Value != "" {
			final += "_" + dc.Value
		}
		p := append(path[:len(path):len(path)], final)
		k := append(keys[:len(keys):len(keys)], dc.Key)
		if _, dup := parent.children[final]; dup {
			return l.errorf(p, "duplicate descriptor (the same key and value twice at one level)")
		}
		node := &envoyNode{children: map[string]*envoyNode{}}
		if strings.HasSuffix(final, "*") {
			parent.wildcards = append(parent.wildcards, final)
			node.pattern = dc.Value
			node.shareThreshold = dc.ShareThreshold
		} else if dc.ShareThreshold {
			return l.errorf(p, "share_threshold: only for wildcard values (ending in \"*\")")
		}
		if dc.RateLimit != nil {
			pol, err := l.policy(p, k, dc)
			if err != nil {
				return err
			}
			if err := l.b.add(pol); err != nil {
				return fmt.Errorf("%w: %s: %w", ErrInvalid, l.file, err)
			}
			node.policy = pol
		}
		parent.children[final] = node
		if err := l.load(node, p, k, dc.Descriptors, depth+1); err != nil {
			return err
		}
	}
	return nil
}

func (l *envoyLoader) policy(path, keys []string, dc *envoyDescriptor) (*Policy, error) {
	rl := dc.RateLimit
	unit := strings.ToLower(rl.Unit)
	window, validUnit := envoyUnits[unit]
	if rl.Unlimited && validUnit {
		return nil, l.errorf(path, "rate_limit.unit: must not be set when unlimited")
	}
	if !rl.Unlimited && !validUnit {
		return nil, l.errorf(path, "rate_limit.unit: %q is not second, minute, hour, day, week, month or year", rl.Unit)
	}
	if rl.Unlimited && rl.Burst > 0 {
		return nil, l.errorf(path, "rate_limit.burst: must not be set when unlimited")
	}
	if !rl.Unlimited && rl.RequestsPerUnit == 0 {
		return nil, l.errorf(path, "rate_limit.requests_per_unit: must be > 0")
	}
	rule := &EnvoyRule{
		Domain:          l.domain,
		Path:            strings.Join(path, "."),
		Keys:            keys,
		RequestsPerUnit: rl.RequestsPerUnit,
		LimitName:       rl.Name,
	}
	if !rl.Unlimited {
		rule.Unit = unit
	}
	for i, r := range rl.Replaces {
		if r.Name == "" {
			return nil, l.errorf(path, "rate_limit.replaces[%d].name: must not be empty", i)
		}
		if r.Name == rl.Name {
			return nil, l.errorf(path, "rate_limit.replaces[%d].name: %q is this rule's own name", i, r.Name)
		}
		rule.Replaces = append(rule.Replaces, r.Name)
	}
	p := &Policy{
		Name:        envoyPolicyName(l.domain, rule.Path),
		Version:     1,
		Subject:     rule.Path,
		FailureMode: DefaultFailureMode,
		LocalScale:  1,
		Unlimited:   rl.Unlimited,
		Shadow:      dc.ShadowMode,
		Source:      l.file,
		Envoy:       rule,
	}
	if !rl.Unlimited {
		p.Limits = bucket.Limits{
			Algorithm: bucket.FixedWindow,
			Capacity:  int64(rl.RequestsPerUnit),
			Window:    window,
		}
		if rl.Burst > 0 {
			p.Limits = bucket.Limits{
				Algorithm:       bucket.TokenBucket,
				Capacity:        int64(rl.Burst),
				RefillPerSecond: float64(rl.RequestsPerUnit) / window.Seconds(),
			}
		}
		ttl, err := minIdleTTL(p.Limits)
		if err != nil {
			return nil, l.errorf(path, "%v", err)
		}
		p.Limits.IdleTTL = ttl
		if rl.Burst > 0 {
			p.Limits.IdleTTL += LeaseHeadroom
		}
	}
	if rl.Lease != nil && rl.Burst == 0 {
		return nil, l.errorf(path, "rate_limit.lease: needs rate_limit.burst (only token buckets are leased)")
	}
	lease, err := rl.Lease.parse()
	if err != nil {
		return nil, l.errorf(path, "rate_limit.%v", err)
	}
	p.Lease = lease
	if err := p.Validate(); err != nil {
		return nil, l.errorf(path, "%v", err)
	}
	return p, nil
}

// envoyPolicyName derives a valid, deterministic policy name from an Envoy
// domain and descriptor path: "domain.path" when that is already a valid
// name (for example "edge.remote_address"), else that text with invalid
// bytes replaced by "_", cut to fit, and followed by "." and 12 hex digits
// of its SHA-256, so distinct paths keep distinct names.
func envoyPolicyName(domain, path string) string {
	raw := domain + "." + path
	if validateName(raw) == nil {
		return raw
	}
	sum := sha256.Sum256([]byte(raw))
	suffix := "." + hex.EncodeToString(sum[:6])
	max := 64 - len(suffix)
	var b strings.Builder
	for i := 0; i < len(raw) && b.Len() < max; i++ {
		c := raw[i]
		if etcdlayout.ValidNameByte(c) {
			b.WriteByte(c)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String() + suffix
}
