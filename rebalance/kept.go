package rebalance

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// kept is the lead's copy of the records (mirror) and the watch that
// keeps it: one watch of the deployment's prefix from the revision after
// the read that filled the copy. Only the lead goroutine uses it.
type kept struct {
	m *mirror
	q *watchQueue
	// wctx is the watch's context (its stream, for progress requests).
	wctx   context.Context
	cancel context.CancelFunc
	// back has a value when a region back from having no registered node
	// wrote its first demand report (plan.Leader.ReportArrived): worth a
	// full round now.
	back chan struct{}
	// resyncs counts the reads that filled the copy again.
	resyncs int
}

// keep reads every record and starts the watch that keeps them.
func (l *Loop) keep(ctx context.Context) (*kept, error) {
	k := &kept{back: make(chan struct{}, 1)}
	if err := l.resync(ctx, k, true); err != nil {
		return nil, err
	}
	return k, nil
}

// stop ends the watch.
func (k *kept) stop() {
	if k.cancel != nil {
		k.cancel()
	}
}

// resync fills the copy again from a read, and restarts the watch from
// the read's revision when rewatch (the watch was compacted, or none
// runs yet). A watch kept running delivers events the read already holds:
// the mirror skips them (mirror.apply).
func (l *Loop) resync(ctx context.Context, k *kept, rewatch bool) error {
	m, err := l.readMirror(ctx)
	if err != nil {
		return err
	}
	k.m = m
	k.resyncs++
	l.m.resyncs.Inc()
	if rewatch {
		l.watch(ctx, k)
	}
	return nil
}

// watch (re)starts the watch of every record from the revision after
// the copy's.
func (l *Loop) watch(ctx context.Context, k *kept) {
	k.stop()
	wctx, cancel := context.WithCancel(ctx)
	k.wctx, k.cancel = wctx, cancel
	ly := l.layout
	k.q = queueWatch(l.cfg.Client.Watch(wctx, ly.Root(), clientv3.WithPrefix(), clientv3.WithRev(k.m.rev+1)),
		func(ev *clientv3.Event) any { return prepareShard(ly, ev) }, maxQueued)
}

// take applies every queued watch response to the copy, marking in ds
// the policies whose demand or acknowledgements changed, telling the
// planner of nodes that lost their registration, and signalling k.back. It
// reports whether acknowledgements or registrations changed (a round is
// owed). A compacted watch, or one whose queue overflowed (watchQueue),
// fills the copy again and restarts (every policy is then planned: what
// changed in the events lost is unknown). A
// watch that fails otherwise, or closes, ends the lead (watchEnded).
func (l *Loop) take(ctx context.Context, k *kept, ds *dirtySet) (owed bool, err error) {
	resps, prepared, overflowed, closed := k.q.take()
	if overflowed {
		l.cfg.Logger.Warn("watch of the records more than the queue holds behind; reading them again", "at", k.m.rev, "bound_bytes", maxQueued)
		ds.everything()
		return true, l.resync(ctx, k, true)
	}
	for i, wr := range resps {
		if wr.CompactRevision != 0 {
			l.cfg.Logger.Warn("watch of the records compacted; reading them again", "compact_revision", wr.CompactRevision, "at", k.m.rev)
			ds.everything()
			return true, l.resync(ctx, k, true)
		}
		if end, err := watchEnded(ctx, "records", wr, true); end {
			if err == nil {
				err = ctx.Err()
			}
			return false, err
		}
		if wr.IsProgressNotify() {
			// Every event up to the notification's revision was sent.
			k.m.rev = max(k.m.rev, wr.Header.Revision)
			continue
		}
		owed = l.applyEvents(k, ds, wr.Events, prepared[i]) || owed
	}
	if closed {
		_, err := watchEnded(ctx, "records", clientv3.WatchResponse{}, false)
		if err == nil {
			err = ctx.Err()
		}
		return owed, err
	}
	return owed, nil
}

// applyEvents applies evs to the copy (take).
func (l *Loop) applyEvents(k *kept, ds *dirtySet, evs []*clientv3.Event, prepared []any) (owed bool) {
	now := l.cfg.Clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, ev := range evs {
		switch c, region := k.m.apply(ev, prepared[i], ds); c {
		case changedRegistration:
			owed = true
			if ev.Type == clientv3.EventTypeDelete && region != "" {
				// A node that registers and vanishes between two rounds
				// still makes growth in its region wait the skew margin.
				l.ld.NodeGone(region, now)
			}
		case changedAcks:
			owed = true
		case changedDemand:
			if ev.Type == clientv3.EventTypePut && l.ld.ReportArrived(region) {
				select {
				case k.back <- struct{}{}:
				default:
				}
			}
		}
	}
	return owed
}

// current brings the copy up to date for a round: read again when sweep
// asks for it (the safety net of Config.FullEvery) or when the copy left
// records out over a bound; otherwise apply what the watch delivered up
// to etcd's revision now, asking etcd for a progress notification when no
// event reaches it (the last write may be outside the deployment's
// prefix). A round so plans on the records as a read at its start would
// (its own last publish included), without reading them. When the
// notification does not come within an Interval (at most 5 s; etcd sends
// none while the watch catches up), the round plans on the copy as it
// stands, at its own revision, which the publish fences. It reports
// whether it read.
func (l *Loop) current(ctx context.Context, k *kept, ds *dirtySet, sweep bool) (bool, error) {
	if sweep || k.m.dropped || k.m.tooMany != nil {
		return true, l.resync(ctx, k, false)
	}
	resp, err := l.cfg.Client.Get(ctx, l.layout.Settings(), clientv3.WithCountOnly())
	if err != nil {
		return false, fmt.Errorf("rebalance: read etcd's revision: %w", err)
	}
	want := resp.Header.Revision
	var deadline <-chan time.Time
	for {
		resyncs := k.resyncs
		if _, err := l.take(ctx, k, ds); err != nil {
			return false, err
		}
		if k.m.rev >= want {
			return k.resyncs > resyncs, nil
		}
		if deadline == nil {
			if err := l.cfg.Client.RequestProgress(k.wctx); err != nil {
				return false, fmt.Errorf("rebalance: ask for the watch's progress: %w", err)
			}
			t := time.NewTimer(min(l.cfg.Interval, 5*time.Second))
			defer t.Stop()
			deadline = t.C
		}
		select {
		case <-k.q.ready:
		case <-deadline:
			l.cfg.Logger.Debug("watch of the records behind etcd; planning on the records as kept", "at", k.m.rev, "etcd", want)
			return false, nil
		case <-ctx.Done():
			return false, fmt.Errorf("rebalance: wait for the watch of the records: %w", ctx.Err())
		}
	}
}
