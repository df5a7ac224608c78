package regional

import (
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/clock"
	"github.com/quotacoord/quota/internal/grants"
	"github.com/quotacoord/quota/internal/policy"
)

// ErrConfig reports an invalid Config.
var ErrConfig = errors.New("regional: invalid config")

// UnknownPolicy says what a check naming a policy the node does not know
// gets.
type UnknownPolicy string

const (
	// UnknownError fails the check with NotFound.
	UnknownError UnknownPolicy = "error"
	// UnknownDeny denies the check, charging nothing.
	UnknownDeny UnknownPolicy = "deny"
	// UnknownAllow ignores the unknown policy; the others still decide.
	UnknownAllow UnknownPolicy = "allow"
)

// HeaderMode selects the response headers of the Envoy API.
type HeaderMode string

const (
	// HeadersOff adds no headers (the default, like Envoy's service).
	HeadersOff HeaderMode = "off"
	// HeadersDraft adds RateLimit-Limit, RateLimit-Remaining and
	// RateLimit-Reset (whole seconds, rounded up) for the descriptor with
	// the least remaining, as Envoy's rate limit service does.
	HeadersDraft HeaderMode = "draft"
)

// GCPercent is the node's GOGC unless the environment sets one (cmd/regional;
// the no-work server of loadgen uses it too, to differ from the node only in
// the work): a check allocates a few kilobytes that die with it, and the
// node's live heap is small, so collecting at 100% growth spent about a
// tenth of the node's CPU on the collector (pprof under bench-regional.sh);
// 400 cuts that to about a quarter for a few more megabytes of heap.
const GCPercent = 400

// Limits on input size. Requests beyond them are InvalidArgument.
const (
	MaxPolicies = 16  // policies in one check
	MaxBatch    = 256 // checks in one CheckBatch
	// MaxBatchOps bounds the bucket operations of one CheckBatch, the
	// policies named summed over its checks: a batch of 256 checks of 16
	// policies each would hold a single-threaded Redis for tens of
	// milliseconds (about 11 µs per bucket), long enough to time out
	// every other check of the region and open its breaker.
	MaxBatchOps = 512
	// GRPCWindow is the node's fixed gRPC flow-control window, per stream
	// and per connection, in bytes (a check is a few hundred bytes).
	GRPCWindow           = 1 << 20
	MaxRawSubjectLen     = 1024 // bytes of a subject to be hashed
	MaxIdempotencyKeyLen = 128
	MaxDomainLen         = 256
	MaxDescriptors       = 64   // descriptors in one Envoy request
	MaxEntries           = 16   // entries in one descriptor
	MaxEntryLen          = 1024 // bytes of one entry key (values of any length are hashed)
	// MaxCost keeps costs exact in float64 arithmetic (2^53).
	MaxCost = 1 << 53
)

// DefaultCallerMaxInflight is Config.CallerMaxInflight's default: at
// about 11 µs of Redis time per bucket, one caller holds at most ~11 ms
// of its region's Redis at any moment, while a proxy deciding 100,000
// checks of ten descriptors a second at 1 ms each needs a thousand.
const DefaultCallerMaxInflight = 1024

