package policy

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/quotacoord/quota/bucket"
)

// ownFile is the project's own policy file format; see doc.go.
type ownFile struct {
	Policies []ownPolicy `yaml:"policies"`
}

type ownPolicy struct {
	Name            string             `yaml:"name"`
	Version         *uint32            `yaml:"version"`
	Description     string             `yaml:"description"`
	Subject         string             `yaml:"subject"`
	HashSubject     *bool              `yaml:"hash_subject"`
	Algorithm       string             `yaml:"algorithm"`
	Capacity        *int64             `yaml:"capacity"`
	Rate            string             `yaml:"rate"`
	RefillPerSecond *float64           `yaml:"refill_per_second"`
	Window          string             `yaml:"window"`
	IdleTTL         string             `yaml:"idle_ttl"`
	FailureMode     string             `yaml:"failure_mode"`
	LocalScale      *float64           `yaml:"local_scale"`
	Overcommit      float64            `yaml:"overcommit"`
	MinShare        map[string]float64 `yaml:"min_share"`
	Shards          string             `yaml:"shards"`
	Lease           *nodeLeaseSetting  `yaml:"lease"`
}

// hashedByDefault are the subject kinds whose values are untrusted
// identifiers and hashed unless hash_subject says otherwise.
var hashedByDefault = map[string]bool{"api_key": true, "ip": true, "email": true}

func parseOwn(filename string, data []byte, doc *yaml.Node) (*Set, error) {
	var f ownFile
	if err := decodeStrict(data, &f); err != nil {
		where := ""
		if line := yamlErrorLine(err); line > 0 {
			where = ownPolicyAt(doc, line)
		}
		return nil, fmt.Errorf("%w: %s: %s%s", ErrInvalid, filename, where, cleanYAMLError(err))
	}
	if len(f.Policies) == 0 {
		return nil, fmt.Errorf("%w: %s: policies: the list is empty", ErrInvalid, filename)
	}
	if len(f.Policies) > MaxPolicies {
		return nil, fmt.Errorf("%w: %s: policies: %d, more than %d", ErrInvalid, filename, len(f.Policies), MaxPolicies)
	}
	b := newBuilder()
	for i := range f.Policies {
		op := &f.Policies[i]
		label := fmt.Sprintf("policy #%d", i+1)
		if op.Name != "" {
			label = fmt.Sprintf("policy %q", op.Name)
		}
		p, err := op.normalize()
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %s: %w", ErrInvalid, filename, label, err)
		}
		p.Source = filename
		if err := b.add(p); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrInvalid, filename, err)
		}
	}
	return b.set(), nil
}

// ownPolicyAt names the policy whose YAML node holds line, as a prefix for
// decode errors ("policy \"exports\": ").
func ownPolicyAt(doc *yaml.Node, line int) string {
	for i := 0; i+1 < len(doc.Content); i += 2 {
		if doc.Content[i].Value != "policies" || doc.Content[i+1].Kind != yaml.SequenceNode {
			continue
		}
		var found *yaml.Node
		idx := 0
		for j, item := range doc.Content[i+1].Content {
			if item.Line <= line {
				found, idx = item, j
			}
		}
		if found == nil {
			return ""
		}
		if found.Kind == yaml.MappingNode {
			for k := 0; k+1 < len(found.Content); k += 2 {
				if found.Content[k].Value == "name" && found.Content[k+1].Value != "" {
					return fmt.Sprintf("policy %q: ", found.Content[k+1].Value)
				}
			}
		}
		return fmt.Sprintf("policy #%d: ", idx+1)
	}
	return ""
}

