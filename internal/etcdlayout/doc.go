// Package etcdlayout is the one place that says where the coordinator and
// the regional nodes keep things in etcd, and what each value holds. Both
// sides import it; nothing else builds an etcd key.
//
// # Keys
//
// Under one prefix (DefaultPrefix, "/quota/v1/"):
//
//	policies/{doc}            policy document as written by the operator (own YAML or Envoy config)
//	regions/{region}          Registration, under the region's lease
//	demand/{region}           DemandReport, under the region's lease
//	alloc/{policy}            Allocation: epoch, phase and shares (not leased)
//	acks/{region}             Ack: the epoch applied per policy, under the region's lease
//	control/{policy}          Control: operator pins, freeze, weights, minimums
//	settings                  Settings published by the coordinator (report interval, lease TTL)
//	election                  the coordinator election prefix
//	audit/{unix-nanos}-{seq}  AuditEntry, one per operator action
//
// Values are JSON. Published allocations do not depend on the coordinator's
// lease: a coordinator that dies leaves the last shares in force.
package etcdlayout
