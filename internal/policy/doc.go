// Package policy loads and validates rate-limit policies: the project's own
// YAML format and Envoy rate limit service configuration files, both into
// the normalized Policy, collected in an immutable Set.
//
// # Units and invariants
//
// Capacities are cost units (tokens, requests); refill rates are cost units
// per second; windows and TTLs are time.Duration. Every Policy in a Set has
// passed Validate: capacity in [1, bucket.MaxCapacity], a positive finite refill (token
// bucket) or a window in [1ms, 400 days] (window algorithms), an idle TTL
// that covers a full refill or window (at least a minute), overcommit ε in
// [0, 1], local_scale in (0, 1], minimum shares in [0, 1] whose listed
// regions add up to at most 1. Policy names are [A-Za-z0-9_.-]{1,64} and
// unique within a Set. A cost larger than capacity is rejected by the
// regional node at check time, not here.
//
// # The own format
//
// A file whose top level has "policies:" holds a list of policies:
//
//	policies:
//	  - name: exports            # required, [A-Za-z0-9_.-]{1,64}
//	    description: free text
//	    version: 1               # >= 1, default 1; part of every bucket key
//	    subject: tenant          # tenant, account, api_key, ip, ...; default tenant
//	    hash_subject: false      # default true for api_key, ip and email
//	    algorithm: token_bucket  # token_bucket (default), fixed_window, sliding_window, sliding_log
//	    capacity: 50             # burst (token bucket) or cost per window
//	    rate: 1000/minute        # COUNT/UNIT: second, minute, hour, day, week, or a duration (100/90s)
//	    refill_per_second: 16.7  # token bucket: instead of rate
//	    window: 1m               # window algorithms: with capacity, instead of rate
//	    idle_ttl: 10m            # default: a full refill or window rounded up, at least 1m
//	    failure_mode: local      # open, closed or local (default local)
//	    local_scale: 0.5         # local: the emergency bucket's fraction of the share, default 1
//	    overcommit: 0            # ε: regions together may enforce up to 1+ε of the budget
//	    min_share:               # guaranteed minimum share per region
//	      default: 0.1
//	      eu-west: 0.2
//
// A token bucket needs capacity and one of rate or refill_per_second. A
// window algorithm needs capacity and window, or rate alone (rate:
// 1000/minute means capacity 1000 per one-minute window). Unknown fields
// are errors, so a typo never passes silently.
//
// # Envoy rate limit service files
//
// A file whose top level has "domain:" is read as the configuration of
// github.com/envoyproxy/ratelimit, unchanged: descriptors with key and
// optional value, nested descriptors, wildcard values ("prefix*"), a
// key without value as the default for any value, rate_limit with unit
// (second, minute, hour, day, week, month, year) and requests_per_unit,
// unlimited, name and replaces, shadow_mode, share_threshold; the
// metrics-only fields detailed_metric and value_to_metric are accepted and
// ignored. Every descriptor with a rate_limit becomes a Policy named
// "domain.path" (hashed when that is not a valid name; see EnvoyRule),
// algorithm fixed_window with the unit as window, version 1 and the default
// failure mode. A requests_per_unit of 0 is rejected: capacity must be at
// least 1. Set.MatchDescriptors decides which rule each request descriptor
// meets, as the reference service does. One extension: rate_limit.burst
// makes the rule a token bucket of that capacity refilled at
// requests_per_unit per unit (idle TTL: a full refill plus LeaseHeadroom),
// the shape Envoy's rate_limit_quota filter enforces and internal/rlqs
// leases.
//
// # Subjects are never raw untrusted values
//
// A bucket subject is [A-Za-z0-9_-]{1,96} and becomes part of a Redis key,
// so raw identities (API keys, addresses, e-mail addresses) must never be
// one.
//
// Envoy descriptor values are forwarded from requests and untrusted: by
// default Set.Match hashes every descriptor's keys and values, salted with
// EnvoySubjects.Salt (bucket.HashSubject, "h-" and 32 characters). Only keys
// the operator lists in EnvoySubjects.PlainKeys as not secret (the regional
// node's -envoy-plain-keys, for example "tenant,path") keep readable
// values, and only when every key of the descriptor is listed and every
// value is [A-Za-z0-9-]+ and not "h-"-prefixed.
//
// Set.Match runs on every Envoy check: it allocates its result slice and
// one string per limited descriptor (the subject, also handed out as a
// bucket.Subject in DescriptorMatch.BucketSubject so that
// bucket.NewSubjectKey need not check it again), and nothing else unless a
// key_value pair exceeds 128 bytes or a descriptor's hash input 512 bytes.
//
// The own API follows the same rule with the caller in charge: a policy's
// hash_subject (default true for api_key, ip and email) or the request's
// hash_subject flag hashes the subject with the node's salt; a subject the
// caller does not ask to hash must already be a normalized identity (a
// tenant or account id, not a secret), and is rejected unless it is a
// valid subject.
//
// # Bucket keys
//
// Policy.KeyVersion mixes the version with the algorithm, capacity, refill,
// window and shards, so raising the version or changing those limits starts new
// buckets under new keys; the old keys expire by their idle TTL. A
// regional node starts the new buckets spent at the edit for a refill time
// (bucket.Request.Since), so an edit never hands out a fresh budget.
//
// # Errors
//
// Every Parse and Load error wraps ErrInvalid and names the file, the
// policy (or the Envoy domain and descriptor path) and the field, as in
// `policies.yaml: policy "exports": capacity: must be > 0`.
//
// # Concurrency and zero values
//
// A Set is immutable once built and safe for concurrent use; so are the
// *Policy values it hands out, which callers must not modify. A nil or zero
// *Set is empty: Policies returns nothing, Get finds nothing and
// MatchDescriptors matches nothing. Reloading means building a new Set and
// swapping it in.
package policy
