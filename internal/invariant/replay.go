package invariant

import (
	"context"
	"fmt"
	"time"

	"github.com/quotacoord/quota/internal/etcdlayout"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Replay reads every revision of layout's keys from revision 1 to the
// current one through a watch and checks the invariant after each
// revision that touched alloc/, acks/, regions/ or policies/. It fails when the
// history is compacted or a record does not parse. It starts no goroutine
// that outlives the call.
func Replay(ctx context.Context, cli *clientv3.Client, layout etcdlayout.Layout) (Report, error) {
	head, err := cli.Get(ctx, layout.Settings(), clientv3.WithCountOnly())
	if err != nil {
		return Report{}, fmt.Errorf("invariant: read head revision: %w", err)
	}
	end := head.Header.Revision
	h := NewHistory(layout)
	if end <= 1 {
		return h.Report(), nil
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	prefix := layout.Prefix
	if prefix == "" {
		prefix = etcdlayout.DefaultPrefix
	}
	wch := cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(1))
	var cur int64
	relevant := false
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for done := false; !done; {
		var resp clientv3.WatchResponse
		var ok bool
		select {
		case <-ctx.Done():
			return h.Report(), fmt.Errorf("invariant: replay: %w", ctx.Err())
		case <-tick.C:
			// A progress notification tells us the watch has caught up
			// even when the last revision touched no key of ours.
			_ = cli.RequestProgress(wctx)
			continue
		case resp, ok = <-wch:
		}
		if !ok {
			return h.Report(), fmt.Errorf("invariant: watch history closed before revision %d", end)
		}
		if err := resp.Err(); err != nil {
			return h.Report(), fmt.Errorf("invariant: watch history: %w", err)
		}
		for _, ev := range resp.Events {
			rev := ev.Kv.ModRevision
			if rev > end {
				done = true
				break
			}
			if rev != cur {
				if relevant {
					h.Check(cur)
				}
				cur, relevant = rev, false
			}
			if rev == end {
				done = true
			}
			key := string(ev.Kv.Key)
			if !isTracked(layout, key) {
				continue
			}
			relevant = true
			switch ev.Type {
			case mvccpb.PUT:
				if err := h.Put(key, ev.Kv.Value, ev.Kv.Version == 1); err != nil {
					return h.Report(), fmt.Errorf("invariant: at revision %d: %w", rev, err)
				}
			case mvccpb.DELETE:
				h.Delete(key)
			}
		}
		if resp.IsProgressNotify() && resp.Header.Revision >= end {
			done = true
		}
	}
	if relevant {
		h.Check(cur)
	}
	if err := ctx.Err(); err != nil {
		return h.Report(), fmt.Errorf("invariant: replay: %w", err)
	}
	return h.Report(), nil
}

func isTracked(l etcdlayout.Layout, key string) bool {
	return etcdlayout.Name(l.PoliciesPrefix(), key) != "" ||
		etcdlayout.Name(l.AllocPrefix(), key) != "" ||
		etcdlayout.Name(l.AcksPrefix(), key) != "" ||
		etcdlayout.Name(l.RegionsPrefix(), key) != ""
}
