package rebalance

import (
	"context"
	"encoding/json"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/quotacoord/quota/internal/coordinator/coordtest"
	"github.com/quotacoord/quota/internal/etcdlayout"
)

// TestOldFormatRecordsRejected: a node that writes its acknowledgement and
// demand as one record per node (the format before shards) is not
// counted, and the leader says why, naming the key.
func TestOldFormatRecordsRejected(t *testing.T) {
	e := newEnv(t, "a", "b")
	ctx := context.Background()
	var logs strings.Builder
	var mu sync.Mutex
	l, err := New(Config{Client: e.cli, Name: "c1", Logger: hclog.New(&hclog.LoggerOptions{Output: lockedWriter{&mu, &logs}})})
	if err != nil {
		t.Fatal(err)
	}
	old := coordtest.NewNode(e.cli, e.layout, "b", "old")
	if err := old.Register(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(old.Kill)
	for key, v := range map[string]any{
		e.layout.AcksPrefix() + "b/old":   etcdlayout.Ack{Region: "b", Node: "old", Epochs: map[string]uint64{"exports": 5}},
		e.layout.DemandPrefix() + "b/old": etcdlayout.DemandReport{Region: "b", Node: "old", Policies: map[string]etcdlayout.PolicyDemand{"exports": {Offered: 1000}}},
	} {
		b, _ := json.Marshal(v)
		if _, err := e.cli.Put(ctx, key, string(b)); err != nil {
			t.Fatal(err)
		}
	}
	snap, err := l.read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n, ok := snap.view.Regions["b"]["old"]; !ok || n.Acked["exports"] != 0 {
		t.Errorf("old-format node: registered %v, acknowledged %v; want registered, nothing acknowledged", ok, n.Acked)
	}
	if got := snap.view.Demand["b"]["exports"].Offered; got != 5 {
		t.Errorf("region b offers %v, want 5 (the old-format report left out)", got)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, key := range []string{"acks/b/old", "demand/b/old"} {
		if !strings.Contains(logs.String(), "old one-record format") || !strings.Contains(logs.String(), key) {
			t.Errorf("log does not name the old-format record %s:\n%s", key, logs.String())
		}
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(p)
}
