// Package faultproxy is a TCP proxy for tests that injects network faults
// between a client and one upstream address: added latency, dropped bytes
// (a blackhole), closed connections and resets, all switchable while
// traffic flows.
//
// # Modes
//
//   - Pass forwards every byte, each chunk held back by the current latency
//     (Set Latency). Latency is per direction and does not accumulate: a
//     chunk read at t is written at t+latency, in order.
//   - Blackhole keeps every connection open but holds back what either side
//     sends, and accepts new connections without connecting them upstream:
//     a network partition. Nothing is lost: when the mode returns to Pass,
//     held bytes flow and held connections dial the upstream, as TCP
//     retransmission would deliver them after a partition heals; endpoints
//     whose own keepalives or deadlines ran out have closed by then.
//   - Drop closes every connection (FIN to both sides) and every new one as
//     soon as it is accepted: a process that went away.
//   - Reset does the same with a TCP reset (SO_LINGER 0): a crash or a
//     firewall rejecting.
//
// Switching to Drop or Reset affects the live connections at once;
// switching back to Pass lets new connections through (closed ones stay
// closed, as in real life).
//
// # Units and bounds
//
// Latency is a time.Duration. Each direction of a connection buffers at
// most MaxQueuedChunks chunks of at most ChunkSize bytes while they wait
// out the latency; a full queue stops reading from the sender (TCP back
// pressure). At most Config.MaxConns connections are proxied at once;
// more are closed on accept.
//
// # Concurrency and zero value
//
// A Proxy is safe for concurrent use. Start starts an accept goroutine and
// two goroutines per connection (plus one per direction for latency);
// Close stops and waits for all of them. The zero Proxy is not usable: use
// Start.
package faultproxy
