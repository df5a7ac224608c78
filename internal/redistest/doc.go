// Package redistest gives tests a real redis-server.
//
// Shared returns the server that `make test` started (REDIS_ADDR); when
// REDIS_ADDR is unset it starts one private redis-server per test binary
// on a free loopback port. Start runs a separate server owned by one test,
// for tests that stop, restart or reconfigure it; StartCluster a Redis
// Cluster of three masters; StartSentinels a primary, its replica and three
// Sentinels (`redis-server sentinel.conf --sentinel`). A missing
// redis-server binary is a test failure, never a skip.
//
// Tests share a server by giving their keys a unique part (Unique), not by
// FLUSHDB.
package redistest
