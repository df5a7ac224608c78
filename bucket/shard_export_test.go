package bucket

// ShardParams returns sub-bucket i's capacity, fill (milli-tokens) and
// refill (milli-tokens per microsecond; the window in microseconds for
// window algorithms) for the whole bucket's req; i = -1 gives the whole
// bucket's. Tests only.
func ShardParams(req Request, i int) (lim, fill, rate float64) {
	if i >= 0 {
		req.Limits.shard = uint8(i + 1)
	}
	p := paramsOf(&req)
	return p.lim, p.fill, p.p
}

// ActiveShards is activeShards: the sub-buckets that hold anything.
var ActiveShards = activeShards

// ShardLocation returns where r keeps sub-bucket i of the sharded bucket
// of k under lim (see Location).
func ShardLocation(r *Redis, k Key, lim Limits, i int) (key, field string) {
	o := shardOps{groups: r.groups}
	sub := o.shardReq(&Request{Key: k, Limits: lim}, i)
	return r.Location(sub.Key, lim)
}