// Config configures a Node. Zero fields take the defaults listed.
type Config struct {
	// Region names this node's region; required, used in metrics and shares.
	Region string
	// Store is the primary bucket store (Redis); required.
	Store bucket.Store
	// Local is the in-process store used by policies whose failure mode is
	// local; required.
	Local bucket.Store
	// Shares tells the region's share per policy and subject; default
	// Standalone (1 everywhere).
	Shares ShareSource
	// Demand receives every decision; default none.
	Demand DemandSink
	// Clock defaults to the wall clock.
	Clock clock.Clock
	// Logger defaults to hclog.NewNullLogger().
	Logger hclog.Logger
	// Registerer receives the node's metrics; default none registered.
	Registerer prometheus.Registerer
	// TracerProvider defaults to a no-op provider.
	TracerProvider trace.TracerProvider
	// StoreTimeout is the time budget of one store call; default 5ms. A
	// call may run up to an eighth longer: calls that start within an
	// eighth of it share one timer.
	StoreTimeout time.Duration
	// BreakerThreshold consecutive store failures open the breaker;
	// default 5.
	BreakerThreshold int
	// BreakerCooldown is how long the breaker stays open before a probe;
	// default 1s.
	BreakerCooldown time.Duration
	// UnknownPolicy defaults to UnknownError.
	UnknownPolicy UnknownPolicy
	// SubjectSalt is the secret HMAC key of hashed subjects; every region
	// of a deployment must use the same salt. Empty, New generates a
	// random one for this node only and logs a warning: hashed subjects
	// then never use an empty key (which would let anyone reverse a
	// hashed IPv4 address by trying 2^32 values), but nodes sharing a
	// Redis name different buckets for one identity and a restart starts
	// every hashed bucket afresh. Run fills it from etcd (see
	// DaemonConfig.SubjectSalt).
	SubjectSalt string
	// EnvoyPlainKeys lists the Envoy descriptor keys whose values are not
	// secret and stay readable in bucket subjects (see
	// policy.EnvoySubjects); every other descriptor value is hashed with
	// SubjectSalt. Default none: every value is hashed.
	EnvoyPlainKeys []string
	// IdempotencyTTL is how long a decision is replayed; default 60s.
	IdempotencyTTL time.Duration
	// IdempotencySize bounds the replay cache; default 100000 entries.
	IdempotencySize int
	// NegativeCacheSize bounds the negative cache; default 100000 entries,
	// negative disables it.
	NegativeCacheSize int
	// DecisionLogEvery logs one decision in every N (with a one-way subject
	// hash only); 0 disables decision logs.
	DecisionLogEvery int
	// DegradedLogInterval is the least time between two degraded-mode log
	// lines; default 1s.
	DegradedLogInterval time.Duration
	// Headers selects Envoy response headers; default HeadersOff.
	Headers HeaderMode
	// Grants says which callers may check, peek, refund and override on
	// which policies (see internal/grants); default grants.Default(),
	// check only for every caller.
	Grants *grants.Grants
	// Tokens are the bearer tokens that identify callers; default none.
	Tokens *grants.Tokens
	// CallerMaxInflight bounds the bucket operations one caller (its
	// first identity and its IP address) may have in flight on the node;
	// a request beyond it is denied at once (degraded "closed" on the own
	// API, OVER_LIMIT with a reason on the Envoy API). Default
	// DefaultCallerMaxInflight; negative turns the bound off.
	CallerMaxInflight int

	// saltGenerated is set by withDefaults when it made SubjectSalt up.
	saltGenerated bool

	// NodeLeaseHot is how many checks in one second make a subject of a
	// leasable policy (policy.NodeLease) hot on this node, so that the
	// node leases it; default DefaultNodeLeaseHot.
	NodeLeaseHot int
	// NodeLeaseMax and NodeLeaseMaxPerPolicy bound the subjects this node
	// holds node leases for; defaults DefaultNodeLeaseMax and
	// DefaultNodeLeaseMaxPerPolicy.
	NodeLeaseMax, NodeLeaseMaxPerPolicy int

	// MaxLiveSubjects bounds, per policy, the subjects this node lets hold
	// a bucket of their own at once (see OverflowSubject); default 100000.
	MaxLiveSubjects int
	// IPv6SubjectPrefix is the prefix length IPv6 subjects are aggregated
	// to (Envoy remote_address values, and subjects of policies whose
	// subject is "ip"); default 64, at most 128.
	IPv6SubjectPrefix int
}

