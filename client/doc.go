// Package client is the Go client of a regional node's admission API
// (proto/quota/v1, service quota.v1.Admission).
//
// A Client checks whether a subject may spend a cost under one or more
// policies and returns a Decision: allowed or not, the limit and remaining
// budget of the deciding bucket, and how long to wait (RetryAfter) or until
// the bucket is full again (ResetAfter). A denial is a Decision, never an
// error.
//
// # When the node cannot answer
//
// Every check has a deadline (WithTimeout, default 250ms). When the node is
// unreachable, times out or fails internally, the client applies its own
// choice (WithUnreachable): return the error (the default), admit
// (UnreachableOpen) or deny (UnreachableClosed). A decision made that way
// has Degraded set to "client_open" or "client_closed" and Cause holding
// the error, so callers can count and log it. Errors that say the request
// itself is wrong (InvalidArgument, NotFound, permission errors) and the
// caller's own cancellation are always returned as errors.
//
// # Emergency buckets
//
// With WithEmergency the client keeps, per policy listed and subject, an
// in-process bucket (package bucket's Memory, the specification of the
// node's Redis buckets) sized as the region's share of the policy divided
// by the expected number of clients (Emergency.Clients). It decides only
// while the node is unreachable (Unavailable, or the client's timeout):
// Degraded "client_local", Allowed by that bucket, all or nothing across
// the check's policies. The region's share comes from the node's last
// answer naming the policy; the policy's limits (refill, window) from the
// configuration, since the admission API reports only the share and the
// region's capacity. A check the buckets cannot decide (a policy without
// one, a share not yet known, the bucket cap reached) and every other
// node failure go to the unreachable mode, which stays as above. While
// the node answers, the buckets are neither consulted nor charged.
// WithRegisterer counts the decisions made without the node in
// quota_client_local_decisions_total{outcome} (local_allowed,
// local_denied, open, closed).
//
// # Units
//
// Cost, Limit and Remaining are cost units (tokens, requests) of the
// policy; durations are time.Duration.
//
// # Concurrency and zero value
//
// A Client is safe for concurrent use by many goroutines and holds one
// gRPC connection; New starts the gRPC connection's goroutines and Close
// stops them. The zero Client is not usable: build one with New.
package client
