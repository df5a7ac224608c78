// Package importgraph holds no code, only a test that keeps the project's
// import graph as designed: allocator imports the standard library only;
// bucket and sim stay free of etcd, gRPC, Prometheus and hclog; bucket is
// the only product package that imports the Redis client.
package importgraph
