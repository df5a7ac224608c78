package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/quotacoord/quota/internal/coordinator"
	"github.com/quotacoord/quota/internal/coordinator/coordtest"
	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/etcdtest"
	"github.com/quotacoord/quota/rebalance"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const policyDoc = `policies:
  - name: exports
    capacity: 50
    rate: 600/minute
    min_share:
      default: 0.05
  - name: windowed
    algorithm: fixed_window
    capacity: 600
    window: 1m
`

type harness struct {
	t        *testing.T
	addr     string
	tokens   string
	readOnly string
	cli      *clientv3.Client
}

func start(t *testing.T) *harness {
	t.Helper()
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "tokens"), []byte("# test\nwrite:fedcba9876543210fedcba\nread:0123456789abcdef0123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c, err := coordinator.Start(ctx, coordinator.Config{
		EtcdEndpoints: srv.Endpoints, GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		TokenFile: filepath.Join(dir, "tokens"), Logger: hclog.NewNullLogger(),
		Rebalance: rebalance.Config{Interval: time.Hour, SessionTTL: time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		if err := c.Wait(); err != nil {
			t.Errorf("coordinator: %v", err)
		}
	})
	for _, n := range []string{"eu", "us"} {
		r := coordtest.NewRegion(cli, etcdlayout.Layout{}, n)
		if err := r.Register(ctx, time.Second); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.Kill)
		// One pressured subject offering half of the policy's 10/s.
		pressured := []etcdlayout.SubjectDemand{{Subject: "acme", Offered: 5, Admitted: 4, Denied: true}}
		if err := r.Report(ctx, time.Second, map[string]etcdlayout.PolicyDemand{"exports": {Offered: 8, Admitted: 7, Pressured: pressured},
			"windowed": {Offered: 8, Admitted: 7, Pressured: pressured}}); err != nil {
			t.Fatal(err)
		}
		actx, stopAck := context.WithCancel(context.Background())
		wait := r.AutoAck(actx)
		t.Cleanup(func() { stopAck(); wait() })
	}
	deadline := time.Now().Add(15 * time.Second)
	for !c.Loop.IsLeader() {
		if time.Now().After(deadline) {
			t.Fatal("coordinator never led")
		}
		time.Sleep(20 * time.Millisecond)
	}
	ro := filepath.Join(dir, "read-only")
	if err := os.WriteFile(ro, []byte("read:0123456789abcdef0123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	pf := filepath.Join(dir, "exports.yaml")
	if err := os.WriteFile(pf, []byte(policyDoc), 0o600); err != nil {
		t.Fatal(err)
	}
	return &harness{t: t, addr: c.GRPCAddr, tokens: c.TokenFile, readOnly: ro, cli: cli}
}

func (h *harness) run(args ...string) (string, error) {
	var out, errb bytes.Buffer
	full := append([]string{"--coordinator", h.addr, "--token-file", h.tokens}, args...)
	err := run(context.Background(), full, &out, &errb)
	return out.String(), err
}

func (h *harness) must(args ...string) string {
	h.t.Helper()
	out, err := h.run(args...)
	if err != nil {
		h.t.Fatalf("quotactl %v: %v", args, err)
	}
	return out
}

func TestEveryCommand(t *testing.T) {
	h := start(t)
	dir := filepath.Dir(h.tokens)
	if out := h.must("policy", "apply", "-f", filepath.Join(dir, "exports.yaml")); !strings.Contains(out, "exports") {
		t.Fatalf("apply: %q", out)
	}
	if out := h.must("policy", "list"); !strings.Contains(out, "exports") || !strings.Contains(out, "NAME") {
		t.Fatalf("list: %q", out)
	}
	var list struct {
		Policies []struct {
			Name            string
			RefillPerSecond float64
		}
	}
	if err := json.Unmarshal([]byte(h.must("policy", "list", "-o", "json")), &list); err != nil || len(list.Policies) != 2 || list.Policies[0].RefillPerSecond != 10 {
		t.Fatalf("list json: %+v %v", list, err)
	}
	if out := h.must("policy", "show", "exports"); !strings.Contains(out, "rate: 600/minute") {
		t.Fatalf("show: %q", out)
	}
	if _, err := h.run("policy", "show", "nope"); err == nil || !strings.Contains(err.Error(), "NotFound") {
		t.Fatalf("show unknown: %v", err)
	}
	// The first epoch, unless another round published it first: on a
	// loaded machine a 1 s session or lease may lapse, and a new lead or
	// a registration round plans a policy that has no allocation at once
	// (seen once in CI). alloc show checks the allocation either way.
	if out := h.must("rebalance", "now"); !strings.Contains(out, "exports@1") && !strings.Contains(out, "published: none") {
		t.Fatalf("rebalance now: %q", out)
	}
	out := h.must("alloc", "show")
	if !strings.Contains(out, "eu") || !strings.Contains(out, "0.5000") || !strings.Contains(out, coordtest.DefaultNode+"(") {
		t.Fatalf("alloc show: %q", out)
	}
	var alloc struct {
		Allocations []struct {
			Policy  string
			Epoch   string
			Regions []struct {
				Region string
				Share  float64
				Nodes  []struct {
					Node string
					Live bool
				}
			}
		}
	}
	if err := json.Unmarshal([]byte(h.must("alloc", "show", "exports", "-o", "json")), &alloc); err != nil || len(alloc.Allocations) != 1 || len(alloc.Allocations[0].Regions) != 2 {
		t.Fatalf("alloc json: %+v %v", alloc, err)
	}
	for _, r := range alloc.Allocations[0].Regions {
		if len(r.Nodes) != 1 || r.Nodes[0].Node != coordtest.DefaultNode || !r.Nodes[0].Live {
			t.Fatalf("alloc json: region %s nodes %+v, want one live %s", r.Region, r.Nodes, coordtest.DefaultNode)
		}
	}
	if out := h.must("dry-run", "exports"); !strings.Contains(out, "PROPOSED") || !strings.Contains(out, "predicted by the simulator") {
		t.Fatalf("dry-run: %q", out)
	}
	var dry struct {
		Prediction *struct {
			SubjectDemand map[string]float64
			SimulatedS    float64
		}
	}
	if err := json.Unmarshal([]byte(h.must("dry-run", "exports", "-o", "json")), &dry); err != nil || dry.Prediction == nil ||
		dry.Prediction.SimulatedS != 600 || dry.Prediction.SubjectDemand["eu"] != 0.5 {
		t.Fatalf("dry-run json prediction: %+v %v", dry.Prediction, err)
	}
	// A window policy is simulated too (10/s: acme offers half of it).
	dry.Prediction = nil
	if err := json.Unmarshal([]byte(h.must("dry-run", "windowed", "-o", "json")), &dry); err != nil || dry.Prediction == nil ||
		dry.Prediction.SubjectDemand["eu"] != 0.5 {
		t.Fatalf("dry-run of a fixed window: prediction %+v %v", dry.Prediction, err)
	}
	if _, err := json.Marshal(h.must("dry-run", "exports", "-o", "json")); err != nil {
		t.Fatal(err)
	}
	h.must("freeze", "exports")
	if out := h.must("policy", "show", "exports"); !strings.Contains(out, "frozen:      true") {
		t.Fatalf("show after freeze: %q", out)
	}
	if out := h.must("dry-run", "exports"); !strings.Contains(out, "frozen") {
		t.Fatalf("dry-run of a frozen policy: %q", out)
	}
	h.must("unfreeze", "exports")
	h.must("pin", "exports", "eu", "0.7")
	if _, err := h.run("pin", "exports", "us", "0.5"); err == nil || !strings.Contains(err.Error(), "InvalidArgument") {
		t.Fatalf("pins summing above 1: %v", err)
	}
	if _, err := h.run("pin", "exports", "us", "0.01"); err == nil || !strings.Contains(err.Error(), "below its minimum") {
		t.Fatalf("pin below minimum: %v", err)
	}
	if out := h.must("rebalance", "now"); !strings.Contains(out, "exports@") {
		t.Fatalf("rebalance after pin: %q", out)
	}
	h.must("unpin", "exports", "eu")
	if _, err := h.run("unpin", "exports", "eu"); err == nil {
		t.Fatal("unpin of an unpinned region succeeded")
	}
	h.must("weight", "exports", "us", "2")
	if _, err := h.run("weight", "exports", "us", "-1"); err == nil {
		t.Fatal("negative weight accepted")
	}
	h.must("minimum", "exports", "us", "0.2")
	if _, err := h.run("minimum", "exports", "eu", "0.9"); err == nil || !strings.Contains(err.Error(), "more than 1") {
		t.Fatalf("minimums summing above 1: %v", err)
	}
	if _, err := h.run("region", "retire", "eu"); err == nil || !strings.Contains(err.Error(), "registered nodes") {
		t.Fatalf("retiring eu, which has a registered node: %v", err)
	}
	h.must("region", "retire", "eu-wets")
	out = h.must("audit", "list")
	for _, a := range []string{"policy-apply", "freeze", "unfreeze", "pin", "unpin", "weight", "minimum", "rebalance-now", "retire-region"} {
		if !strings.Contains(out, a) {
			t.Errorf("audit list lacks %s:\n%s", a, out)
		}
	}
	if !strings.Contains(out, "token:write:") {
		t.Errorf("audit list lacks the actor:\n%s", out)
	}
	var audit struct{ Entries []struct{ Action string } }
	if err := json.Unmarshal([]byte(h.must("audit", "list", "--limit", "2", "-o", "json")), &audit); err != nil || len(audit.Entries) != 2 || audit.Entries[0].Action != "retire-region" {
		t.Fatalf("audit json: %+v %v", audit, err)
	}
}

// TestAllocShowsConfigMismatch registers one more node in each region, eu's
// and us's with different fingerprints: us loses the vote (ties go to the
// smaller fingerprint), and alloc show marks it and names every node's
// fingerprint so an operator can find the one that differs.
func TestAllocShowsConfigMismatch(t *testing.T) {
	h := start(t)
	ctx := context.Background()
	for region, fp := range map[string]string{"eu": "fp-a", "us": "fp-b"} {
		n := coordtest.NewNode(h.cli, etcdlayout.Layout{}, region, "node-1")
		n.Fingerprint = fp
		if err := n.Register(ctx, time.Second); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(n.Kill)
	}
	h.must("policy", "apply", "-f", filepath.Join(filepath.Dir(h.tokens), "exports.yaml"))
	h.must("rebalance", "now")
	out := h.must("alloc", "show", "exports")
	var rows []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "exports") {
			rows = append(rows, strings.Join(strings.Fields(l)[3:], " "))
		}
	}
	if len(rows) != 2 || !strings.Contains(rows[0], "eu") || !strings.Contains(rows[0], " ok ") ||
		!strings.Contains(rows[1], "us") || !strings.Contains(rows[1], " MISMATCH ") {
		t.Fatalf("alloc show rows %q, want eu ok and us MISMATCH:\n%s", rows, out)
	}
	if !strings.Contains(out, "config mismatch: region us") || !strings.Contains(out, "node-1=fp-b") || !strings.Contains(out, "node-0=-") {
		t.Fatalf("alloc show lacks us's fingerprints:\n%s", out)
	}
	var alloc struct {
		Allocations []struct {
			Regions []struct {
				Region         string
				ConfigMismatch bool `json:"configMismatch"`
			}
		}
	}
	if err := json.Unmarshal([]byte(h.must("alloc", "show", "exports", "-o", "json")), &alloc); err != nil || len(alloc.Allocations) != 1 {
		t.Fatalf("alloc json: %+v %v", alloc, err)
	}
	for _, r := range alloc.Allocations[0].Regions {
		if r.ConfigMismatch != (r.Region == "us") {
			t.Fatalf("json: region %s config_mismatch %v", r.Region, r.ConfigMismatch)
		}
	}
}

