package deploycheck

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
)

var (
	scanOnce sync.Once
	scanRoot string
	scanCode Code
	scanErr  error
)

// repo scans the module once per test binary.
func repo(t *testing.T) (string, Code) {
	t.Helper()
	scanOnce.Do(func() {
		scanRoot, scanErr = ModuleRoot(".")
		if scanErr == nil {
			scanCode, scanErr = Scan(scanRoot)
		}
	})
	if scanErr != nil {
		t.Fatal(scanErr)
	}
	return scanRoot, scanCode
}

func load(t *testing.T, root string) []File {
	t.Helper()
	files, err := Load(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 10 {
		t.Fatalf("Load found %d files under deploy/, expected the whole tree", len(files))
	}
	return files
}

// TestDeployIsConsistent is the check itself: deploy/ as committed names
// only images, flags, ports, paths and metrics that exist.
func TestDeployIsConsistent(t *testing.T) {
	root, code := repo(t)
	for _, cmd := range []string{"regional", "coordinator"} {
		if len(code.Commands[cmd].Flags) == 0 {
			t.Errorf("Scan found no flags for cmd/%s", cmd)
		}
	}
	for _, p := range Check(root, code, load(t, root)) {
		t.Error(p)
	}
}

// TestCheckFindsRot proves the check fails for each kind of rot: every case
// edits one committed file and expects the problem it introduces.
func TestCheckFindsRot(t *testing.T) {
	root, code := repo(t)
	cases := []struct {
		name, file, old, new, want string
	}{
		{"unknown flag in base", "deploy/kubernetes/base/regional/deployment.yaml", "- -json-logs", "- -no-such-flag", "flag -no-such-flag is not defined by cmd/regional"},
		{"unknown flag in overlay patch", "deploy/try/coordinator-args.yaml", "-report-interval=2s", "-report-every=2s", "flag -report-every is not defined by cmd/coordinator"},
		{"missing region file", "deploy/kubernetes/overlays/us-east/kustomization.yaml", "- region.env", "- regions.env", `reference "regions.env" does not exist`},
		{"unknown coordinator flag", "deploy/kubernetes/base/coordinator/deployment.yaml", "-rebalance-interval=5s", "-rebalance-every=5s", "flag -rebalance-every is not defined by cmd/coordinator"},
		{"unknown metric in alert", "deploy/prometheus/alerts.yaml", "quota_regional_breaker_open)", "quota_regional_breaker_opened)", "metric quota_regional_breaker_opened is not registered"},
		{"unknown metric in dashboard", "deploy/grafana/dashboard.json", "quota_regional_store_errors_total", "quota_regional_store_failures_total", "metric quota_regional_store_failures_total is not registered"},
		{"image of no command", "deploy/kubernetes/base/regional/deployment.yaml", "quota-regional:v0.1.0", "quota-regionl:v0.1.0", `image "ghcr.io/quotacoord/quota-regionl:v0.1.0"`},
		{"latest tag", "deploy/try/redis.yaml", "redis:7.4-alpine", "redis:latest", `image "redis:latest"`},
		{"unlisted image", "deploy/try/redis.yaml", "redis:7.4-alpine", "example.com/redis:7", `image "example.com/redis:7"`},
		{"listen port not declared", "deploy/kubernetes/base/regional/deployment.yaml", "containerPort: 8081", "containerPort: 8082", "listens on port 8081, which is not a declared container port"},
		{"declared port nobody serves", "deploy/kubernetes/base/coordinator/deployment.yaml", "- -http-addr=:8090", "- -http-addr=:8099", "container port 8090 is not where any"},
		{"metrics left on the loopback default", "deploy/kubernetes/base/regional/deployment.yaml", "- -http-addr=:8080\n", "", "container port 8080 is not where any"},
		{"metrics on loopback", "deploy/kubernetes/base/coordinator/deployment.yaml", "- -http-addr=:8090", "- -http-addr=127.0.0.1:8090", "container port 8090 is not where any"},
		{"probe path not served", "deploy/kubernetes/base/regional/deployment.yaml", "path: /readyz", "path: /ready", `path "/ready" is not served by cmd/regional`},
		{"probe port not declared", "deploy/kubernetes/base/regional/deployment.yaml", "port: http\n", "port: metrics\n", "port metrics is not a declared container port"},
		{"service target port", "deploy/kubernetes/base/regional/service.yaml", "targetPort: grpc", "targetPort: grpcs", "targetPort grpcs is not declared"},
		{"pdb selects nothing", "deploy/kubernetes/base/regional/pdb.yaml", "app.kubernetes.io/name: quota-regional", "app.kubernetes.io/name: quota-regionl", "matches no pod template"},
		{"missing kustomize resource", "deploy/kubernetes/base/regional/kustomization.yaml", "- pdb.yaml", "- disruption.yaml", `reference "disruption.yaml" does not exist`},
		{"missing overlay base", "deploy/kubernetes/overlays/eu-west/kustomization.yaml", "../../base/regional", "../../base/regionl", `reference "../../base/regionl" does not exist`},
		{"bad policy file", "deploy/envoy/ratelimit-config.yaml", "requests_per_unit: 600", "requests_per_unit: -600", "policy file does not load"},
		{"envoy cluster port", "deploy/envoy/envoy.yaml", "port_value: 8081", "port_value: 9081", "is not the regional node's gRPC port"},
		{"envoy domain", "deploy/envoy/envoy.yaml", "domain: edge", "domain: edgy", `domain "edgy" is served by no policy file`},
		{"envoy descriptor without rule", "deploy/envoy/envoy.yaml", "descriptor_value: exports", "descriptor_value: imports", "matches no rule"},
		{"envoy fails open", "deploy/envoy/envoy.yaml", "failure_mode_deny: true", "failure_mode_deny: false", "without failure_mode_deny: true"},
		{"rlqs cluster port", "deploy/envoy/envoy-rlqs.yaml", "port_value: 8081", "port_value: 9081", "is not the regional node's gRPC port"},
		{"rlqs cluster missing", "deploy/envoy/envoy-rlqs.yaml", "cluster_name: quota_regional }", "cluster_name: quota_regionl }", `cluster "quota_regionl" is not defined`},
		{"rlqs server not envoy_grpc", "deploy/envoy/envoy-rlqs.yaml", "envoy_grpc: { cluster_name: quota_regional }", "google_grpc: { target_uri: 127.0.0.1:8081, stat_prefix: rlqs }", "rlqs_server is not an envoy_grpc cluster"},
		{"rlqs domain", "deploy/envoy/envoy-rlqs.yaml", "domain: edge-quota", "domain: edge-quotas", `rate_limit_quota domain "edge-quotas" is served by no policy file`},
		{"rlqs admits before assignment", "deploy/envoy/envoy-rlqs.yaml", "fallback_rate_limit: { blanket_rule: DENY_ALL }", "fallback_rate_limit: { blanket_rule: ALLOW_ALL }", "no_assignment_behavior is not DENY_ALL"},
		{"rlqs reuses expired", "deploy/envoy/envoy-rlqs.yaml", "expired_assignment_behavior:\n                                      fallback_rate_limit: { blanket_rule: DENY_ALL }",
			"expired_assignment_behavior:\n                                      reuse_last_assignment: {}", "expired_assignment_behavior is not a DENY_ALL fallback"},
		{"rlqs no-assignment unset", "deploy/envoy/envoy-rlqs.yaml", "no_assignment_behavior:\n                                      fallback_rate_limit: { blanket_rule: DENY_ALL }\n                                    expired", "expired", "no_assignment_behavior is not DENY_ALL"},
		{"rlqs fractional report", "deploy/envoy/envoy-rlqs.yaml", "reporting_interval: 1s", "reporting_interval: 1.5s", "is not whole seconds"},
		{"rlqs invalid bucket", "deploy/envoy/envoy-rlqs.yaml", "reporting_interval: 1s", "reporting_interval: 0s", "ReportingInterval"},
		{"rlqs invalid matcher", "deploy/envoy/envoy-rlqs.yaml", "google_re2: {}, ", "", "RegexMatcher.EngineType"},
		{"rlqs unknown field", "deploy/envoy/envoy-rlqs.yaml", "domain: edge-quota", "domains: edge-quota", "rate_limit_quota filter: typed_config"},
		{"rlqs bucket id without rule", "deploy/envoy/envoy-rlqs.yaml", "tenant:\n                                          custom_value", "team:\n                                          custom_value", "matches no rule"},
		{"rlqs window rule", "deploy/envoy/rlqs-config.yaml", "requests_per_unit: 20, burst: 40}", "requests_per_unit: 20}", "cannot be leased"},
	}
	files := load(t, root)
	// TestDeployIsConsistent demands no problem at all; here a case only
	// needs its edit to add the problem it expects.
	before := map[Problem]bool{}
	for _, p := range Check(root, code, files) {
		before[p] = true
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			edited := make([]File, len(files))
			copy(edited, files)
			found := false
			for i, f := range edited {
				if f.Path != tc.file {
					continue
				}
				found = true
				if !bytes.Contains(f.Raw, []byte(tc.old)) {
					t.Fatalf("%s does not contain %q", tc.file, tc.old)
				}
				nf, err := Decode(f.Path, bytes.Replace(f.Raw, []byte(tc.old), []byte(tc.new), 1))
				if err != nil {
					t.Fatal(err)
				}
				edited[i] = nf
			}
			if !found {
				t.Fatalf("no file %s", tc.file)
			}
			ps := Check(root, code, edited)
			for _, p := range ps {
				if !before[p] && strings.Contains(p.What, tc.want) {
					return
				}
			}
			t.Errorf("edit %q -> %q in %s: want a problem containing %q, got %v", tc.old, tc.new, tc.file, tc.want, ps)
		})
	}
}

