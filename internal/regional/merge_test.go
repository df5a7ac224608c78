package regional

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quotacoord/quota/internal/redistest"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

// TestMainRedisMerge: -redis-merge reaches the Redis store. 320 checks
// from 64 concurrent callers take one script call each with -redis-merge
// 1, and fewer calls than checks with the default.
func TestMainRedisMerge(t *testing.T) {
	const callers, each = 64, 5
	for _, tc := range []struct {
		merge  int
		merged bool
	}{{1, false}, {0, true}} {
		t.Run(fmt.Sprint("merge=", tc.merge), func(t *testing.T) {
			srv := redistest.Start(t)
			rc := srv.Client(t)
			g, _, out, stop := runNode(t, DaemonConfig{Policies: "../../examples/policies", Redis: srv.Addr,
				RedisMerge: tc.merge, StoreTimeout: 5 * time.Second})
			defer func() {
				if err := stop(); err != nil {
					t.Errorf("Run: %v\n%s", err, out.String())
				}
			}()
			conn, err := grpc.NewClient(g, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ac := quotav1.NewAdmissionClient(conn)
			ctx := ctxT(t)
			// One check first: the script is loaded and the connection up.
			if _, err := ac.Check(ctx, &quotav1.CheckRequest{Subject: "warm", Policies: []string{"exports"}}); err != nil {
				t.Fatal(err)
			}
			before := redistest.ScriptCalls(t, rc)
			var wg sync.WaitGroup
			errs := make(chan error, callers)
			for i := range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for j := range each {
						r, err := ac.Check(ctx, &quotav1.CheckRequest{Subject: fmt.Sprintf("s%d-%d", i, j), Policies: []string{"exports"}})
						if err == nil && !r.Allowed {
							err = fmt.Errorf("first check of a fresh subject denied: %v", r)
						}
						if err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			calls := redistest.ScriptCalls(t, rc) - before
			t.Logf("%d checks, %d script calls", callers*each, calls)
			if tc.merged && calls >= callers*each {
				t.Fatalf("default -redis-merge: %d script calls for %d checks, none merged", calls, callers*each)
			}
			if !tc.merged && calls < callers*each {
				t.Fatalf("-redis-merge 1: %d script calls for %d checks, some merged", calls, callers*each)
			}
		})
	}
}

// TestMainLossGuard: -loss-guard reaches the Redis store. A new Redis
// reads as one that lost its state: the first check of a subject is
// denied (its bucket starts empty for a refill time) and the group's loss
// marker is written; without the flag the same check is admitted.
func TestMainLossGuard(t *testing.T) {
	for _, guard := range []bool{false, true} {
		t.Run(fmt.Sprint("guard=", guard), func(t *testing.T) {
			srv := redistest.Start(t)
			rc := srv.Client(t)
			ac, _, _ := nodeAdmission(t, DaemonConfig{Policies: "../../examples/policies", Redis: srv.Addr,
				LossGuard: guard, StoreTimeout: 5 * time.Second})
			ctx := ctxT(t)
			r, err := ac.Check(ctx, &quotav1.CheckRequest{Subject: "acme", Policies: []string{"exports"}})
			if err != nil {
				t.Fatal(err)
			}
			if r.Allowed == guard || r.Degraded != "" {
				t.Fatalf("first check on a new Redis: %v, want allowed %v", r, !guard)
			}
			markers, err := rc.Keys(ctx, "rl:m:*").Result()
			if err != nil {
				t.Fatal(err)
			}
			if (len(markers) == 1) != guard {
				t.Fatalf("loss markers %v with guard %v", markers, guard)
			}
		})
	}
}
