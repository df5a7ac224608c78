package reliability

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quotacoord/quota/internal/logbuf"
	"github.com/quotacoord/quota/internal/regional"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// go-redis clients of the harness and of the nodes are closed, but
		// the pool reaper may still be returning.
		goleak.IgnoreTopFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).reaper"),
		// Embedded etcd leaves these behind after Close (as in etcdtest's
		// own users).
		goleak.IgnoreTopFunction("go.etcd.io/etcd/server/v3/etcdserver.(*EtcdServer).applyAll"),
		goleak.IgnoreAnyFunction("go.opencensus.io/stats/view.(*worker).start"),
		goleak.IgnoreTopFunction("github.com/golang/glog.(*fileSink).flushDaemon"),
	)
}

// long reports whether the long configuration was asked for.
func long() bool { return os.Getenv("RELIABILITY_LONG") == "1" }

// pick returns short in CI and long with RELIABILITY_LONG=1.
func pick[T any](short, lng T) T {
	if long() {
		return lng
	}
	return short
}

var recorder = NewRecorder(os.Getenv("RELIABILITY_REPORT"))

// record logs e and appends it to the report file.
func record(t testing.TB, e Entry) {
	t.Helper()
	t.Logf("%s %s: injected=%v survived=%v decisions=%s lost=%d invariant=%d/%d before=%v after=%v p99=%v recovery=%v requests=%d limits_lifted=%d fail_open=%d %s",
		e.Kind, e.Name, e.Injected, e.Survived, joinCounts(e.Decisions), e.Lost, e.InvariantChecks, e.Violations,
		e.Before, e.After, e.P99, e.Recovery, e.Requests, e.LimitsLifted, e.FailOpen, e.Note)
	if err := recorder.Record(e); err != nil {
		t.Errorf("record: %v", err)
	}
}

// node is a regional node run in-process through regional.Run, the same
// wiring as cmd/regional.
type node struct {
	grpcAddr, httpAddr string
	out                *logbuf.Buffer
	adm                quotav1.AdmissionClient
	conn               *grpc.ClientConn
	stop               func() error
}

var listenRE = regexp.MustCompile(`(grpc|http) listening on (\S+)`)

// startNode runs regional.Run with c on loopback listeners, logging every
// level as JSON lines to n.out (the leak tests read all of it); it is
// stopped at cleanup. Listeners not given in c are on loopback, port 0.
// dial, when not nil, replaces the insecure client.
func startNode(t testing.TB, c regional.DaemonConfig, dial func(addr string) (*grpc.ClientConn, error)) *node {
	t.Helper()
	n := &node{out: &logbuf.Buffer{Max: 64 << 20}}
	for _, a := range []*string{&c.GRPCAddr, &c.HTTPAddr} {
		if *a == "" {
			*a = "127.0.0.1:0"
		}
	}
	c.ShutdownTimeout = 5 * time.Second
	c.Logger = hclog.New(&hclog.LoggerOptions{Name: "regional", Output: n.out, Level: hclog.Trace, JSONFormat: true})
	c.Announce = n.out
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- regional.Run(ctx, c) }()
	var once sync.Once
	var stopErr error
	n.stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case stopErr = <-done:
			case <-time.After(30 * time.Second):
				stopErr = fmt.Errorf("regional.Run did not return 30s after cancel")
			}
			if n.conn != nil {
				n.conn.Close()
			}
		})
		return stopErr
	}
	t.Cleanup(func() {
		if err := n.stop(); err != nil {
			t.Errorf("node stop: %v", err)
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for n.grpcAddr == "" || n.httpAddr == "" {
		select {
		case err := <-done:
			t.Fatalf("regional.Run returned at start: %v\n%s", err, n.out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("regional node did not listen in 20s:\n%s", n.out.String())
		}
		for _, m := range listenRE.FindAllStringSubmatch(n.out.String(), -1) {
			if m[1] == "grpc" {
				n.grpcAddr = m[2]
			} else {
				n.httpAddr = m[2]
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	if dial == nil {
		dial = func(addr string) (*grpc.ClientConn, error) {
			return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		}
	}
	conn, err := dial(n.grpcAddr)
	if err != nil {
		t.Fatal(err)
	}
	n.conn = conn
	n.adm = quotav1.NewAdmissionClient(conn)
	return n
}

// metrics returns the node's /metrics text.
func (n *node) metrics(t testing.TB) string {
	t.Helper()
	resp, err := http.Get("http://" + n.httpAddr + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 32<<20))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// metricSum returns the sum of every sample of the metric name (any
// labels) in the node's /metrics text, 0 when it has none.
func (n *node) metricSum(t testing.TB, name string) float64 {
	t.Helper()
	sum := 0.0
	for _, line := range strings.Split(n.metrics(t), "\n") {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		fields := strings.Fields(rest[strings.LastIndexByte(rest, '}')+1:])
		if len(fields) == 0 {
			t.Fatalf("metric line %q has no value", line)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		sum += v
	}
	return sum
}

// writePolicies writes body into a fresh policy file and returns its path.
func writePolicies(t testing.TB, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "policies.yaml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// heapAfterGC is the runtime's heap in use after two collections.
func heapAfterGC() int64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse)
}

// latencies collects decision latencies, bounded by reservoir sampling.
type latencies struct {
	mu   sync.Mutex
	n    int64
	kept []time.Duration
	seed uint64
}

const maxLatencySamples = 200000

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n++
	if len(l.kept) < maxLatencySamples {
		l.kept = append(l.kept, d)
		return
	}
	l.seed = l.seed*6364136223846793005 + 1442695040888963407
	if j := int64(l.seed>>1) % l.n; j < maxLatencySamples {
		l.kept[j] = d
	}
}

func (l *latencies) quantile(q float64) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.kept) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), l.kept...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// waitFor polls cond every 20ms until it holds or d passes.
func waitFor(t testing.TB, what string, d time.Duration, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > d {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start)
}

// counter is a concurrent map of counts.
type counter struct {
	mu sync.Mutex
	m  map[string]int64
}

func (c *counter) add(k string, v int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]int64{}
	}
	c.m[k] += v
}

func (c *counter) snapshot() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int64, len(c.m))
	for k, v := range c.m {
		out[k] = v
	}
	return out
}

func itoa(n int64) string { return fmt.Sprint(n) }

func ftoa(f float64) string { return fmt.Sprintf("%.4f", f) }

func openFile(path string) (*os.File, error) { return os.Open(path) }
