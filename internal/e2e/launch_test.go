package e2e

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quotacoord/quota/internal/regional"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

// launched is a regional node started by launch.
type launched struct {
	cancel   context.CancelFunc
	done     chan error // regional.Run's result
	conn     *grpc.ClientConn
	httpAddr string
}

// launch runs regional.Run with cfg (its Logger and Announce write to log,
// each line prefixed with name) and returns once the node listens, with a
// gRPC connection to it. The caller stops it: cancel, then read done.
func launch(t *testing.T, cfg regional.DaemonConfig, log io.Writer, name string) launched {
	t.Helper()
	out := newAddrWriter(log, name)
	cfg.Logger, cfg.Announce = hclog.New(&hclog.LoggerOptions{Name: "regional", Output: out}), out
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- regional.Run(ctx, cfg) }()
	var addrs [2]string
	select {
	case addrs = <-out.addrs:
	case err := <-done:
		cancel()
		t.Fatalf("%s: regional.Run: %v", name, err)
	case <-time.After(15 * time.Second):
		cancel()
		t.Fatalf("%s: no listening addresses", name)
	}
	conn, err := grpc.NewClient(addrs[0], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	return launched{cancel: cancel, done: done, conn: conn, httpAddr: addrs[1]}
}

// stop cancels the node and waits for regional.Run to return.
func (l launched) stop(t *testing.T) {
	l.cancel()
	select {
	case err := <-l.done:
		if err != nil {
			t.Errorf("regional.Run: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Error("regional.Run did not return")
	}
	_ = l.conn.Close()
}

// admission is the node's Admission API.
func (l launched) admission() quotav1.AdmissionClient { return quotav1.NewAdmissionClient(l.conn) }
