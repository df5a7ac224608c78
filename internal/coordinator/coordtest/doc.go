// Package coordtest holds test helpers for the coordinator side: a fake
// region that speaks the etcdlayout contract (a leased registration,
// demand reports and acknowledgements) without buckets, so the rebalance
// loop, the operator API and end-to-end tests can drive it. It is for
// tests only. A Region is safe for concurrent use; its zero value is not
// usable (call NewRegion).
package coordtest
