// Package etcdlayout is the one place that says where the coordinator and
// the regional nodes keep things in etcd, and what each value holds. Both
// sides import it; nothing else builds an etcd key.
//
// # Keys
//
// Under one prefix (DefaultPrefix, "/quota/v1/"):
//
//	policies/{doc}            policy document as written by the operator (own YAML or Envoy config)
//	regions/{region}/{node}   Registration, under the node's lease
//	demand/{region}/{node}/{shard}  DemandReport of the node's policies in shard (three hex digits), under the node's lease
//	alloc/{policy}            Allocation: epoch, phase and shares (not leased)
//	acks/{region}/{node}/{shard}    Ack: the epoch applied per policy in shard (two hex digits), under the node's lease
//	control/{policy}          Control: operator pins, freeze, weights, minimums
//	settings                  Settings published by the coordinator (report interval, lease TTL)
//	election                  the coordinator election prefix
//	audit/{unix-nanos}-{seq}  AuditEntry, one per operator action
//	subject-salt              the HMAC key of hashed subjects, created once by the first node (raw bytes, not JSON)
//
// A region runs one or more nodes (admission servers sharing the region's
// Redis); each writes its own registration, demand and acknowledgement, so
// nodes never overwrite each other and one node stopping does not take its
// region's registration with it. Region names and node ids are
// [A-Za-z0-9_.-]{1,64} (ValidName). A region is live while any node is
// registered; its demand is the sum over its nodes; it has acknowledged an
// epoch when every live node has.
//
// A node's demand report is split into DemandShards records by policy
// (PolicyDemandShard, three hex digits in the key) and its acknowledgement
// into Shards records (PolicyShard, two hex digits), and a node rewrites
// only the records that changed: records stay far below etcd's request
// limit at thousands of policies, and the bytes written follow the
// policies that changed rather than how many policies a node has. A
// reader merges a node's records (MergeAck, MergeDemand).
//
// The keys one node writes are bounded whatever its input: one
// registration, at most DemandShards demand records and at most Shards
// acknowledgement records (4,353 keys); readers accept no other shard
// key. During a rolling upgrade a reader also accepts demand records of
// the layout before (LegacyDemandShards records, two hex digits), up to
// 256 more keys per node until the old process's lease ends, and counts a
// node with records in both layouts once (DemandIn). A record at
// {region}/{node} without a shard is the older one-record format: readers
// reject it (ErrOldFormat) and say so, they never mix it with shards.
//
// Values are JSON. Published allocations do not depend on the coordinator's
// lease: a coordinator that dies leaves the last shares in force.
package etcdlayout
