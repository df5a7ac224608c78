package etcdlayout

// etcd refuses a request larger than its request limit (--max-request-bytes,
// 1.5 MiB by default) and a transaction with more operations or compares
// than --max-txn-ops (128 by default). Every multi-key write of the
// coordinator and the nodes stays within these bounds, so that a
// deployment runs on etcd's defaults with room to spare.
const (
	// MaxTxnOps is the most operations, and the most compares, one
	// transaction carries: etcd's default --max-txn-ops.
	MaxTxnOps = 128
	// MaxTxnBytes is the most bytes of keys and values one transaction
	// carries: a quarter of etcd's default request limit.
	MaxTxnBytes = 1536 * 1024 / 4
)

// Batches splits items of the given sizes (bytes), in order, into
// consecutive batches of at most maxOps items and maxBytes bytes each; an
// item larger than maxBytes makes a batch of its own. It returns the end
// index of each batch.
func Batches(sizes []int, maxOps, maxBytes int) []int {
	var ends []int
	n, bytes := 0, 0
	for i, s := range sizes {
		if n > 0 && (n+1 > maxOps || bytes+s > maxBytes) {
			ends = append(ends, i)
			n, bytes = 0, 0
		}
		n++
		bytes += s
	}
	if n > 0 {
		ends = append(ends, len(sizes))
	}
	return ends
}
