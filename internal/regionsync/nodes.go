package regionsync

import (
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/quotacoord/quota/internal/etcdlayout"
)

// Nodes returns how many nodes enforce this region's shares together: the
// nodes registered under regions/{region}/ as last read from etcd, this
// node always among them (it enforces whether or not its registration is
// there yet), so at least 1. Before the first read it is 1. A region's
// nodes share its Redis and so its share; a node that decides on its own
// (failure mode local) may spend only its part of the share, share /
// Nodes(), or the region's nodes together would admit Nodes() times the
// share. It is lock-free and safe for concurrent use.
func (s *Syncer) Nodes() int { return max(1, int(s.nodes.Load())) }

// regionNodes follows the registrations of this node's region for Nodes.
// It is used by one follow goroutine only.
type regionNodes struct {
	s     *Syncer
	names map[string]struct{}
}

func (r *regionNodes) snapshot(kvs []*mvccpb.KeyValue) {
	prefix := r.s.cfg.Layout.RegionNodes(r.s.cfg.Region)
	r.names = make(map[string]struct{}, len(kvs))
	for _, kv := range kvs {
		r.add(prefix, string(kv.Key))
	}
	r.publish()
}

func (r *regionNodes) events(evs []*clientv3.Event) {
	prefix := r.s.cfg.Layout.RegionNodes(r.s.cfg.Region)
	for _, ev := range evs {
		if ev.Type == clientv3.EventTypeDelete {
			name := etcdlayout.Name(prefix, string(ev.Kv.Key))
			delete(r.names, name)
			if name == r.s.cfg.Node {
				r.s.registrationGone(ev.Kv.ModRevision)
			}
			continue
		}
		r.add(prefix, string(ev.Kv.Key))
	}
	r.publish()
}

// add counts the node registered under key, up to MaxPolicies nodes.
func (r *regionNodes) add(prefix, key string) {
	name := etcdlayout.Name(prefix, key)
	if name == "" {
		return
	}
	if _, ok := r.names[name]; !ok && len(r.names) >= r.s.cfg.MaxPolicies {
		r.s.log.Error("more registered nodes in the region than counted; the rest are ignored", "max", r.s.cfg.MaxPolicies)
		return
	}
	r.names[name] = struct{}{}
}

func (r *regionNodes) publish() {
	n := len(r.names)
	if _, self := r.names[r.s.cfg.Node]; !self {
		n++
	}
	r.s.nodes.Store(int64(n))
}
