// Package importgraph holds no code, only tests that keep the project's
// import graph as designed: allocator imports the standard library only;
// bucket and sim stay free of etcd, gRPC, Prometheus and hclog; bucket is
// the only product package that imports the Redis client; and no exported
// identifier of a public package (every package outside internal/ and
// cmd/) mentions an internal type.
package importgraph
