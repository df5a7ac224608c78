package scale

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/policy"
	"github.com/quotacoord/quota/internal/regional"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

// NodeParams sizes a node memory run.
type NodeParams struct {
	// Policies are token-bucket policies; Subjects are distinct subjects
	// checked once each, spread round-robin over the policies.
	Policies, Subjects int
	// Workers check concurrently; default 4.
	Workers int
}

// Bounds on NodeParams.
const (
	MaxNodeSubjects = 4_000_000
)

// NodeResult is what a node memory run measured.
type NodeResult struct {
	Params NodeParams
	// PerPolicy is the Go heap the policy set and the node hold per
	// policy before any check; PerSubject the heap each checked subject
	// adds (its bucket in the in-process store, its live-subject entry).
	PerPolicy, PerSubject float64
	// Buckets is how many buckets the store holds at the end (every
	// subject's, unless a bound refused some).
	Buckets int
	// Checks and Admitted count the checks made and admitted.
	Checks, Admitted int64
	// Wall is the whole run's time.
	Wall time.Duration
}

// NodeMemory measures a regional node's memory with many policies and
// live subjects: a real Node (package regional) on the in-process store,
// served over an in-memory gRPC connection, checks every subject once.
func NodeMemory(ctx context.Context, p NodeParams) (NodeResult, error) {
	start := time.Now()
	if p.Workers == 0 {
		p.Workers = 4
	}
	switch {
	case p.Policies < 1 || p.Policies > MaxPolicies:
		return NodeResult{}, fmt.Errorf("scale: %d policies, want 1 to %d", p.Policies, MaxPolicies)
	case p.Subjects < 0 || p.Subjects > MaxNodeSubjects:
		return NodeResult{}, fmt.Errorf("scale: %d subjects, want 0 to %d", p.Subjects, MaxNodeSubjects)
	case p.Workers < 1 || p.Workers > 64:
		return NodeResult{}, fmt.Errorf("scale: %d workers, want 1 to 64", p.Workers)
	}
	res := NodeResult{Params: p}
	heap0 := heapInUse()
	var doc bytes.Buffer
	doc.WriteString("policies:\n")
	for i := 0; i < p.Policies; i++ {
		fmt.Fprintf(&doc, "  - name: %s\n    subject: tenant\n    capacity: 100\n    rate: 6000/minute\n", policyName(i))
	}
	set, err := policy.Parse("scale.yaml", doc.Bytes())
	if err != nil {
		return res, fmt.Errorf("scale: policies: %w", err)
	}
	doc = bytes.Buffer{}
	perPolicy := (p.Subjects + p.Policies - 1) / p.Policies
	store, err := bucket.NewMemory(bucket.MemoryConfig{MaxBuckets: p.Subjects + p.Policies + 1})
	if err != nil {
		return res, err
	}
	local, err := bucket.NewMemory(bucket.MemoryConfig{})
	if err != nil {
		return res, err
	}
	node, err := regional.New(regional.Config{Region: "r", Store: store, Local: local,
		MaxLiveSubjects: max(perPolicy+1, 100000), CallerMaxInflight: -1, NegativeCacheSize: -1})
	if err != nil {
		return res, err
	}
	node.SetPolicies(set)
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	node.Register(srv)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = srv.Serve(lis) }()
	defer func() { srv.Stop(); wg.Wait() }()
	conn, err := grpc.NewClient("passthrough:///bufconn", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	if err != nil {
		return res, err
	}
	defer conn.Close()
	adm := quotav1.NewAdmissionClient(conn)
	// One check per policy first, so that whatever the node makes per
	// policy on first use counts as the policy's.
	for i := 0; i < p.Policies; i++ {
		if _, err := adm.Check(ctx, &quotav1.CheckRequest{Subject: "warm", Policies: []string{policyName(i)}, Cost: 1}); err != nil {
			return res, fmt.Errorf("scale: check: %w", err)
		}
	}
	heap1 := heapInUse()
	res.PerPolicy = float64(heap1-heap0) / float64(p.Policies)
	var next, admitted atomic.Int64
	errc := make(chan error, p.Workers)
	var cw sync.WaitGroup
	for w := 0; w < p.Workers; w++ {
		cw.Add(1)
		go func() {
			defer cw.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= p.Subjects || ctx.Err() != nil {
					return
				}
				resp, err := adm.Check(ctx, &quotav1.CheckRequest{Subject: "s" + strconv.Itoa(i), Policies: []string{policyName(i % p.Policies)}, Cost: 1})
				if err != nil {
					errc <- fmt.Errorf("scale: check subject %d: %w", i, err)
					return
				}
				if resp.Allowed {
					admitted.Add(1)
				}
			}
		}()
	}
	cw.Wait()
	close(errc)
	if err := <-errc; err != nil {
		return res, err
	}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	heap2 := heapInUse()
	res.Checks, res.Admitted = int64(min(p.Subjects, int(next.Load()))), admitted.Load()
	if p.Subjects > 0 {
		res.PerSubject = float64(heap2-heap1) / float64(p.Subjects)
	}
	res.Buckets = store.Len()
	runtime.KeepAlive(set)
	res.Wall = time.Since(start)
	return res, nil
}

// heapInUse is the Go heap in use after a collection.
func heapInUse() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse)
}

// NodeTableHeader is the markdown header of NodeTableRow.
const NodeTableHeader = "| policies | subjects | heap per policy | heap per subject | buckets | admitted | command |\n|---|---|---|---|---|---|---|"

// NodeTableRow is one node memory run as a markdown row.
func NodeTableRow(r NodeResult, command string) string {
	return fmt.Sprintf("| %d | %d | %s | %s | %d | %d of %d | `%s` |", r.Params.Policies, r.Params.Subjects,
		size(r.PerPolicy), size(r.PerSubject), r.Buckets, r.Admitted, r.Checks, command)
}