func (op *ownPolicy) normalize() (*Policy, error) {
	p := &Policy{
		Name:        op.Name,
		Version:     1,
		Description: op.Description,
		Subject:     op.Subject,
		FailureMode: DefaultFailureMode,
		LocalScale:  1,
	}
	if p.Name == "" {
		return nil, fmt.Errorf("name: missing")
	}
	if err := validateName(p.Name); err != nil {
		return nil, fmt.Errorf("name: %w", err)
	}
	if op.Version != nil {
		if *op.Version == 0 {
			return nil, fmt.Errorf("version: must be >= 1")
		}
		p.Version = *op.Version
	}
	if p.Subject == "" {
		p.Subject = "tenant"
	}
	if !isIdent(p.Subject) {
		return nil, fmt.Errorf("subject: %q must be a lower-case word such as tenant, account, api_key or ip", p.Subject)
	}
	p.HashSubject = hashedByDefault[p.Subject]
	if op.HashSubject != nil {
		p.HashSubject = *op.HashSubject
	}
	if op.FailureMode != "" {
		p.FailureMode = FailureMode(op.FailureMode)
	}
	if op.LocalScale != nil {
		p.LocalScale = *op.LocalScale
	}
	for region, m := range op.MinShare {
		if region == "default" {
			p.DefaultMinShare = m
			continue
		}
		if p.MinShare == nil {
			p.MinShare = make(map[string]float64, len(op.MinShare))
		}
		p.MinShare[region] = m
	}
	l, err := op.limits()
	if err != nil {
		return nil, err
	}
	p.Limits = l
	if p.Lease, err = op.Lease.parse(); err != nil {
		return nil, err
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return p, nil
}

func (op *ownPolicy) limits() (bucket.Limits, error) {
	l := bucket.Limits{Algorithm: bucket.Algorithm(op.Algorithm), Overcommit: op.Overcommit}
	if l.Algorithm == "" {
		l.Algorithm = bucket.TokenBucket
	}
	var rate rate
	if op.Rate != "" {
		var err error
		if rate, err = parseRate(op.Rate); err != nil {
			return l, fmt.Errorf("rate: %w", err)
		}
	}
	switch l.Algorithm {
	case bucket.TokenBucket:
		if op.Capacity == nil {
			return l, fmt.Errorf("capacity: missing (the burst: tokens a full bucket holds)")
		}
		l.Capacity = *op.Capacity
		if op.Window != "" {
			return l, fmt.Errorf("window: only for fixed_window, sliding_window and sliding_log")
		}
		switch {
		case op.Rate != "" && op.RefillPerSecond != nil:
			return l, fmt.Errorf("rate: give rate or refill_per_second, not both")
		case op.Rate != "":
			l.RefillPerSecond = rate.perSecond()
		case op.RefillPerSecond != nil:
			l.RefillPerSecond = *op.RefillPerSecond
		default:
			return l, fmt.Errorf("rate: missing (for example rate: 1000/minute, or refill_per_second: 16.7)")
		}
	case bucket.FixedWindow, bucket.SlidingWindow, bucket.SlidingLog:
		if op.RefillPerSecond != nil {
			return l, fmt.Errorf("refill_per_second: only for token_bucket; window algorithms take capacity and window, or rate")
		}
		switch {
		case op.Rate != "" && (op.Capacity != nil || op.Window != ""):
			return l, fmt.Errorf("rate: give rate, or capacity and window, not both")
		case op.Rate != "":
			if rate.count != math.Trunc(rate.count) {
				return l, fmt.Errorf("rate: %q: a window algorithm needs a whole number of requests", op.Rate)
			}
			l.Capacity = int64(rate.count)
			l.Window = rate.per
		default:
			if op.Capacity == nil {
				return l, fmt.Errorf("capacity: missing (requests per window), or give rate")
			}
			l.Capacity = *op.Capacity
			if op.Window == "" {
				return l, fmt.Errorf("window: missing (for example window: 1m), or give rate")
			}
			w, err := parseDuration(op.Window)
			if err != nil {
				return l, fmt.Errorf("window: %w", err)
			}
			l.Window = w
		}
	default:
		return l, fmt.Errorf("algorithm: %q is not token_bucket, fixed_window, sliding_window or sliding_log", op.Algorithm)
	}
	if l.Capacity < 1 {
		return l, fmt.Errorf("capacity: must be > 0, got %d", l.Capacity)
	}
	if l.Capacity > MaxCapacity {
		return l, fmt.Errorf("capacity: %d is more than %d", l.Capacity, MaxCapacity)
	}
	shards, err := parseShards(op.Shards, l)
	if err != nil {
		return l, fmt.Errorf("shards: %w", err)
	}
	l.Shards = shards
	if op.IdleTTL != "" {
		ttl, err := parseDuration(op.IdleTTL)
		if err != nil {
			return l, fmt.Errorf("idle_ttl: %w", err)
		}
		l.IdleTTL = ttl
	} else {
		ttl, err := minIdleTTL(l)
		if err != nil {
			return l, err
		}
		l.IdleTTL = ttl
	}
	return l, nil
}

// AutoShardRate is the global rate (tokens per second) per sub-bucket of a
// policy with shards: auto.
const AutoShardRate = 2000

// parseShards reads the shards setting of limits l: empty (one bucket), a
// whole number from 1 to bucket.MaxShards, or "auto": one sub-bucket per
// AutoShardRate tokens per second of the policy's global rate (refill, or
// capacity per window), rounded up, at most bucket.MaxShards. 1 is stored
// as 0: one bucket either way, under the same key version.
func parseShards(s string, l bucket.Limits) (int, error) {
	if s == "" {
		return 0, nil
	}
	if s == "auto" {
		r := l.RefillPerSecond
		if l.Algorithm != bucket.TokenBucket {
			r = 0
			if l.Window > 0 {
				r = float64(l.Capacity) / l.Window.Seconds()
			}
		}
		k := int(min(math.Ceil(r/AutoShardRate), bucket.MaxShards))
		if k <= 1 {
			return 0, nil
		}
		return k, nil
	}
	k, err := strconv.Atoi(s)
	if err != nil || k < 1 || k > bucket.MaxShards {
		return 0, fmt.Errorf("%q must be auto or a whole number from 1 to %d", s, bucket.MaxShards)
	}
	if k == 1 {
		return 0, nil
	}
	return k, nil
}

// rate is "count per duration".
type rate struct {
	count float64
	per   time.Duration
}

func (r rate) perSecond() float64 { return r.count / r.per.Seconds() }

var rateUnits = map[string]time.Duration{
	"s": time.Second, "sec": time.Second, "second": time.Second, "seconds": time.Second,
	"m": time.Minute, "min": time.Minute, "minute": time.Minute, "minutes": time.Minute,
	"h": time.Hour, "hour": time.Hour, "hours": time.Hour,
	"d": 24 * time.Hour, "day": 24 * time.Hour, "days": 24 * time.Hour,
	"week": 7 * 24 * time.Hour, "weeks": 7 * 24 * time.Hour,
}

// parseRate reads "1000/minute", "10/s", "0.5/second" or "100/90s".
func parseRate(s string) (rate, error) {
	num, unit, ok := strings.Cut(strings.TrimSpace(s), "/")
	if !ok {
		return rate{}, fmt.Errorf("%q: want COUNT/UNIT, for example 1000/minute", s)
	}
	n, err := strconv.ParseFloat(strings.TrimSpace(num), 64)
	if err != nil || math.IsNaN(n) || math.IsInf(n, 0) || n <= 0 || n > float64(MaxCapacity) {
		return rate{}, fmt.Errorf("%q: count must be a number > 0 and at most %d", s, MaxCapacity)
	}
	unit = strings.TrimSpace(unit)
	per, ok := rateUnits[strings.ToLower(unit)]
	if !ok {
		if per, err = parseDuration(unit); err != nil {
			return rate{}, fmt.Errorf("%q: unit must be second, minute, hour, day, week or a duration such as 90s", s)
		}
	}
	if per < MinWindow || per > MaxWindow {
		return rate{}, fmt.Errorf("%q: period must be between %v and %v", s, MinWindow, MaxWindow)
	}
	return rate{count: n, per: per}, nil
}

// parseDuration is time.ParseDuration plus a "d" (24h) suffix, and rejects
// negative values.
func parseDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if days, ok := strings.CutSuffix(s, "d"); ok && days != "" {
		n, err := strconv.ParseFloat(days, 64)
		if err != nil || n < 0 || n > MaxWindow.Hours()/24 {
			return 0, fmt.Errorf("%q: not a duration of 0 to %d days", s, int(MaxWindow.Hours()/24))
		}
		return time.Duration(n * float64(24*time.Hour)), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q: not a duration such as 90s, 5m, 2h or 1d", s)
	}
	if d < 0 {
		return 0, fmt.Errorf("%q: must not be negative", s)
	}
	return d, nil
}

// isIdent reports whether s is [a-z][a-z0-9_]{0,31}.
func isIdent(s string) bool {
	if len(s) == 0 || len(s) > 32 || s[0] < 'a' || s[0] > 'z' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}
