package bucket_test

import (
	"fmt"
	"time"

	"github.com/quotacoord/quota/bucket"
)

func ExampleMemory_TakeAt() {
	m, _ := bucket.NewMemory(bucket.MemoryConfig{})
	key, _ := bucket.NewKey("report-export", 1, "tenant-42")
	// 10 exports of burst, 1 per second, and this region holds 60% of it.
	limits := bucket.Limits{Capacity: 10, RefillPerSecond: 1, IdleTTL: time.Minute}
	now := time.Unix(1_800_000_000, 0)
	for _, cost := range []int64{4, 4} {
		d, _ := m.TakeAt(now, bucket.Request{Key: key, Limits: limits, Share: 0.6, Cost: cost})
		fmt.Printf("allowed=%v limit=%v remaining=%v retry=%v reset=%v\n", d.Allowed, d.Limit, d.Remaining, d.RetryAfter, d.ResetAfter)
	}
	// Output:
	// allowed=true limit=6 remaining=2 retry=0s reset=6.666667s
	// allowed=false limit=6 remaining=2 retry=3.333334s reset=6.666667s
}

func ExampleMemory_TakeAllAt() {
	m, _ := bucket.NewMemory(bucket.MemoryConfig{})
	tenant, _ := bucket.NewKey("tenant", 1, "acme")
	login, _ := bucket.NewKey("login", 1, "acme")
	reqs := []bucket.Request{
		{Key: tenant, Limits: bucket.Limits{Capacity: 100, RefillPerSecond: 10, IdleTTL: time.Minute}, Share: 1, Cost: 1},
		// 5 password attempts in any 10 minutes
		{Key: login, Limits: bucket.Limits{Algorithm: bucket.SlidingLog, Capacity: 5, Window: 10 * time.Minute, IdleTTL: 10 * time.Minute}, Share: 1, Cost: 1},
	}
	now := time.Unix(1_800_000_000, 0)
	for i := range 6 {
		ds, _ := m.TakeAllAt(now.Add(time.Duration(i)*time.Second), reqs)
		fmt.Println(ds[0].Allowed && ds[1].Allowed, ds[0].Remaining, ds[1].Remaining)
	}
	// Output:
	// true 99 4
	// true 99 3
	// true 99 2
	// true 99 1
	// true 99 0
	// false 100 0
}

func ExampleMemory_RefundAt() {
	m, _ := bucket.NewMemory(bucket.MemoryConfig{})
	key, _ := bucket.NewKey("upload-bytes", 1, "tenant-7")
	req := bucket.Request{Key: key, Limits: bucket.Limits{Capacity: 1000, RefillPerSecond: 100, IdleTTL: time.Minute}, Share: 1, Cost: 800}
	now := time.Unix(1_800_000_000, 0)
	d, _ := m.TakeAt(now, req)
	fmt.Println(d.Allowed, d.Remaining)
	// the upload failed: give the tokens back (never above capacity)
	d, _ = m.RefundAt(now, req)
	fmt.Println(d.Allowed, d.Remaining)
	// Output:
	// true 200
	// true 1000
}
