// Package rlqs serves Envoy's Rate Limit Quota Service
// (envoy.service.rate_limit_quota.v3, StreamRateLimitQuotas) on a regional
// node: each Envoy reports its usage per bucket and enforces, locally, a
// token bucket the server assigns it. Assignments follow each Envoy's
// reported demand and never add up to more than the region's share: each
// is a lease carved out of the region's bucket (bucket.Leaser), so the
// Envoys of the region and the node's Redis-backed checks together admit
// no more than the region's bucket alone would (docs/rlqs.md).
//
// # Protocol
//
// The first message of a stream names the domain; a later message naming
// another closes the stream (InvalidArgument). A bucket id's first report
// subscribes it: its entries, ordered by Config.KeyOrder and then by key,
// form a descriptor matched against the policies' Envoy domains exactly as
// the Envoy rate limit service matches one (policy.Set.Match, same subject
// naming). No rule, an unlimited, shadow or replaced rule: ALLOW_ALL. A
// token-bucket rule (rate_limit.burst): leased token buckets. Anything
// else gets no assignment, so the filter's no-assignment behaviour applies.
//
// Every Interval the server re-splits each bucket's leasable rate, the
// region's refill f·r less Config.Reserve, among its Envoys, max-min fair
// by demand (allowed + denied per elapsed second, smoothed; a
// time_elapsed of 0 is replaced by the time the server measured, or the
// interval for a first report), with package allocator. It sends every
// stream, unasked, one response holding each of its buckets' actions:
//
//   - a token_bucket with whole-second fill_interval (the filter truncates
//     fractions): ⌊rate⌋ tokens per second, or one token every ⌈1/rate⌉
//     seconds; max_tokens one fill, at most f·C; TTL Config.TTL, whole
//     seconds;
//   - the same assignment again when it is unchanged and still live at
//     the Envoy when it arrives: the filter then keeps its tokens, and the
//     lease is renewed without taking its burst again; any other change
//     makes the filter start a new, full bucket, so the server takes a
//     fresh lease whose burst is charged to the region's bucket;
//   - DENY_ALL when the region's bucket cannot fund a lease (no share, a
//     rate below one token per MaxFillInterval, no tokens for the burst);
//   - abandon_action for a bucket whose reports showed no request for
//     IdleAfter, unless its stream stalls (Server.stalled); its lease
//     ends a TTL plus the margin later.
//
// Drain (when Run ends) sends every assignment again with TTL 0, so the
// Envoys fall back to their expired-assignment behaviour before the node
// stops.
//
// # Leases and the shrink rule
//
// A lease lasts TTL + Margin from when its assignment is sent (Margin
// bounds the delivery time; the bound rests on it). A node acknowledges a
// shrink of a region's share only after every lease taken above the new
// share has ended: HeldAbove tells regionsync when that is. A lease taken
// at a share that has since shrunk is not renewed; the next round takes a
// fresh one at the new share and the old one is counted to its own end
// (its Envoy may never receive the change).
//
// # Bounds
//
// At most MaxStreams streams (more: ResourceExhausted), MaxBuckets buckets
// per stream (more get no assignment), MaxBucketIDBytes and
// MaxBucketIDEntries per bucket id (more: InvalidArgument), MaxConsumers
// Envoys per bucket.
//
// # Concurrency
//
// A Server is safe for concurrent use; each stream runs one goroutine
// besides its handler (reading reports). Run owns the rounds; Step runs
// one, for tests that drive time themselves. Client (an Envoy-faithful
// client for tests and load generators) is safe for concurrent use and
// starts one goroutine per stream.
package rlqs
