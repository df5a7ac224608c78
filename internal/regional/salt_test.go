package regional

import (
	"context"
	"sync"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/etcdtest"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

// TestSubjectSaltSharedThroughEtcd: nodes started without -subject-salt
// against one etcd (here two at once, racing to create it) use one salt,
// random and of full strength, which a later node reads back unchanged.
func TestSubjectSaltSharedThroughEtcd(t *testing.T) {
	srv := etcdtest.Start(t)
	c := DaemonConfig{Region: "eu", NodeID: "n1", EtcdEndpoints: srv.Endpoints, Policies: "unused"}
	var (
		wg    sync.WaitGroup
		salts [2]string
		errs  [2]error
	)
	for i := range salts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := c
			c.NodeID = []string{"n1", "n2"}[i]
			ss, err := startSync(context.Background(), c, hclog.NewNullLogger())
			if err != nil {
				errs[i] = err
				return
			}
			defer ss.stop()
			salts[i] = ss.salt
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if salts[0] == "" || salts[0] != salts[1] {
		t.Fatalf("salts %q and %q, want one non-empty salt", salts[0], salts[1])
	}
	if len(salts[0]) < 43 { // 32 bytes in base64
		t.Fatalf("salt %q is shorter than 256 bits", salts[0])
	}
	g, err := srv.Client(t).Get(ctxT(t), etcdlayout.Layout{}.SubjectSalt())
	if err != nil || len(g.Kvs) != 1 || string(g.Kvs[0].Value) != salts[0] {
		t.Fatalf("stored salt %v, %v; want %q", g, err, salts[0])
	}
	again, err := sharedSubjectSalt(ctxT(t), srv.Client(t), etcdlayout.Layout{})
	if err != nil || again != salts[0] {
		t.Fatalf("later node got %q, %v; want %q", again, err, salts[0])
	}
	// A salt given on the command line is used as it is; etcd is not read.
	c.SubjectSalt = "given"
	ss, err := startSync(context.Background(), c, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	ss.stop()
	if ss.salt != "" {
		t.Fatalf("with -subject-salt the etcd salt %q was read", ss.salt)
	}
}

// TestNodeNeverHashesWithEmptySalt: a node given no salt hashes raw
// identities with a random key, never the empty one (with which a hashed
// IPv4 address is reversed by trying 2^32 addresses), and two such nodes
// use different keys.
func TestNodeNeverHashesWithEmptySalt(t *testing.T) {
	files := map[string]string{"p.yaml": "policies:\n  - {name: per-ip, capacity: 5, rate: 5/minute}\n"}
	var subjects []string
	for range 2 {
		h := startNode(t, Config{}, files)
		if h.node.cfg.SubjectSalt == "" {
			t.Fatal("node runs with an empty subject salt")
		}
		r, err := h.adm.Check(ctxT(t), &quotav1.CheckRequest{Subject: "10.1.2.3", HashSubject: true, Policies: []string{"per-ip"}})
		if err != nil || !r.Allowed {
			t.Fatalf("check: %v, %v", r, err)
		}
		keys := h.store.seen()
		if len(keys) != 1 {
			t.Fatalf("store saw %v", keys)
		}
		if got := keys[0].Subject(); got == bucket.HashSubject("", "10.1.2.3") {
			t.Fatalf("subject %q is the hash under the empty salt", got)
		}
		subjects = append(subjects, keys[0].Subject())
	}
	if subjects[0] == subjects[1] {
		t.Fatalf("two nodes without a salt hashed to the same subject %q", subjects[0])
	}
}