// TestZeroCodeRejectsEverything: with no code known, every image and metric
// reference is a problem.
func TestZeroCodeRejectsEverything(t *testing.T) {
	root, _ := repo(t)
	ps := Check(root, Code{}, load(t, root))
	var images, metrics int
	for _, p := range ps {
		if strings.Contains(p.What, "image") {
			images++
		}
		if strings.Contains(p.What, "is not registered") {
			metrics++
		}
	}
	if images < 2 || metrics < 5 {
		t.Errorf("zero Code: %d image and %d metric problems, want >= 2 and >= 5: %v", images, metrics, ps)
	}
}

func TestMetrics(t *testing.T) {
	cases := []struct {
		expr string
		want []string
	}{
		{`up`, []string{"up"}},
		{`rate(a_total[5m])`, []string{"a_total"}},
		{`sum by (policy, region) (rate(a_total{policy=~"$policy", x="}"}[1m]))`, []string{"a_total"}},
		{`histogram_quantile(0.99, sum by (le) (rate(lat_seconds_bucket[$__rate_interval])))`, []string{"lat_seconds_bucket"}},
		{`a / on (region) group_left (mode) b > 0.01`, []string{"a", "b"}},
		{`sum(x) without (instance) > bool 1 and y offset 5m`, []string{"x", "y"}},
		{`label_values(quota_decisions_total, policy)`, []string{"quota_decisions_total"}},
		{`max(foo:recorded) > 1e3 or vector(0)`, []string{"foo:recorded"}},
		{`sum(${metric_var})`, []string{}},
	}
	for _, tc := range cases {
		got, err := Metrics(tc.expr)
		if err != nil {
			t.Errorf("Metrics(%q): %v", tc.expr, err)
			continue
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("Metrics(%q) = %v, want %v", tc.expr, got, tc.want)
		}
	}
	for _, bad := range []string{`a{x="y"`, `rate(a[5m)`, `a{x="y}`, strings.Repeat("a", maxExprLen+1)} {
		if _, err := Metrics(bad); err == nil {
			t.Errorf("Metrics(%q): no error", bad)
		}
	}
}

