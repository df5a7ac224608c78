// Package etcdauth defines the etcd users and roles of a deployment and
// creates them, so that no credential a regional node holds can rewrite
// allocations, policies, controls or the audit log, or another node's
// keys.
//
// # Roles
//
// Every key lives under one prefix (etcdlayout.Layout). The coordinator's
// role reads and writes the whole prefix: it publishes allocations, runs
// the election, stores policies, controls and the audit log for the
// operator API. A node's role, one per node, writes exactly three keys,
// its own registration, demand report and acknowledgement
// (regions/{region}/{node}, demand/{region}/{node}, acks/{region}/{node}),
// and reads what a node follows: allocations, policies and the published
// settings. It reads nothing else (no other node's reports, no controls,
// no audit log) and writes nothing else.
//
// Leases need no key permission in etcd; revoking a lease needs write
// permission on every key attached to it, which a node has for its own
// keys only.
//
// # Users
//
// The coordinator's user is named by the operator; a node's user is
// NodeUser(region, node), "quota-node/{region}/{node}" ("/" cannot occur
// in a region or node name, so two nodes never share a user). A node or
// coordinator authenticates with that user's password, or with a client
// certificate whose common name is the user name when etcd runs with
// --client-cert-auth.
//
// Ensure and EnableAuth are idempotent: running them again grants what is
// missing and changes the password to the one given. They are safe for
// concurrent use only in that etcd serializes them.
package etcdauth