func TestAuthentication(t *testing.T) {
	h := start(t)
	var out, errb bytes.Buffer
	err := run(context.Background(), []string{"--coordinator", h.addr, "policy", "list"}, &out, &errb)
	if err == nil || !strings.Contains(err.Error(), "Unauthenticated") {
		t.Fatalf("no token: %v", err)
	}
	bad := filepath.Join(t.TempDir(), "bad")
	if err := os.WriteFile(bad, []byte("write:not-a-known-token-at-all\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err = run(context.Background(), []string{"--coordinator", h.addr, "--token-file", bad, "policy", "list"}, &out, &errb)
	if err == nil || !strings.Contains(err.Error(), "Unauthenticated") {
		t.Fatalf("unknown token: %v", err)
	}
	if err := run(context.Background(), []string{"--coordinator", h.addr, "--token-file", h.readOnly, "policy", "list"}, &out, &errb); err != nil {
		t.Fatalf("read token cannot read: %v", err)
	}
	err = run(context.Background(), []string{"--coordinator", h.addr, "--token-file", h.readOnly, "freeze", "exports"}, &out, &errb)
	if err == nil || !strings.Contains(err.Error(), "PermissionDenied") {
		t.Fatalf("read token wrote: %v", err)
	}
	info, err := os.Stat(h.tokens)
	if err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("token file mode: %v %v", info.Mode(), err)
	}
}
