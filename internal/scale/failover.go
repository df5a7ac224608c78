package scale

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/quotacoord/quota/internal/coordinator"
	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/faultproxy"
	"github.com/quotacoord/quota/internal/invariant"
)

// Failover is what killing the leader measured (Params.Failover).
type Failover struct {
	// Leading is how long after the leader was cut off from etcd the
	// standby led (the old leader's election session had to expire,
	// Params' session TTL), FirstRound how long after it led its first
	// round ended, and RoundTime that round's duration (an upper bucket
	// bound of the standby's round histogram).
	Leading, FirstRound, RoundTime time.Duration
	// FirstEpochs counts the policies whose allocation was written
	// between the cut and the end of the standby's first round: what the
	// takeover published (the cut-off leader writes nothing).
	FirstEpochs int64
	// Err says why the takeover was not measured ("" when it was).
	Err string
	// Invariant is the replay of the sampled policies' allocations,
	// every node's acknowledgements and registrations from etcd's first
	// revision to a few intervals after the new leader's first round.
	Invariant invariant.Report
}

// DefaultSessionTTL is the leaders' election session TTL in the harness
// (Params.SessionTTL): how long a killed leader keeps the lead.
const DefaultSessionTTL = 2 * time.Second

// kill cuts the leader (behind proxy) off from etcd, as a crash or a
// partition would: it cannot resign, its session expires after its TTL
// and standby campaigns. It waits for standby's first full round, and
// counts the allocations written meanwhile through cli.
func kill(ctx context.Context, cli *clientv3.Client, l etcdlayout.Layout, proxy *faultproxy.Proxy, standby *coordinator.Coordinator) (Failover, error) {
	var fo Failover
	before, err := scrape(standby.HTTPAddr)
	if err != nil {
		return fo, err
	}
	start := time.Now()
	if err := proxy.SetMode(faultproxy.Drop); err != nil {
		return fo, fmt.Errorf("scale: cut the leader off: %w", err)
	}
	cut, err := cli.Get(ctx, l.Settings(), clientv3.WithCountOnly())
	if err != nil {
		return fo, fmt.Errorf("scale: read the revision at the cut: %w", err)
	}
	deadline := start.Add(time.Minute)
	for !standby.Loop.IsLeader() {
		if ctx.Err() != nil || time.Now().After(deadline) {
			return fo, fmt.Errorf("scale: standby not leading %v after the leader was cut off", time.Since(start).Round(time.Millisecond))
		}
		time.Sleep(5 * time.Millisecond)
	}
	led := time.Now()
	fo.Leading = led.Sub(start)
	for {
		m, err := scrape(standby.HTTPAddr)
		if err != nil {
			return fo, err
		}
		if m.counter("quota_coordinator_rebalance_rounds_total", "kind", "full") > before.counter("quota_coordinator_rebalance_rounds_total", "kind", "full") {
			fo.FirstRound = time.Since(led)
			fo.RoundTime = m.quantile(before, "quota_coordinator_rebalance_round_seconds", 1)
			if fo.FirstEpochs, err = allocsWrittenAfter(ctx, cli, l, cut.Header.Revision); err != nil {
				return fo, err
			}
			return fo, nil
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return fo, fmt.Errorf("scale: the new leader's first round not done %v after it led", time.Since(led).Round(time.Millisecond))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// allocsWrittenAfter counts the policies whose allocation was written
// after revision rev.
func allocsWrittenAfter(ctx context.Context, cli *clientv3.Client, l etcdlayout.Layout, rev int64) (int64, error) {
	// Keys, not a count: etcd counts before it filters on the mod
	// revision.
	resp, err := cli.Get(ctx, l.AllocPrefix(), clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithMinModRev(rev+1))
	if err != nil {
		return 0, fmt.Errorf("scale: count the allocations written: %w", err)
	}
	return int64(len(resp.Kvs)), nil
}

// invariantWatch replays the deployment's history from etcd's first
// revision into an invariant.History, limited to the sampled policies so
// that a check costs those policies times the nodes: their allocations,
// the acknowledgement shards they fall in (cut down to their epochs), every
// registration and the policy documents. A check runs after each revision
// that changed a sampled allocation or a registration: only these can
// raise what a region may enforce (an acknowledgement only lowers it).
type invariantWatch struct {
	layout  etcdlayout.Layout
	sampled map[string]bool
	shards  map[int]bool
	h       *invariant.History
}

// replayInvariant replays the history up to the current revision (see
// invariantWatch). It runs after the takeover, so that reading the whole
// history does not compete with what is measured.
func replayInvariant(ctx context.Context, cli *clientv3.Client, l etcdlayout.Layout, sampled map[string]bool) (invariant.Report, error) {
	w := &invariantWatch{layout: l, sampled: sampled, shards: map[int]bool{}, h: invariant.NewHistory(l)}
	for p := range sampled {
		w.shards[etcdlayout.PolicyShard(p)] = true
	}
	head, err := cli.Get(ctx, l.Settings(), clientv3.WithCountOnly())
	if err != nil {
		return invariant.Report{}, fmt.Errorf("scale: invariant replay: %w", err)
	}
	end := head.Header.Revision
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := cli.Watch(wctx, l.Root(), clientv3.WithPrefix(), clientv3.WithRev(1))
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var cur int64
	check := false
	for {
		var wr clientv3.WatchResponse
		var ok bool
		select {
		case <-ctx.Done():
			return w.h.Report(), ctx.Err()
		case <-tick.C:
			// A progress notification says the watch caught up even when
			// the last revisions touched none of the keys replayed.
			_ = cli.RequestProgress(wctx)
			continue
		case wr, ok = <-wch:
		}
		if !ok {
			return w.h.Report(), fmt.Errorf("scale: invariant replay: watch closed before revision %d", end)
		}
		if err := wr.Err(); err != nil {
			return w.h.Report(), fmt.Errorf("scale: invariant replay: %w", err)
		}
		for _, ev := range wr.Events {
			if rev := ev.Kv.ModRevision; rev != cur {
				if check {
					w.h.Check(cur)
				}
				if rev > end {
					return w.h.Report(), nil
				}
				cur, check = rev, false
			}
			relevant, err := w.apply(ev)
			if err != nil {
				return w.h.Report(), err
			}
			check = check || relevant
		}
		if cur >= end || wr.IsProgressNotify() && wr.Header.Revision >= end {
			if check {
				w.h.Check(cur)
			}
			return w.h.Report(), nil
		}
	}
}

// apply feeds one event to the history, and reports whether it calls
// for a check.
func (w *invariantWatch) apply(ev *clientv3.Event) (bool, error) {
	l := w.layout
	key := string(ev.Kv.Key)
	del := ev.Type == mvccpb.DELETE
	switch {
	case strings.HasPrefix(key, l.PoliciesPrefix()):
	case strings.HasPrefix(key, l.RegionsPrefix()):
		if del {
			w.h.Delete(key)
			return true, nil
		}
		return true, w.h.Put(key, ev.Kv.Value, ev.Kv.Version == 1)
	case strings.HasPrefix(key, l.AllocPrefix()):
		if !w.sampled[etcdlayout.Name(l.AllocPrefix(), key)] {
			return false, nil
		}
		if del {
			w.h.Delete(key)
			return true, nil
		}
		return true, w.h.Put(key, ev.Kv.Value, ev.Kv.Version == 1)
	case strings.HasPrefix(key, l.AcksPrefix()):
		_, _, shard, err := etcdlayout.ShardOf(l.AcksPrefix(), key)
		if err != nil || !w.shards[shard] {
			return false, nil
		}
		if del {
			w.h.Delete(key)
			return false, nil
		}
		_, _, _, a, err := l.DecodeAck(key, ev.Kv.Value)
		if err != nil {
			return false, fmt.Errorf("scale: invariant replay: %w", err)
		}
		kept := map[string]uint64{}
		for p, e := range a.Epochs {
			if w.sampled[p] {
				kept[p] = e
			}
		}
		a.Epochs = kept
		value, _ := json.Marshal(a)
		return false, w.h.Put(key, value, ev.Kv.Version == 1)
	default:
		return false, nil
	}
	if del {
		w.h.Delete(key)
		return false, nil
	}
	return false, w.h.Put(key, ev.Kv.Value, ev.Kv.Version == 1)
}

// FailoverHeader is the markdown header of FailoverRow.
const FailoverHeader = "| policies | regions | nodes | cut off → standby leads | leads → first round done | first round | epochs in the first round | rebalance interval | invariant (sampled policies) | command |\n" +
	"|---|---|---|---|---|---|---|---|---|---|"

// FailoverRow is a run's failover as a markdown row, with its command.
func FailoverRow(r Result, command string) string {
	fo := r.Failover
	if fo.Err != "" {
		return fmt.Sprintf("| %d | %d | %d | %s | | | | %v | | `%s` |", r.Params.Policies, r.Params.Regions, r.Params.Regions*r.Params.NodesPerRegion,
			fo.Err, r.Params.RebalanceInterval, command)
	}
	inv := fmt.Sprintf("%d violations, max Σ %.3f over %d checks, %d epochs", len(fo.Invariant.Violations), fo.Invariant.MaxSum, fo.Invariant.Revisions, fo.Invariant.Epochs)
	return fmt.Sprintf("| %d | %d | %d | %v | %v | %v | %d | %v | %s | `%s` |",
		r.Params.Policies, r.Params.Regions, r.Params.Regions*r.Params.NodesPerRegion,
		fo.Leading.Round(time.Millisecond), fo.FirstRound.Round(time.Millisecond), roundTime(fo.RoundTime), fo.FirstEpochs, r.Params.RebalanceInterval, inv, command)
}
