package scale

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/etcdtest"
)

// TestRunSmall runs a small deployment for a few seconds: the leader
// rounds, nodes apply the sampled epochs, every kind of record is
// written, and the row names the command.
func TestRunSmall(t *testing.T) {
	res, err := Run(context.Background(), Params{
		Policies: 12, Regions: 2, NodesPerRegion: 2, Pressured: 2,
		ReportInterval: 200 * time.Millisecond, RebalanceInterval: 300 * time.Millisecond,
		Duration: 3 * time.Second, Sampled: 4, DataDir: t.TempDir(),
	}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if res.Rounds < 2 || res.Epochs < 1 || res.RoundP99 <= 0 || res.RoundP99 == Overflow {
		t.Fatalf("rounds %d epochs %d p99 %v: the leader did not round", res.Rounds, res.Epochs, res.RoundP99)
	}
	if res.Visible == 0 || res.VisibleP99 <= 0 {
		t.Fatalf("no share change timed at the nodes: %+v", res)
	}
	for _, k := range []string{"alloc", "ack", "demand"} {
		if res.BytesPerRound[k] <= 0 {
			t.Fatalf("no %s bytes written: %v", k, res.BytesPerRound)
		}
	}
	if res.LargestValue <= 0 || res.HeapPerNode <= 0 {
		t.Fatalf("largest value %d heap/node %v", res.LargestValue, res.HeapPerNode)
	}
	if row := TableRow(res, "scale -policies 12"); !strings.Contains(row, "`scale -policies 12`") || strings.Count(row, "|") != strings.Count(strings.SplitN(TableHeader, "\n", 2)[0], "|") {
		t.Fatalf("row %q does not fit the header", row)
	}
}

// TestRunFailoverSmall: with the leader cut off from etcd after the
// measurement, the standby leads once the session expires, ends a first
// round, and the replay of the sampled policies finds no violation.
func TestRunFailoverSmall(t *testing.T) {
	res, err := Run(context.Background(), Params{
		Policies: 12, Regions: 2, NodesPerRegion: 2, Pressured: 2,
		ReportInterval: 200 * time.Millisecond, RebalanceInterval: 300 * time.Millisecond,
		Duration: 2 * time.Second, Sampled: 4, DataDir: t.TempDir(), Failover: true,
	}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	fo := res.Failover
	if fo.Leading < DefaultSessionTTL/2 || fo.FirstRound <= 0 || fo.RoundTime <= 0 {
		t.Fatalf("failover %+v: the standby led before the session could expire, or never rounded", fo)
	}
	if !fo.Invariant.OK() || fo.Invariant.Epochs == 0 || fo.Invariant.Revisions == 0 {
		t.Fatalf("invariant replay: %d epochs, %d checks, violations %v", fo.Invariant.Epochs, fo.Invariant.Revisions, fo.Invariant.Violations)
	}
	if row := FailoverRow(res, "scale -failover"); strings.Count(row, "|") != strings.Count(strings.SplitN(FailoverHeader, "\n", 2)[0], "|") {
		t.Fatalf("row %q does not fit the header", row)
	}
}

func TestParamsBounds(t *testing.T) {
	ok := Params{Policies: 1, Regions: 1, NodesPerRegion: 1, ReportInterval: time.Second, RebalanceInterval: time.Second, Duration: time.Second, DataDir: "d"}
	if _, err := ok.withDefaults(); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*Params){
		"no policies":       func(p *Params) { p.Policies = 0 },
		"too many policies": func(p *Params) { p.Policies = MaxPolicies + 1 },
		"too many nodes":    func(p *Params) { p.Regions, p.NodesPerRegion = 64, 65 },
		"pressured":         func(p *Params) { p.Pressured = -1 },
		"moving":            func(p *Params) { p.Moving = 2 },
		"jitter":            func(p *Params) { p.Jitter = 0.6 },
		"negative jitter":   func(p *Params) { p.Jitter = -0.1 },
		"session TTL":       func(p *Params) { p.SessionTTL = 500 * time.Millisecond },
		"long session TTL":  func(p *Params) { p.SessionTTL = 2 * time.Minute },
		"report interval":   func(p *Params) { p.ReportInterval = time.Millisecond },
		"no data dir":       func(p *Params) { p.DataDir = "" },
	} {
		p := ok
		mut(&p)
		if _, err := p.withDefaults(); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
}

// TestNodeMemorySmall: every subject gets its bucket, and the per-policy
// and per-subject figures are positive and plausible.
func TestNodeMemorySmall(t *testing.T) {
	res, err := NodeMemory(context.Background(), NodeParams{Policies: 50, Subjects: 5000})
	if err != nil {
		t.Fatal(err)
	}
	if res.Buckets != 5000+50 || res.Checks != 5000 || res.Admitted != 5000 {
		t.Fatalf("buckets %d checks %d admitted %d, want every subject's bucket and admission", res.Buckets, res.Checks, res.Admitted)
	}
	if res.PerPolicy <= 0 || res.PerSubject <= 0 || res.PerSubject > 64<<10 {
		t.Fatalf("per policy %v, per subject %v", res.PerPolicy, res.PerSubject)
	}
	if _, err := NodeMemory(context.Background(), NodeParams{Policies: 0, Subjects: 1}); err == nil {
		t.Fatal("0 policies accepted")
	}
}

// TestAllocsWrittenAfter: only the allocations put after the revision
// count, each once however often it was put.
func TestAllocsWrittenAfter(t *testing.T) {
	cli := etcdtest.Start(t).Client(t)
	ctx := context.Background()
	var l etcdlayout.Layout
	put := func(policy string) int64 {
		t.Helper()
		resp, err := cli.Put(ctx, l.Alloc(policy), "{}")
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	put("a")
	put("b")
	cut := put("c")
	put("b")
	put("d")
	put("d")
	if _, err := cli.Put(ctx, l.Settings(), "{}"); err != nil {
		t.Fatal(err)
	}
	n, err := allocsWrittenAfter(ctx, cli, l, cut)
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Fatalf("%d allocations written after the cut, want 2 (b and d)", n)
	}
}
