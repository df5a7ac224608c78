package regional

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"

	"github.com/quotacoord/quota/internal/demand"
	"github.com/quotacoord/quota/internal/etcdauth"
	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/policy"
	"github.com/quotacoord/quota/internal/regionsync"
)

// syncer is what Run needs from the etcd side: shares, a demand sink, a
// way to hand it the node once built, a last flush and a stop.
type syncer struct {
	shares ShareSource
	demand DemandSink
	attach func(*Node) // starts the etcd side once the node exists
	flush  func(context.Context) error
	stop   func()
	// salt is the deployment's subject salt from etcd when c has no
	// SubjectSalt; empty standalone or with one.
	salt string
}

// etcdCredentialFlags names what gives the node its etcd credentials, for
// errors saying etcd refused them.
const etcdCredentialFlags = "(see -etcd-username, -etcd-password-file, QUOTA_ETCD_PASSWORD, -etcd-tls-cert)"

// startSync wires the region to etcd when c has EtcdEndpoints (over TLS
// with c.EtcdTLS, files reloaded on change): shares and acknowledgements
// through internal/regionsync, demand through an internal/demand recorder
// reported every ReportInterval, and, without Policies, the policies
// stored in etcd. Standalone it returns share 1 and no demand reporting.
func startSync(ctx context.Context, c DaemonConfig, log hclog.Logger) (*syncer, error) {
	if len(c.EtcdEndpoints) == 0 {
		return &syncer{shares: Standalone{}, attach: func(*Node) {}, flush: func(context.Context) error { return nil }, stop: func() {}}, nil
	}
	etls := c.EtcdTLS
	if etls.Logger == nil {
		etls.Logger = log.Named("etcd-tls")
	}
	client, err := regionsync.DialAuth(c.EtcdEndpoints, etls, c.EtcdAuth)
	if err != nil {
		if errors.Is(err, etcdauth.ErrRefused) {
			return nil, fmt.Errorf("regional: -etcd: %w %s", err, etcdCredentialFlags)
		}
		return nil, fmt.Errorf("regional: -etcd: %w", err)
	}
	var salt string
	if c.SubjectSalt == "" {
		if salt, err = sharedSubjectSalt(ctx, client, etcdlayout.Layout{}); err != nil {
			client.Close()
			if err := etcdauth.Refusal(err); errors.Is(err, etcdauth.ErrRefused) {
				return nil, fmt.Errorf("%w %s", err, etcdCredentialFlags)
			}
			return nil, fmt.Errorf("%w (or give -subject-salt)", err)
		}
		log.Info("using the deployment's subject salt from etcd")
	}
	rec, err := demand.New(demand.Config{})
	if err != nil {
		client.Close()
		return nil, fmt.Errorf("regional: demand recorder: %w", err)
	}
	var node atomic.Pointer[Node]
	cfg := regionsync.Config{
		Region: c.Region, Node: c.NodeID, Addr: c.GRPCAddr, Client: client, ReportInterval: c.ReportInterval,
		Recorder: rec, Logger: log, Clock: c.Clock, Leases: c.RLQS.gate,
		Fingerprint: func() string {
			if n := node.Load(); n != nil {
				return n.Fingerprint()
			}
			return ""
		},
		// Outside an allocation the region may enforce only a minimum the
		// policy names for it explicitly: those are validated to sum to at
		// most 1 and the coordinator reserves them in every allocation. A
		// default minimum is granted by the coordinator, not assumed, so a
		// region that joins late enforces nothing until it is included.
		MinShare: func(name string) (float64, bool) {
			n := node.Load()
			if n == nil {
				return 0, false
			}
			p, ok := n.Policies().Get(name)
			if !ok {
				return 0, false
			}
			m, listed := p.MinShare[c.Region]
			return m, listed
		},
	}
	if c.Policies == "" {
		cfg.OnPolicies = func(docs map[string][]byte) {
			n := node.Load()
			if n == nil {
				return
			}
			s, err := parseDocs(docs)
			if err != nil {
				n.m.reloads.WithLabelValues("error").Inc()
				log.Error("policies from etcd rejected; keeping the last good policies", "error", err)
				return
			}
			n.SetPolicies(s)
			n.m.reloads.WithLabelValues("ok").Inc()
			log.Info("policies loaded from etcd", "policies", s.Len())
		}
	}
	s, err := regionsync.New(cfg)
	if err != nil {
		client.Close()
		return nil, fmt.Errorf("regional: region sync: %w", err)
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	return &syncer{
		shares: s,
		demand: rec,
		attach: func(n *Node) {
			node.Store(n)
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := s.Run(rctx); err != nil {
					log.Error("region sync stopped", "error", err)
				}
			}()
		},
		flush: s.Flush,
		salt:  salt,
		stop: func() {
			cancel()
			wg.Wait()
			client.Close()
		},
	}, nil
}

// parseDocs parses the policy documents stored in etcd (name to YAML, in
// either format) into one set, in name order.
func parseDocs(docs map[string][]byte) (*policy.Set, error) {
	names := make([]string, 0, len(docs))
	for name := range docs {
		names = append(names, name)
	}
	sort.Strings(names)
	sets := make([]*policy.Set, 0, len(names))
	for _, name := range names {
		s, err := policy.Parse("etcd:"+name, docs[name])
		if err != nil {
			return nil, err
		}
		sets = append(sets, s)
	}
	return policy.Merge(sets...)
}
