package bucket_test

import (
	"fmt"
	"time"

	"github.com/quotacoord/quota/bucket"
)

// A State is one bucket held by its owner: the same decisions as Memory,
// with the limits validated once by Prepare.
func ExampleState_TakeAt() {
	lim, err := bucket.Prepare(bucket.Limits{Capacity: 3, RefillPerSecond: 1, IdleTTL: time.Minute})
	if err != nil {
		panic(err)
	}
	subjects := make([]bucket.State, 2) // indexed by subject
	now := time.Unix(1_800_000_000, 0)
	for i := 0; i < 4; i++ {
		d, _ := subjects[0].TakeAt(now, &lim, 1, 1)
		fmt.Println(d.Allowed, d.Remaining)
	}
	d, _ := subjects[1].TakeAt(now, &lim, 0.5, 1) // half the budget: capacity 1.5
	fmt.Println(d.Allowed, d.Limit, d.Remaining)
	// Output:
	// true 2
	// true 1
	// true 0
	// false 0
	// true 1.5 0.5
}
