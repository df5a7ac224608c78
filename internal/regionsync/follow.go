package regionsync

import (
	"context"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// follow keeps onSnapshot/onEvents in step with key (a prefix when prefix
// is set) until ctx is done: a get, then a watch from the revision after
// it; a compacted, cancelled or failed watch starts over with a get. A
// request received on resync forces a new get; the channel it carries is
// closed once a get that started after the request has been applied.
// Reads are bounded to Config.MaxPolicies keys. progressed, when not nil,
// is called whenever the follower is known current: after a read, an
// event or a progress notification, which the watch asks etcd for while
// etcd's settings set an acknowledgement deadline.
func (s *Syncer) follow(ctx context.Context, key string, prefix bool, resync <-chan chan struct{},
	onSnapshot func([]*mvccpb.KeyValue), onEvents func([]*clientv3.Event), progressed func()) {
	bo := newBackoff(time.Second)
	var waiters []chan struct{}
	defer func() {
		for _, w := range waiters {
			close(w)
		}
	}()
	getOpts := []clientv3.OpOption{clientv3.WithLimit(int64(s.cfg.MaxPolicies) + 1)}
	var watchOpts []clientv3.OpOption
	if prefix {
		getOpts = append(getOpts, clientv3.WithPrefix())
		watchOpts = append(watchOpts, clientv3.WithPrefix())
	}
	for ctx.Err() == nil {
		cctx, cancel := context.WithTimeout(ctx, s.requestTimeout())
		resp, err := s.cfg.Client.Get(cctx, key, getOpts...)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("read failed; retrying", "key", key, "error", err)
			}
			// Wait, but take resync requests meanwhile: they are answered
			// by the next successful get.
			t := time.NewTimer(bo.next())
			select {
			case <-ctx.Done():
			case w := <-resync:
				waiters = append(waiters, w)
			case <-t.C:
			}
			t.Stop()
			continue
		}
		if resp.More {
			s.log.Error("more keys than the configured maximum; the rest are ignored", "key", key, "max", s.cfg.MaxPolicies)
		}
		onSnapshot(resp.Kvs)
		if progressed != nil {
			progressed()
		}
		for _, w := range waiters {
			close(w)
		}
		waiters = nil
		bo.reset()
		if s.afterGet != nil {
			s.afterGet(key)
		}
		s.watch(ctx, key, resp.Header.Revision+1, watchOpts, resync, &waiters, onEvents, progressed, bo)
	}
}

// watch applies events from rev on until the watch ends, fails, or a
// resync is requested.
func (s *Syncer) watch(ctx context.Context, key string, rev int64, opts []clientv3.OpOption, resync <-chan chan struct{},
	waiters *[]chan struct{}, onEvents func([]*clientv3.Event), progressed func(), bo *backoff) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := s.cfg.Client.Watch(wctx, key, append(opts, clientv3.WithRev(rev))...)
	// While a deadline is set, ask for a progress notification a few
	// times per deadline: an idle watch is then known current too.
	var ask <-chan time.Time
	if progressed != nil {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		ask = t.C
	}
	var asked time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-ask:
			d := time.Duration(s.ackDeadline.Load())
			if d <= 0 || time.Since(asked) < d/4 {
				continue
			}
			asked = time.Now()
			if err := s.cfg.Client.RequestProgress(wctx); err != nil && ctx.Err() == nil {
				s.log.Debug("progress request failed", "key", key, "error", err)
			}
		case w := <-resync:
			*waiters = append(*waiters, w)
			return
		case wr, ok := <-wch:
			switch {
			case !ok:
				s.log.Warn("watch closed; reading again", "key", key)
				bo.wait(ctx)
				return
			case wr.CompactRevision != 0:
				s.log.Warn("watch revision compacted; reading again", "key", key, "compacted", wr.CompactRevision)
				return
			case wr.Err() != nil:
				s.log.Warn("watch failed; reading again", "key", key, "error", wr.Err())
				bo.wait(ctx)
				return
			case wr.Canceled:
				s.log.Warn("watch cancelled; reading again", "key", key)
				bo.wait(ctx)
				return
			case progressed != nil && s.holdAllocWatch.Load():
				// A test holds the watch: nothing arrives.
			default:
				if len(wr.Events) > 0 {
					onEvents(wr.Events)
				}
				if progressed != nil {
					progressed()
				}
			}
		}
	}
}

// backoff doubles from 50 ms up to a maximum.
type backoff struct {
	cur, max time.Duration
}

func newBackoff(maxDelay time.Duration) *backoff {
	maxDelay = max(maxDelay, 50*time.Millisecond)
	return &backoff{max: maxDelay}
}

func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = 50 * time.Millisecond
	} else {
		b.cur = min(2*b.cur, b.max)
	}
	return b.cur
}

func (b *backoff) reset() { b.cur = 0 }

func (b *backoff) wait(ctx context.Context) {
	t := time.NewTimer(b.next())
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
