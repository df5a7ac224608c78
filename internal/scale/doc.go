// Package scale measures the control plane at scale: it starts the real
// coordinator (internal/coordinator, with its embedded etcd) and many
// regional nodes in one process, each a real regionsync.Syncer speaking
// the node protocol (registration, allocation watch, demand reports,
// acknowledgements) without Redis, fed by a synthetic demand that moves
// between regions, and reports how the round, the etcd traffic and the
// nodes' view of the shares grow with policies, regions and nodes.
//
// cmd/scale wires flags to Run; `make scale` runs its points and writes
// the table in docs/scale.md.
package scale
