// Package testca issues throw-away certificates for tests: a CA made per
// test with New, and leaf certificates it signs with Issue (PEM bytes),
// IssueFiles (PEM files written key first) or IssueIdentity (a pair that
// also names client identities: URI SANs such as SPIFFE IDs, DNS SANs).
//
// Every certificate is ECDSA P-256, valid from an hour before to an hour
// after the moment it is made (wall clock: x509 verification reads it),
// and leaf certificates name 127.0.0.1, ::1 and localhost and serve both
// server and client authentication. Each certificate, CA or leaf, gets a
// serial number unique in the process, which Issue and IssueFiles return
// so that tests can tell a rotated certificate from its predecessor.
//
// A CA is safe for concurrent use once made; it has no useful zero value.
// Failures end the test through tb.Fatalf, never a panic. Files go into
// directories from tb.TempDir, removed when the test ends.
package testca
