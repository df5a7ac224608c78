package logbuf_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/quotacoord/quota/internal/logbuf"
)

func TestBufferBoundAndConcurrency(t *testing.T) {
	b := &logbuf.Buffer{Max: 100}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 10 {
				if n, err := fmt.Fprintf(b, "g%d-%d\n", g, i); err != nil || n == 0 {
					t.Errorf("write: %d, %v", n, err)
				}
				_ = b.String()
			}
		}()
	}
	wg.Wait()
	// 40 lines of 5 bytes: 20 fit under 100 bytes, 20 are dropped.
	if kept, dropped := len(b.String()), b.Dropped(); kept != 100 || dropped != 100 {
		t.Fatalf("kept %d, dropped %d bytes; want 100 and 100", kept, dropped)
	}
}

func ExampleBuffer() {
	var b logbuf.Buffer // Max 0: DefaultMax
	fmt.Fprintln(&b, "node ready")
	fmt.Print(b.String())
	// Output: node ready
}