// withDefaults returns c with defaults filled in, or an error naming the
// first bad field.
func (c Config) withDefaults() (Config, error) {
	if c.Region == "" {
		return c, fmt.Errorf("%w: Region is empty", ErrConfig)
	}
	if err := bucket.ValidateSubject(c.Region); err != nil {
		return c, fmt.Errorf("%w: Region %q: %w", ErrConfig, c.Region, err)
	}
	if c.Store == nil {
		return c, fmt.Errorf("%w: Store is nil", ErrConfig)
	}
	if c.Local == nil {
		return c, fmt.Errorf("%w: Local is nil", ErrConfig)
	}
	if err := (policy.EnvoySubjects{PlainKeys: c.EnvoyPlainKeys}).Validate(); err != nil {
		return c, fmt.Errorf("%w: EnvoyPlainKeys: %w", ErrConfig, err)
	}
	if c.Shares == nil {
		c.Shares = Standalone{}
	}
	if c.Grants == nil {
		c.Grants = grants.Default()
	}
	switch {
	case c.CallerMaxInflight == 0:
		c.CallerMaxInflight = DefaultCallerMaxInflight
	case c.CallerMaxInflight < 0:
		c.CallerMaxInflight = 0
	}
	if c.SubjectSalt == "" {
		c.SubjectSalt = newSubjectSalt()
		c.saltGenerated = true
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
	if c.TracerProvider == nil {
		c.TracerProvider = noop.NewTracerProvider()
	}
	if err := orDefault(&c.StoreTimeout, 5*time.Millisecond, "StoreTimeout"); err != nil {
		return c, err
	}
	if err := orDefault(&c.BreakerThreshold, 5, "BreakerThreshold"); err != nil {
		return c, err
	}
	if err := orDefault(&c.BreakerCooldown, time.Second, "BreakerCooldown"); err != nil {
		return c, err
	}
	switch c.UnknownPolicy {
	case "":
		c.UnknownPolicy = UnknownError
	case UnknownError, UnknownDeny, UnknownAllow:
	default:
		return c, fmt.Errorf("%w: UnknownPolicy %q, want error, deny or allow", ErrConfig, c.UnknownPolicy)
	}
	if err := orDefault(&c.IdempotencyTTL, time.Minute, "IdempotencyTTL"); err != nil {
		return c, err
	}
	if err := orDefault(&c.IdempotencySize, 100000, "IdempotencySize"); err != nil {
		return c, err
	}
	switch {
	case c.NegativeCacheSize == 0:
		c.NegativeCacheSize = 100000
	case c.NegativeCacheSize < 0:
		c.NegativeCacheSize = 0
	}
	if c.DecisionLogEvery < 0 {
		return c, fmt.Errorf("%w: DecisionLogEvery %d is negative", ErrConfig, c.DecisionLogEvery)
	}
	if err := orDefault(&c.DegradedLogInterval, time.Second, "DegradedLogInterval"); err != nil {
		return c, err
	}
	if err := orDefault(&c.NodeLeaseHot, DefaultNodeLeaseHot, "NodeLeaseHot"); err != nil {
		return c, err
	}
	if err := orDefault(&c.NodeLeaseMax, DefaultNodeLeaseMax, "NodeLeaseMax"); err != nil {
		return c, err
	}
	if err := orDefault(&c.NodeLeaseMaxPerPolicy, DefaultNodeLeaseMaxPerPolicy, "NodeLeaseMaxPerPolicy"); err != nil {
		return c, err
	}
	if err := orDefault(&c.MaxLiveSubjects, 100000, "MaxLiveSubjects"); err != nil {
		return c, err
	}
	if err := orDefault(&c.IPv6SubjectPrefix, 64, "IPv6SubjectPrefix"); err != nil {
		return c, err
	}
	if c.IPv6SubjectPrefix > 128 {
		return c, fmt.Errorf("%w: IPv6SubjectPrefix %d is more than 128", ErrConfig, c.IPv6SubjectPrefix)
	}
	switch c.Headers {
	case "":
		c.Headers = HeadersOff
	case HeadersOff, HeadersDraft:
	default:
		return c, fmt.Errorf("%w: Headers %q, want off or draft", ErrConfig, c.Headers)
	}
	return c, nil
}

// orDefault sets a zero *v to def and refuses a negative one, naming the
// field.
func orDefault[T int | int64 | time.Duration](v *T, def T, field string) error {
	switch {
	case *v == 0:
		*v = def
	case *v < 0:
		return fmt.Errorf("%w: %s %v is negative", ErrConfig, field, *v)
	}
	return nil
}