func TestScan(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		t.Helper()
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/m\n")
	write("cmd/node/main.go", `package main
import ("flag"; "example.com/m/internal/shared")
const addrFlag = "grpc-addr"
func main() {
	var s string
	shared.Register(flag.CommandLine)
	flag.StringVar(&s, "region", "", "region")
	fs := flag.NewFlagSet("node", flag.ContinueOnError)
	fs.String(addrFlag, ":8081", "gRPC")
	fs.Duration("store-timeout", 0, "budget")
	fs.Func("tag", "repeatable", func(string) error { return nil })
}`)
	write("internal/node/http.go", `package node
import ("net/http"; "github.com/prometheus/client_golang/prometheus")
const ns = "quota"
func Mux() { http.HandleFunc("GET /readyz", nil); http.Handle("/healthz", nil) }
var h = prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: "node", Name: "latency_seconds"})
var d = prometheus.NewDesc("quota_custom", "help", nil, nil)
var b = prometheus.BuildFQName(ns, "x", "y_total")
`)
	write("cmd/node/main_test.go", `package main
import "flag"
var _ = flag.String("test-only", "", "")`)
	write("cmd/lib/lib.go", "package lib\n")
	write("internal/shared/flags.go", `package shared
import "flag"
func Register(fs *flag.FlagSet) { fs.String("log-level", "info", "level") }`)
	write("internal/unused/flags.go", `package unused
import "flag"
var _ = flag.String("not-imported", "", "")`)
	code, err := Scan(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := code.Commands["lib"]; ok {
		t.Error("a non-main package under cmd/ counted as a command")
	}
	node := code.Commands["node"]
	wantFlags := map[string]string{"region": "", "grpc-addr": ":8081", "store-timeout": "0", "tag": "", "log-level": "info"}
	if !reflect.DeepEqual(node.Flags, wantFlags) {
		t.Errorf("flags = %v, want %v", node.Flags, wantFlags)
	}
	for _, p := range []string{"/readyz", "/healthz"} {
		if !node.Paths[p] {
			t.Errorf("path %s not found in %v", p, node.Paths)
		}
	}
	for _, m := range []string{"quota_node_latency_seconds_bucket", "quota_node_latency_seconds_count", "quota_custom", "quota_x_y_total"} {
		if !code.HasMetric(m) {
			t.Errorf("metric %s not found in %v", m, code.Metrics)
		}
	}
	if code.HasMetric("quota_node_latency") {
		t.Error("a prefix of a metric counted as a metric")
	}
}

// TestRenderedKustomizations renders every kustomization with kubectl and
// checks the rendered objects too (patched args included). Without
// kubectl it fails: a rendering nobody checked must not pass
// (scripts/deps.sh installs it).
func TestRenderedKustomizations(t *testing.T) {
	root, code := repo(t)
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Fatal("kubectl not installed: the rendered kustomizations cannot be checked; run scripts/deps.sh (apt-get install kubernetes-client)")
	}
	var dirs []string
	for _, f := range load(t, root) {
		// A Component renders only inside the kustomizations that use it.
		if filepath.Base(f.Path) == "kustomization.yaml" && len(f.Docs) == 1 && asMap(f.Docs[0])["kind"] != "Component" {
			dirs = append(dirs, filepath.Dir(f.Path))
		}
	}
	if len(dirs) < 5 {
		t.Fatalf("only %d kustomizations to render: %v", len(dirs), dirs)
	}
	for _, d := range dirs {
		out, err := exec.Command(kubectl, "kustomize", filepath.Join(root, d)).CombinedOutput()
		if err != nil {
			t.Errorf("kubectl kustomize %s: %v\n%s", d, err, out)
			continue
		}
		f, err := Decode(d+"/rendered.yaml", out)
		if err != nil {
			t.Errorf("rendered %s: %v", d, err)
			continue
		}
		for _, p := range Check(root, code, []File{f}) {
			t.Errorf("rendered %s", p)
		}
	}
}
