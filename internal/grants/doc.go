// Package grants says what a caller of a regional node's admission API
// may do: who the caller is (Identify, from the verified client
// certificate of a mutual TLS connection or from a bearer token) and
// which actions it may take on which policies (Grants, from a YAML or
// JSON file).
//
// # Actions
//
//   - check: charge a policy's bucket (own API Check, CheckBatch and
//     each CheckAll charge, an Envoy descriptor).
//   - peek: read a policy's bucket without charging it (own API peek): it
//     tells anyone the remaining budget of any subject.
//   - refund: give tokens back (own API Refund, Envoy is_negative_hits):
//     it lifts a limit for whoever may send it.
//   - override: replace a matched rule with a limit of the caller's own
//     (Envoy's per-descriptor limit).
//
// A refund or override is granted per policy: the policy whose rule the
// descriptor matched. Without a grants file every caller may check every
// policy and do nothing else (Default).
//
// # Identities
//
// A caller has every identity it proves, and gets the union of their
// grants and of the default grants:
//
//   - "spiffe://trust-domain/path" or any other URI: a URI SAN of the
//     client certificate (a SPIFFE ID is one), verified against the
//     node's client CA;
//   - "dns:NAME": a DNS SAN of the verified client certificate;
//   - "token:NAME": a bearer token ("authorization: Bearer TOKEN"
//     metadata) listed under NAME in the tokens file (Tokens).
//
// A caller that proves nothing is anonymous and gets the default grants.
//
// # Files
//
// The grants file (YAML, or JSON which is YAML too):
//
//	# every caller, identified or not; absent = check on every policy
//	default:
//	  - actions: [check]
//	    policies: ["*"]
//	callers:
//	  - identities: ["spiffe://cluster.local/ns/edge/sa/envoy", "dns:envoy.edge.svc"]
//	    grants:
//	      - actions: [check, refund, override]
//	        policies: ["*"]
//	  - identities: ["token:billing"]
//	    grants:
//	      - actions: [peek]
//	        policies: [exports, api]
//
// An unknown field, action or identity form is an error, so that a typo
// never grants nothing silently (or everything). "*" stands for every
// policy. The tokens file has one "NAME TOKEN" pair per line (blank lines
// and lines starting with # ignored); tokens are at least MinTokenLen
// bytes and only their SHA-256 is kept.
//
// # Concurrency and zero values
//
// Grants, Perms and Tokens are immutable once built and safe for
// concurrent use. The zero Perms allows nothing; a nil *Tokens knows no
// token.
package grants
