// Package regional is the regional admission node: it answers admission
// checks over gRPC (the project's own quota.v1.Admission API and Envoy's
// envoy.service.ratelimit.v3.RateLimitService) from Redis token buckets
// that hold this region's share of each policy's global budget.
//
// # A check
//
// A check is validated (subjects [A-Za-z0-9_-]{1,96} or hashed, at most
// MaxPolicies policies, costs in [0, 2^53] and not above a policy's
// capacity, bounded Envoy domains, descriptors and keys), looked up in the
// current policy snapshot (an atomic pointer swapped on reload), given the
// region's share from the ShareSource, and decided by one Store.TakeAll
// over every enforced policy: all or nothing, so a denial by one policy
// charges none. Shadow policies are charged on their own afterwards and
// never deny. Every decided policy is counted in Prometheus and reported to
// the DemandSink, with at most the policy's capacity of demand per request
// and bucket: a cost above the capacity can never be admitted anywhere,
// and counted whole (an Envoy hits_addend of 2^53) it would drag the
// region's share towards one caller.
//
// # Several subjects, refunds and instants
//
// CheckAll takes up to MaxCharges (policy, subject, cost) charges, each
// validated, authorized (check) and normalized as a Check's policy is,
// and decides them as one check through the same TakeAll: one atomic
// script call for the charges whose subjects share a Redis slot (every
// charge on a single server), one call per slot otherwise, with the slots
// that admitted refunded when another denies, so a partial denial admits
// nothing. Demand is reported per charge. Refund gives charges back
// through the refund path of Envoy's is_negative_hits, each on its own,
// never above capacity; it needs the refund grant on every policy named.
// Every decision in a reply carries decided_at: the store's instant
// (bucket.Decision.At: Redis TIME, or the in-process store's clock), or
// the node's clock for a decision no store made. Sampled decision logs
// carry each policy's cost.
//
// A check reads all its shares from one view: when the ShareSource is a
// PinnedShareSource (internal/regionsync), each check, each batch and each
// Envoy request takes one pin at its start and ends it on return, on every
// path (decision, bad input, store timeout, degraded mode, caller gone,
// replay). The region acknowledges an epoch only after every check pinned
// to an older one ended, so the coordinator never grows another region's
// share while a check here may still take tokens at a share this region
// gave up (rule 2 of docs/rebalance.md). Pins cost two atomic additions and
// no allocation.
//
// Subjects never carry raw untrusted values into Redis keys. On the own
// API a subject is hashed (salted with Config.SubjectSalt) when the request
// sets hash_subject or the policy's hash_subject holds (the default for
// api_key, ip and email); otherwise the caller vouches that it is already a
// normalized identity such as a tenant id. On the Envoy API every
// descriptor value is hashed with the same salt, except under the keys
// listed in Config.EnvoyPlainKeys (-envoy-plain-keys), whose readable
// values the operator declares not secret (see policy.EnvoySubjects).
//
// # Units
//
// Costs and capacities are cost units (tokens, requests); shares are
// fractions of a policy's global budget (the bucket enforces share ×
// capacity and share × refill per second); durations are time.Duration and
// are sent as protobuf Durations, or whole seconds rounded up in headers.
//
// # Envoy semantics
//
// ShouldRateLimit follows github.com/envoyproxy/ratelimit: one status per
// descriptor in request order; the overall code is OVER_LIMIT when any
// status is; the request's hits_addend is the cost of every descriptor (0
// means 1) unless a descriptor carries its own hits_addend; a descriptor's
// limit override replaces whatever rule matched with a fixed window of
// requests_per_unit per unit; a descriptor without a rule, or whose rule is
// replaced, is OK without current_limit; an unlimited rule is OK with
// limit_remaining 2^32-1; a shadow rule is charged and counted but always
// OK; is_negative_hits refunds. Unlike the reference service, the limited
// descriptors of one request are charged all or nothing. current_limit
// reports the limit at this region's share; duration_until_reset is the
// retry-after of an over-limit descriptor and the time to a full bucket
// (or the window's end) otherwise. With Config.Headers = HeadersDraft the
// reply carries RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset of
// the descriptor with the least remaining. A degraded decision adds the
// header x-quota-degraded.
//
// Envoy admits a request whose rate limit call fails unless its filter
// sets failure_mode_deny, so bad input never gets an error here: a
// descriptor value of any length is hashed like any other, a hits_addend
// beyond 2^53 is denied as any cost above the capacity, and a request the
// node still cannot decide (too many descriptors or entries, an empty or
// oversize key or domain, an invalid limit override) is answered
// OVER_LIMIT for every descriptor with the reason in the header
// x-quota-rejected (RejectedHeader), charging nothing and counted in
// quota_regional_rejected_requests_total. Only "policies not loaded yet"
// (Unavailable) and a caller that went away remain errors; the shipped
// Envoy configurations set failure_mode_deny for them (docs/security.md).
//
// # Callers
//
// Config.Grants (internal/grants) says what each caller may do: check,
// peek, refund and override, per policy. A caller is identified by the
// URI and DNS SANs of its verified client certificate and by a bearer
// token from Config.Tokens; the default grants check only. The own API
// refuses what is not granted (PermissionDenied, and then a Refund gives
// nothing back; an unknown token is Unauthenticated). The Envoy API never answers with an error, which
// Envoy would turn into admission: an override not granted is ignored, a
// refund not granted is charged as a hit, and a rule the caller may not
// check makes the request OVER_LIMIT. A granted override holds the
// region's share of its limit (the share of the matched rule's policy),
// like any policy.
//
// # Work per request and per caller
//
// A CheckBatch may name at most MaxBatchOps policies over all its checks
// (InvalidArgument before any store call beyond it): each is a bucket
// operation of about 11 µs of single-threaded Redis time. Each caller
// (its first identity and its IP address) may have at most
// Config.CallerMaxInflight bucket operations in flight on the node; a
// request beyond that is denied at once, uncharged (own API: a denial
// marked degraded "closed"; Envoy API: OVER_LIMIT with the reason in
// x-quota-rejected), never an error that a failing-open client or Envoy
// would turn into admission. One caller's flood so holds a bounded part
// of Redis and others' checks wait behind at most that much of it. Operations run are counted
// in quota_regional_bucket_operations_total, refusals in
// quota_regional_caller_limited_total.
//
// # Failure behaviour
//
// A store call has a time budget (Config.StoreTimeout, default 5 ms, up
// to an eighth more: calls that start within an eighth of it share one
// deadline timer).
// When it errors or runs out of time, each policy's failure mode decides:
// open admits, closed denies with a retry-after, local takes from an
// in-process bucket at share × local_scale / the region's nodes (the
// registered nodes Config.Shares counts, see RegionNodes; 1 without etcd),
// so that the nodes of a region, deciding apart, hold no more than the
// region's share together. The decision is marked degraded
// in the reply, counted, and logged at most once per DegradedLogInterval.
// After BreakerThreshold consecutive failures a circuit breaker keeps the
// store out for BreakerCooldown, then lets one probe through; while it is
// open a dead Redis costs no time.
//
// # At the in-process store's bucket cap
//
// The in-process store (the primary store of a node without Redis, and the
// local buckets of local policies) holds at most a fixed number of buckets
// (-local-max-buckets). A check that needs a new bucket there is denied
// with a retry-after of one BreakerCooldown, marked degraded ("closed" for
// the primary store, "local" for local buckets) and counted in
// quota_regional_memory_full_total; subjects that already have a bucket
// keep deciding from it. Being full is not a store failure: it never
// counts towards the breaker, so a flood of new identities cannot switch
// a fail-open policy to admitting everyone. A Redis at its maxmemory
// under noeviction (an OOM reply, bucket.ErrMemoryFull) is treated the
// same way, as a degraded closed denial.
//
// # Live subjects per policy
//
// Each policy lets at most MaxLiveSubjects subjects hold a bucket of their
// own on a node; a subject stays live until its bucket could have expired
// (idle TTL or one full refill) after its last check. A new subject beyond
// the bound is charged to the policy's overflow bucket (OverflowSubject,
// the policy's limits), counted in quota_regional_subject_overflow_total.
// After the store refused to grow, the policy's new subjects are denied
// for one BreakerCooldown without asking it. IPv6 subjects of "ip"
// policies and Envoy remote_address values are aggregated to
// IPv6SubjectPrefix bits.
//
// A negative cache remembers buckets that denied with retry-after t and
// denies the same or larger cost locally until t, so a client ignoring
// Retry-After cannot push its traffic onto Redis. It can deny what the
// store would by then admit: a refund, or a share that grew, adds tokens
// before t. It errs toward denial only, and only until t. An idempotency cache (LRU with TTL, per subject and
// key) replays the first decision of a retried check without charging
// again. Each key is bound to a fingerprint of its request (policies in
// order, cost, peek): the key presented with a different request is
// InvalidArgument, so a peek cannot be replayed as an uncharged admission.
// Both caches are bounded.
//
// # The process
//
// Run serves a Node from a DaemonConfig (validated by Run, zero fields
// defaulted): the stores, the etcd side (internal/regionsync), the gRPC and
// HTTP servers with internal/daemon's lifecycle. cmd/regional parses the
// command line (flags, QUOTA_* variables, logs on stderr) into a
// DaemonConfig and calls Run; tests and embedders fill one themselves.
//
// # TLS
//
// Run serves gRPC over TLS with -tls-cert and -tls-key, and requires
// client certificates from -tls-client-ca (mutual TLS). It reaches Redis
// over TLS with -redis-tls-ca (verifying Redis's certificate against that
// CA and -redis-tls-server-name, default the host of -redis) and presents
// -redis-tls-cert and -redis-tls-key when Redis asks for a client
// certificate. Every one of these files is reloaded when it changes
// (internal/tlsconfig): a rotated certificate or CA is used by the next
// connection without a restart.
//
// # Observability
//
// Metrics live under quota_regional_* on the Registerer passed in; no label
// carries a subject or a key. Logs are hclog; sampled decision logs carry a
// one-way hash of the subject only. Checks and their store calls are traced
// with OpenTelemetry (spans "regional.Check" (also for CheckAll),
// "regional.Refund", "regional.ShouldRateLimit" and
// "bucket.TakeAll" under otelgrpc's server span). A check's span carries
// quota.policies, quota.allowed, quota.decided_by and quota.degraded, never
// the subject, raw or hashed.
//
// # Concurrency and zero values
//
// A Node is safe for concurrent use; New starts no goroutines. Run and
// WatchPolicies start goroutines and say so. The zero Node and the zero
// Config are not usable: build a Node with New, which fills defaults.
package regional
