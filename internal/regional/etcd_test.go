package regional

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/etcdtest"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

// TestMainWithEtcd: with -etcd the node takes its policies from etcd, is
// not ready until the region sync is, enforces the region's safe share
// while no allocation exists, and writes a last demand report on shutdown.
func TestMainWithEtcd(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	ctx := ctxT(t)
	doc, err := os.ReadFile("../../examples/policies/policies.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var l etcdlayout.Layout
	if _, err := cli.Put(ctx, l.PolicyDoc("own"), string(doc)); err != nil {
		t.Fatal(err)
	}
	g, hAddr, out, stop := runNode(t, DaemonConfig{EtcdEndpoints: srv.Endpoints, Region: "eu-west", ReportInterval: 100 * time.Millisecond})
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := http.Get("http://" + hAddr + "/readyz")
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			stop()
			t.Fatalf("never ready:\n%s", out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	conn, err := grpc.NewClient(g, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r, err := quotav1.NewAdmissionClient(conn).Check(ctx, &quotav1.CheckRequest{Subject: "acme", Policies: []string{"exports"}})
	// No allocation yet: the safe share, min_share eu-west 0.2 of 50.
	if err != nil || !r.Allowed || r.Limit != 10 || r.Policies[0].Share != 0.2 {
		t.Fatalf("check: %v, %v", r, err)
	}
	// The last report is written on shutdown, just before the node's
	// lease is revoked (which deletes it): watch for the write, under the
	// region's key or under the node's own key below it.
	wctx, wcancel := context.WithCancel(context.Background())
	defer wcancel()
	watch := cli.Watch(wctx, l.DemandPrefix()+"eu-west/", clientv3.WithPrefix(), clientv3.WithRev(r0(t, cli)+1))
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	var last []byte
	timeout := time.After(10 * time.Second)
	for last == nil {
		select {
		case wr := <-watch:
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypePut {
					last = ev.Kv.Value
				}
			}
		case <-timeout:
			t.Fatal("no demand report written")
		}
	}
	var rep etcdlayout.DemandReport
	if err := json.Unmarshal(last, &rep); err != nil {
		t.Fatal(err)
	}
	if _, ok := rep.Policies["exports"]; !ok {
		t.Fatalf("demand report without exports: %s", last)
	}
}

// r0 is the store's current revision.
func r0(t *testing.T, cli *clientv3.Client) int64 {
	t.Helper()
	g, err := cli.Get(context.Background(), "r0")
	if err != nil {
		t.Fatal(err)
	}
	return g.Header.Revision
}
