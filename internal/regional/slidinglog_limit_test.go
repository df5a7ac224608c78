package regional

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/quotacoord/quota/bucket"
)

// TestRunNamesTheSlidingLogLimit: a sliding log keeps one entry per
// admission, so its capacity is bounded (bucket.MaxSlidingLogCapacity); a
// node given a larger one refuses to start with an error that names the
// policy, the capacity and the limit, and the largest allowed capacity
// loads.
func TestRunNamesTheSlidingLogLimit(t *testing.T) {
	doc := func(capacity int64) string {
		path := filepath.Join(t.TempDir(), "policies.yaml")
		body := "policies:\n  - name: logins\n    subject: ip\n    algorithm: sliding_log\n    capacity: " +
			strconv.FormatInt(capacity, 10) + "\n    window: 1m\n    failure_mode: closed\n"
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	err := Run(context.Background(), DaemonConfig{Policies: doc(bucket.MaxSlidingLogCapacity + 1), GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"})
	limit := fmt.Sprintf("sliding log capacity %d above %d", bucket.MaxSlidingLogCapacity+1, bucket.MaxSlidingLogCapacity)
	for _, want := range []string{`policy "logins"`, limit} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("capacity above the limit: error %v, want one containing %q", err, want)
		}
	}
	c := DaemonConfig{Policies: doc(bucket.MaxSlidingLogCapacity)}
	_, _, _, stop := runNode(t, c)
	if err := stop(); err != nil {
		t.Errorf("capacity at the limit: %v", err)
	}
}
