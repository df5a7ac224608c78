package httplimit_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/quotacoord/quota/client"
	"github.com/quotacoord/quota/internal/logbuf"
	"github.com/quotacoord/quota/internal/redistest"
	"github.com/quotacoord/quota/internal/regional"
)

// nodePolicy is one policy of a test node: a token bucket that does not
// refill within a test, so counts are exact.
type nodePolicy struct {
	name     string
	subject  string // tenant, api_key, ip or any
	capacity int64
}

// startNode runs a real regional node (regional.Run) on the shared Redis
// with the given policies until the test ends and returns a client of it.
// Policy names get a per-test suffix so that tests sharing the Redis keep
// apart; the returned map gives each name's full form.
func startNode(t *testing.T, pols ...nodePolicy) (*client.Client, map[string]string) {
	t.Helper()
	suffix := strings.ReplaceAll(redistest.Unique(t), "-", "_")
	names := map[string]string{}
	var doc strings.Builder
	doc.WriteString("policies:\n")
	for _, p := range pols {
		full := p.name + "_" + suffix
		names[p.name] = full
		fmt.Fprintf(&doc, "  - name: %s\n    version: 1\n    subject: %s\n    capacity: %d\n    refill_per_second: 0.001\n    failure_mode: closed\n",
			full, p.subject, p.capacity)
	}
	path := filepath.Join(t.TempDir(), "policies.yaml")
	if err := os.WriteFile(path, []byte(doc.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	out := &logbuf.Buffer{}
	errc := make(chan error, 1)
	go func() {
		errc <- regional.Run(ctx, regional.DaemonConfig{Region: "test", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
			Policies: path, Redis: redistest.Addr(t),
			// A loaded test machine (-race, other packages) can take longer
			// than the production 5 ms per store call; a slow call would be
			// decided by the failure mode (closed) and read as a denial.
			StoreTimeout: 2 * time.Second,
			Logger:       hclog.New(&hclog.LoggerOptions{Name: "regional", Output: out, Level: hclog.Warn}), Announce: out})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-errc:
			if err != nil {
				t.Errorf("regional node: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Errorf("regional node did not stop")
		}
	})
	listening := regexp.MustCompile(`grpc listening on (\S+)`)
	deadline := time.Now().Add(15 * time.Second)
	var addr string
	for addr == "" {
		if m := listening.FindStringSubmatch(out.String()); m != nil {
			addr = m[1]
			break
		}
		select {
		case err := <-errc:
			errc <- err
			t.Fatalf("regional node returned before listening: %v\n%s", err, out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("regional node never listened:\n%s", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	c, err := client.New(addr, client.WithTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	// The node answers in its failure mode until it has reached Redis; a
	// check of a subject no test uses tells when it decides for real.
	for _, full := range names {
		for {
			d, err := c.Check(ctx, client.Request{Subject: "readiness", Policies: []string{full}})
			if err == nil && d.Degraded == "" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("regional node never decided %s from Redis: %+v %v\n%s", full, d, err, out.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return c, names
}
