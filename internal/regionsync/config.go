package regionsync

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/quotacoord/quota/internal/clock"
	"github.com/quotacoord/quota/internal/demand"
	"github.com/quotacoord/quota/internal/etcdlayout"
)

// Defaults for Config fields left zero.
const (
	DefaultLeaseTTL       = 10 * time.Second
	DefaultReportInterval = 5 * time.Second
	DefaultRequestTimeout = 2 * time.Second
	DefaultMaxPolicies    = 4096
	DefaultMaxOverrides   = 100000
)

// Bounds on configured and published intervals.
const (
	MinReportInterval = 50 * time.Millisecond
	MaxReportInterval = 10 * time.Minute
)

// ErrInvalidConfig reports a Config that New cannot use.
var ErrInvalidConfig = errors.New("regionsync: invalid config")

// Config configures a Syncer.
type Config struct {
	// Region names this region, [A-Za-z0-9_.-]{1,64}. Required.
	Region string
	// Node identifies this node within its region, [A-Za-z0-9_.-]{1,64}.
	// Every node of a region registers, reports demand and acknowledges
	// under its own keys (regions/{region}/{node}, ...), so nodes of one
	// region never overwrite each other. Default DefaultNodeID(): the
	// hostname plus a random suffix, new for every Syncer.
	Node string
	// Addr is the node's admission address, written in the registration
	// for operators.
	Addr string
	// Fingerprint, when set, says what decides a subject's bucket on this
	// node (its policies and their versions, its subject naming); it goes
	// into the registration and is rewritten there when it changes, so
	// that the leader can leave out a region whose nodes disagree. It is
	// called often: keep it cheap.
	Fingerprint func() string
	// Client talks to etcd. Required; Dial builds one. The Syncer does not
	// close it.
	Client *clientv3.Client
	// Layout places the keys; the zero value uses etcdlayout.DefaultPrefix.
	Layout etcdlayout.Layout
	// LeaseTTL is the TTL of this node's lease, rounded up to whole
	// seconds. Zero follows the coordinator: each new lease takes the
	// TTL published in etcd's settings (Settings.LeaseTTLSeconds, read
	// just before the grant), or 10 s when none is published.
	LeaseTTL time.Duration
	// ReportInterval is how often demand is reported when etcd's settings
	// do not say. Default 5 s.
	ReportInterval time.Duration
	// RequestTimeout bounds every etcd call. Default 2 s, at most a third
	// of the lease TTL in use.
	RequestTimeout time.Duration
	// Recorder supplies demand reports; nil writes none.
	Recorder *demand.Recorder
	// MinShare returns the minimum share a policy names explicitly for this
	// region, enforced while the region is not in the policy's allocation
	// (none published yet, or one that leaves the region out); nil, or ok
	// false, means 0. It must not return a default minimum: only explicit
	// minimums are reserved by the coordinator for regions it has not seen.
	MinShare func(policy string) (min float64, ok bool)
	// OnPolicies receives every policy document under policies/ (name to
	// raw bytes, not to be modified) after the first read and after every
	// change. It runs on the Syncer's goroutine; nil skips policies.
	OnPolicies func(docs map[string][]byte)
	// MaxPolicies bounds the allocations and policy documents kept.
	// Default 4096.
	MaxPolicies int
	// MaxOverrides bounds the subject overrides accepted in one
	// allocation; a larger one is enforced at the safe share. Default
	// 100000.
	MaxOverrides int
	// Leases, when set, holds back each acknowledgement until the leases
	// taken above the shares it acknowledges have ended (LeaseGate).
	Leases LeaseGate
	// Clock stamps registrations, reports and acks with its wall reading
	// and measures the lease's age on its monotonic reading
	// (clock.MonotonicOf: real elapsed time for a clock without one), so
	// that a wall clock stepped back never delays the fallback to the
	// safe shares. Default clock.Real{}.
	Clock clock.Clock
	// Logger defaults to hclog.NewNullLogger().
	Logger hclog.Logger
}

func (c Config) withDefaults() (Config, error) {
	if c.LeaseTTL == 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	if c.ReportInterval == 0 {
		c.ReportInterval = DefaultReportInterval
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	if c.MaxPolicies == 0 {
		c.MaxPolicies = DefaultMaxPolicies
	}
	if c.MaxOverrides == 0 {
		c.MaxOverrides = DefaultMaxOverrides
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	if c.Node == "" {
		c.Node = DefaultNodeID()
	}
	if c.LeaseTTL > 0 {
		c.LeaseTTL = ((c.LeaseTTL + time.Second - 1) / time.Second) * time.Second
	}
	if c.RequestTimeout > c.LeaseTTL/3 {
		c.RequestTimeout = c.LeaseTTL / 3
	}
	switch {
	case c.Client == nil:
		return c, fmt.Errorf("%w: no etcd client", ErrInvalidConfig)
	case !etcdlayout.ValidName(c.Region):
		return c, fmt.Errorf("%w: region %q, want [A-Za-z0-9_.-]{1,%d}", ErrInvalidConfig, c.Region, etcdlayout.MaxNameLen)
	case !etcdlayout.ValidName(c.Node):
		return c, fmt.Errorf("%w: node id %q, want [A-Za-z0-9_.-]{1,%d}", ErrInvalidConfig, c.Node, etcdlayout.MaxNameLen)
	case c.LeaseTTL < time.Second || c.LeaseTTL > time.Hour:
		return c, fmt.Errorf("%w: lease TTL %v, want 1s to 1h", ErrInvalidConfig, c.LeaseTTL)
	case c.ReportInterval < MinReportInterval || c.ReportInterval > MaxReportInterval:
		return c, fmt.Errorf("%w: report interval %v, want %v to %v", ErrInvalidConfig, c.ReportInterval, MinReportInterval, MaxReportInterval)
	case c.RequestTimeout <= 0:
		return c, fmt.Errorf("%w: request timeout %v", ErrInvalidConfig, c.RequestTimeout)
	case c.MaxPolicies < 1:
		return c, fmt.Errorf("%w: MaxPolicies %d", ErrInvalidConfig, c.MaxPolicies)
	case c.MaxOverrides < 0:
		return c, fmt.Errorf("%w: MaxOverrides %d", ErrInvalidConfig, c.MaxOverrides)
	}
	return c, nil
}

// DefaultNodeID returns a node id: the hostname (characters outside
// [A-Za-z0-9_.-] replaced by '-', at most 55 of them; "node" when the
// hostname is unknown) plus '-' and 8 random hex digits, so that two
// nodes on one host, or a restarted node, never share an id.
func DefaultNodeID() string {
	host, _ := os.Hostname()
	host = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '.' || r == '-' {
			return r
		}
		return '-'
	}, host)
	if len(host) > etcdlayout.MaxNameLen-9 {
		host = host[:etcdlayout.MaxNameLen-9]
	}
	if host == "" {
		host = "node"
	}
	var b [4]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return host + "-" + hex.EncodeToString(b[:])
}
