// Package coordinator wires one coordinator process: an etcd client (or an
// embedded etcd server in a data directory that regional nodes can join),
// the rebalance loop, the operator gRPC API with health checking (and
// reflection when asked for), and an HTTP server for /metrics and /healthz
// (loopback by default; /healthz logs etcd's error rather than answering
// with it).
//
// # Authentication
//
// Every operator call needs a credential; health and reflection do not.
// A bearer token ("authorization: Bearer TOKEN") is looked up in the token
// file, one "ROLE:TOKEN" per line, ROLE being read or write ('#' starts a
// comment). When the file does not exist, Start creates it with mode 0600
// and one random write token. A verified mTLS client certificate (when
// ClientCA is set) grants read, and write when its common name is listed
// in WriteNames ("*" lists every name). Reads are ListPolicies,
// ShowPolicy, ShowAllocation, DryRun and ListAudit; everything else is a
// write and is recorded in the audit log (at most AuditMax entries are
// kept). Refused calls are logged with the method and peer.
//
// The operator API listens on loopback unless it has TLS or
// InsecureOperatorPlaintext: tokens must not cross a network in the clear.
//
// # etcd
//
// With EtcdEndpoints the coordinator joins an etcd cluster, over TLS or
// mutual TLS when the etcd TLS settings are given (certificate files are
// re-read for new connections). Without, it starts an embedded single
// member in DataDir that serves clients on the embedded address, plain on
// loopback or over (mutual) TLS; its log goes to DataDir/etcd.log, size
// capped, not to stderr.
//
// # Concurrency and zero values
//
// Start returns a running Coordinator; Wait blocks until the context given
// to Start ends and everything stopped. Config's zero fields take the
// defaults its field comments list; the zero Coordinator is not usable.
package coordinator
