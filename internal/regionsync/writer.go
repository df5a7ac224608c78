package regionsync

import (
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/quotacoord/quota/internal/etcdlayout"
)

// ackLoop writes the applied epochs under the lease after every publish,
// coalescing publishes that arrive while a write is in flight. Only the
// acknowledgement shards whose epochs changed are written.
func (s *Syncer) ackLoop(ctx context.Context) {
	bo := newBackoff(time.Second)
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.ackCh:
		}
		t := s.tab.Load()
		id := clientv3.LeaseID(s.lease.Load())
		if t.lost || id == 0 {
			// Leaving the safe shares publishes again, which acks.
			continue
		}
		if !s.drained(ctx, t) {
			// Checks pinned an older table for longer than a request
			// timeout: try again later rather than ack under them.
			if ctx.Err() == nil {
				s.log.Warn("checks still use older shares; acknowledgement postponed")
			}
			bo.wait(ctx)
			select {
			case s.ackCh <- struct{}{}:
			default:
			}
			continue
		}
		if !s.leasesEnded(ctx, t) {
			// A newer table came first (its publish queued an ack), or
			// the Syncer stops.
			continue
		}
		err := s.writeShards(ctx, id, func(ctx context.Context) error {
			owner := Owner{Lease: id, Registration: s.cfg.Layout.Node(s.cfg.Region, s.cfg.Node)}
			_, err := s.acks.Write(ctx, s.cfg.Client, owner, func(shard int) string {
				return s.cfg.Layout.AckShard(s.cfg.Region, s.cfg.Node, shard)
			}, s.ackShards(t), ackChanged)
			return err
		})
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("acknowledgement failed; retrying", "error", err)
			}
			bo.wait(ctx)
			select {
			case s.ackCh <- struct{}{}:
			default:
			}
			continue
		}
		bo.reset()
	}
}

// ackShards is the acknowledgement of t's epochs, by shard: each shard's
// Epochs is t's own map (never changed), so a shard no epoch of which
// moved since the last write is the same map (ackChanged).
func (s *Syncer) ackShards(t *table) map[int]etcdlayout.Ack {
	out := make(map[int]etcdlayout.Ack)
	at := s.now()
	for i, epochs := range t.shares.epochs {
		if len(epochs) > 0 {
			out[i] = etcdlayout.Ack{Region: s.cfg.Region, Node: s.cfg.Node, Epochs: epochs, At: at}
		}
	}
	return out
}

// reportLoop writes a demand report every report interval.
func (s *Syncer) reportLoop(ctx context.Context) {
	t := time.NewTimer(s.reportInterval())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.settingsCh:
			t.Reset(s.reportInterval())
			continue
		case <-t.C:
		}
		if err := s.report(ctx, s.now()); err != nil && ctx.Err() == nil {
			s.log.Warn("demand report not written", "error", err)
		}
		t.Reset(s.reportInterval())
	}
}

// Flush writes a demand report now, covering the time since the last one.
// Call it on shutdown, while the lease still lives (before or shortly
// after Run returns). Without a Recorder it does nothing.
func (s *Syncer) Flush(ctx context.Context) error {
	return s.report(ctx, s.now())
}

// FlushAt is Flush with the report's interval ending at at (on
// Config.Clock's wall reading) instead of now: for a caller that records
// demand itself at known instants (the scale harness), so that a report's
// rates are the costs recorded over the time they were recorded for,
// however long recording and writing took.
func (s *Syncer) FlushAt(ctx context.Context, at time.Time) error {
	return s.report(ctx, at)
}

// report takes a snapshot ending at at and writes the demand shards that
// moved (demandChanged) under the lease; without a lease the snapshot is
// discarded (it would be stale by the time etcd is back).
func (s *Syncer) report(ctx context.Context, at time.Time) error {
	if s.cfg.Recorder == nil {
		return nil
	}
	s.reportMu.Lock()
	defer s.reportMu.Unlock()
	rep := s.cfg.Recorder.Report(s.cfg.Region, at)
	rep.Node = s.cfg.Node
	id := clientv3.LeaseID(s.lease.Load())
	if id == 0 {
		return fmt.Errorf("demand report of %d policies dropped: %w", len(rep.Policies), ErrNoLease)
	}
	return s.writeShards(ctx, id, func(ctx context.Context) error {
		_, err := s.demand.Write(ctx, s.cfg.Client, Owner{Lease: id}, func(shard int) string {
			return s.cfg.Layout.DemandShard(s.cfg.Region, s.cfg.Node, shard)
		}, etcdlayout.SplitDemand(rep), demandChanged)
		return err
	})
}

// writeShards runs write, the write of a sharded record for lease id,
// within one request timeout. A "lease not found" answer, or a kept write
// that found the registration no longer held under id, marks the lease
// lost.
func (s *Syncer) writeShards(ctx context.Context, id clientv3.LeaseID, write func(context.Context) error) error {
	cctx, cancel := context.WithTimeout(ctx, s.requestTimeout())
	defer cancel()
	if err := write(cctx); err != nil {
		if leaseGone(err) || errors.Is(err, ErrNotRegistered) {
			s.markLost(id, "leased write found no lease")
		}
		return err
	}
	return nil
}

// drained waits, at most one request timeout, until no check pins a table
// older than t: from then on every check uses t's epochs.
func (s *Syncer) drained(ctx context.Context, t *table) bool {
	deadline := time.Now().Add(s.requestTimeout())
	for {
		s.mu.Lock()
		busy := false
		for _, old := range s.retired {
			if old != t && old.inflight.Load() > 0 {
				busy = true
				break
			}
		}
		s.mu.Unlock()
		if !busy {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(time.Millisecond)
	}
}
