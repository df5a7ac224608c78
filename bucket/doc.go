// Package bucket turns "capacity C, refill r per second, share f, cost w"
// into one atomic admission decision.
//
// Work in progress: the contract types live in bucket.go; the in-memory
// store, the Redis store and the key helpers are being written.
package bucket
