// Package tlsconfig builds server and client TLS configurations from PEM
// files (certificate, private key, CA bundle) and reloads them when the
// files change, so a rotated certificate or CA is used by the next
// connection without a restart.
//
// # How reloading works
//
// A Reloader holds the parsed files in an atomically swapped value. The
// configurations it builds never hold a certificate themselves: servers
// read the current one in GetConfigForClient (certificate and client CA
// pool together), clients in GetClientCertificate and VerifyConnection
// (the server's chain is verified against the current CA pool and the
// server name by hand, which is why InsecureSkipVerify is set on client
// configurations with a CA file). gRPC clients that dial several servers
// by address (an etcd cluster) use TransportCredentials, which builds a
// client configuration per handshake and verifies each server against the
// host it dialed. Etcd applies both to an etcd client configuration.
//
// Files are checked lazily: a handshake that finds the last check older
// than Config.CheckEvery (default 500 ms) reads the files (each at most
// MaxFileBytes, following symlinks, so Kubernetes secret volumes work), and
// when any changed byte for byte it parses them and swaps the new value in,
// while concurrent handshakes go on with the current value. A pair that does not parse (a
// certificate written before its key, a half-written file) keeps the last
// good value and is retried at the next check; the error is logged once
// per change and reported by Err. No goroutine is started, so nothing leaks
// and nothing needs stopping.
//
// # Invariants
//
// The served certificate and key always come from one successful parse of
// both files; the CA pool is never empty when a CA file is configured. A
// Reloader returned by New has loaded every configured file once.
//
// # Concurrency and zero value
//
// A Reloader is safe for concurrent use; the configurations it returns may
// be used by any number of listeners and dialers at once. The zero
// Reloader is not usable: build one with New.
package tlsconfig
