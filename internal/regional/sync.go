package regional

import (
	"context"
	"errors"

	"github.com/hashicorp/go-hclog"
)

// syncer is what Main needs from the etcd side: shares, a demand sink,
// optionally a policy feed, a last flush and a stop.
type syncer struct {
	shares   ShareSource
	demand   DemandSink
	policies func(*Node) // starts feeding policies from etcd, when set
	flush    func(context.Context) error
	stop     func()
}

// startSync wires the region to etcd when -etcd is given; standalone it
// returns share 1 and no demand reporting.
func startSync(ctx context.Context, o *options, log hclog.Logger) (*syncer, error) {
	if o.etcd == "" {
		return &syncer{shares: Standalone{}, flush: func(context.Context) error { return nil }, stop: func() {}}, nil
	}
	return nil, errors.New("regional: -etcd: the etcd share watcher (internal/regionsync) is not wired in this build; run standalone with -policies")
}
