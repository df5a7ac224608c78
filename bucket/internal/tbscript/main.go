// Command tbscript prints the token-bucket script that bucket.Redis loads,
// for scripts/bench-bucket.sh to time with redis-benchmark.
package main

import (
	"fmt"

	"github.com/quotacoord/quota/bucket"
)

func main() { fmt.Print(bucket.TokenBucketScript()) }
