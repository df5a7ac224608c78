package demand_test

import (
	"fmt"
	"time"

	"github.com/quotacoord/quota/internal/clock"
	"github.com/quotacoord/quota/internal/demand"
)

func ExampleRecorder_Snapshot() {
	clk := clock.NewManual(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	r, err := demand.New(demand.Config{Clock: clk, TopK: 2})
	if err != nil {
		fmt.Println(err)
		return
	}
	r.Record("exports", "tenant-a", 10, true, false)
	r.Record("exports", "tenant-b", 30, true, true)  // below half its bucket
	r.Record("exports", "tenant-b", 20, false, true) // denied

	d := r.Snapshot(clk.Advance(10 * time.Second))["exports"]
	fmt.Printf("offered %.0f/s admitted %.0f/s\n", d.Offered, d.Admitted)
	for _, s := range d.Pressured {
		fmt.Printf("%s offered %.0f/s admitted %.0f/s denied %v\n", s.Subject, s.Offered, s.Admitted, s.Denied)
	}
	// Output:
	// offered 6/s admitted 4/s
	// tenant-b offered 5/s admitted 3/s denied true
}
