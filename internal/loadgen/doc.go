// Package loadgen drives Envoy's rate limit service API
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) over gRPC
// with a closed loop of concurrent callers, and measures what came back:
// requests and descriptor decisions per second, OK and OVER_LIMIT counts,
// errors, and latency quantiles. It also serves a "no-work" rate limit
// service that answers OK at once, the ceiling a real service is measured
// against, and (ServeRoundTrip) one that answers OK after one PING to
// Redis, the latency floor of a service that asks Redis once per check.
//
// RunRLQS drives a node's Rate Limit Quota Service instead: Streams
// Envoy-faithful clients (rlqs.Client), one stream each, decide requests
// locally from their assignments and report usage per bucket every
// ReportInterval; it reports the streams held, the decisions, and the
// usage reports per second, per second of the node's CPU when NodeCPU
// reads it (ProcessCPU reads /proc/<pid>/stat).
//
// # Units
//
// Latencies are time.Duration, recorded in a log-linear histogram with a
// relative error below 1/128 (0.8%). Rates are per second of the measured
// phase (after Warmup).
//
// # Load shape
//
// Each of Concurrency workers sends one request, waits for the answer and
// sends the next, until Requests have been sent or Duration has passed
// (one of them is required, both bound the run). Each request carries
// Descriptors descriptors for one subject, drawn from Subjects subjects
// uniformly or, with Zipf s > 0, with probability ∝ 1/rank^s. Descriptor i
// is the single entry {Key+i: subject} (Key alone when there is one
// descriptor).
//
// # Concurrency
//
// Run starts Concurrency goroutines and returns after all ended; RunRLQS
// one goroutine per stream (and the client's response reader). ServeNoop
// and ServeRoundTrip serve on their own goroutines until their context is
// done; ServeRoundTrip holds at most MaxRoundTripConns Redis connections.
// Memory is bounded by Subjects (at most MaxSubjects) plus one histogram
// per worker.
package loadgen
