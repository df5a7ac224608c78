package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/quotacoord/quota/internal/deploycheck"
	"github.com/quotacoord/quota/internal/logbuf"
)

// promAPI is a client of a Prometheus server's HTTP API.
type promAPI struct{ base string }

// get calls path with query q and decodes the "data" of a success reply
// into out; an error reply is an error naming Prometheus's message.
func (p promAPI) get(ctx context.Context, path string, q url.Values, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.base+path+"?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var body struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if body.Status != "success" {
		return fmt.Errorf("%s %v: %s", path, q, body.Error)
	}
	return json.Unmarshal(body.Data, out)
}

// startPrometheus runs Debian's prometheus binary scraping targets (job
// name to host:port list) every second and evaluating ruleFile every
// second, until the test ends. A missing binary fails the test.
func startPrometheus(t *testing.T, targets map[string][]string, ruleFile string) promAPI {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatalf("prometheus is not installed (Debian package prometheus; run scripts/deps.sh): %v", err)
	}
	dir := t.TempDir()
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - %q\nscrape_configs:\n", ruleFile)
	jobs := make([]string, 0, len(targets))
	for j := range targets {
		jobs = append(jobs, j)
	}
	sort.Strings(jobs)
	for _, j := range jobs {
		quoted := make([]string, len(targets[j]))
		for i, a := range targets[j] {
			quoted[i] = strconv.Quote(a)
		}
		fmt.Fprintf(&cfg, "  - job_name: %s\n    static_configs:\n      - targets: [%s]\n", j, strings.Join(quoted, ", "))
	}
	conf := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(conf, []byte(cfg.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	out := &logbuf.Buffer{}
	cmd := exec.Command(bin, "--config.file="+conf, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	api := promAPI{base: "http://" + addr}
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get(api.base + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return api
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus never ready:\n%s", out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestPrometheusScrapesTheSystem runs the coordinator and two regional
// nodes, sends checks (some denied, some decided by the failure mode after
// one region's redis-server stopped), lets a real Prometheus scrape them with the alert
// rules of deploy/prometheus loaded, and then demands: every target up,
// every rule evaluated by Prometheus without error, every alert and
// dashboard expression accepted by Prometheus's query engine, and every
// metric those expressions name present in the scraped series.
func TestPrometheusScrapesTheSystem(t *testing.T) {
	root, err := deploycheck.ModuleRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	s := PartnerStory(9*time.Second, 100)
	s.Regions = s.Regions[:2]
	dep, err := Deploy(ctx, DeployConfig{Regions: s.Regions, Policies: PolicyDoc(&s)})
	if err != nil {
		t.Fatal(err)
	}
	defer dep.Close()
	for i := range s.Regions {
		for j := 0; j < 150; j++ { // more than the burst: some are denied
			if _, _, err := dep.Checks.Check(ctx, i, s.Policy, s.Subject, 1); err != nil {
				t.Fatalf("check in %s: %v", s.Regions[i], err)
			}
		}
	}
	// eu-west loses its Redis: its node decides by the policy's failure
	// mode, and counts store errors and degraded decisions.
	if dep.Store != "redis-server" {
		t.Fatalf("store %q: this test needs redis-server (scripts/deps.sh installs it)", dep.Store)
	}
	dep.redises[1].Stop()
	// The subject was just denied, so the node's negative cache answers
	// its next checks without Redis until the denial's RetryAfter: check
	// until one reaches the store, for at most 5 s.
	for deadline := time.Now().Add(5 * time.Second); dep.Checks.Degraded() == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no degraded decision in %s within 5 s after its Redis stopped", s.Regions[1])
		}
		if _, _, err := dep.Checks.Check(ctx, 1, s.Policy, s.Subject, 1); err != nil {
			t.Fatalf("check in %s without Redis: %v", s.Regions[1], err)
		}
	}
	api := startPrometheus(t, map[string][]string{"regional": dep.HTTP, "coordinator": {dep.Coord.HTTPAddr}},
		filepath.Join(root, "deploy", "prometheus", "alerts.yaml"))

	// Every target up, each scraped at least three times (rate needs two
	// samples), every rule evaluated.
	type target struct {
		ScrapeURL string `json:"scrapeUrl"`
		Health    string `json:"health"`
		LastError string `json:"lastError"`
	}
	type rule struct {
		Name           string    `json:"name"`
		Health         string    `json:"health"`
		LastError      string    `json:"lastError"`
		LastEvaluation time.Time `json:"lastEvaluation"`
	}
	start := time.Now()
	var rules []rule
	for {
		var tg struct {
			Active []target `json:"activeTargets"`
		}
		if err := api.get(ctx, "/api/v1/targets", nil, &tg); err != nil {
			t.Fatal(err)
		}
		up := len(tg.Active) == len(dep.HTTP)+1
		for _, x := range tg.Active {
			up = up && x.Health == "up"
		}
		var rg struct {
			Groups []struct {
				Rules []rule `json:"rules"`
			} `json:"groups"`
		}
		if err := api.get(ctx, "/api/v1/rules", nil, &rg); err != nil {
			t.Fatal(err)
		}
		rules = rules[:0]
		evaluated := true
		for _, g := range rg.Groups {
			for _, r := range g.Rules {
				rules = append(rules, r)
				evaluated = evaluated && r.LastEvaluation.After(start.Add(3*time.Second))
			}
		}
		if up && evaluated && len(rules) > 0 && time.Since(start) > 4*time.Second {
			break
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("after 30s: targets %+v, rules %+v", tg.Active, rules)
		}
		time.Sleep(250 * time.Millisecond)
	}
	for _, r := range rules {
		if r.Health != "ok" {
			t.Errorf("rule %s: health %q: %s", r.Name, r.Health, r.LastError)
		}
	}

	// The expressions: the alerts', and the dashboard's with its $policy
	// variable set to every policy.
	exprs := map[string]string{}
	var alerts struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	raw, err := os.ReadFile(filepath.Join(root, "deploy", "prometheus", "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, &alerts); err != nil {
		t.Fatal(err)
	}
	for _, g := range alerts.Groups {
		for _, r := range g.Rules {
			exprs["alert "+r.Alert] = r.Expr
		}
	}
	raw, err = os.ReadFile(filepath.Join(root, "deploy", "grafana", "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash any
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatal(err)
	}
	for i, e := range dashboardExprs(dash) {
		exprs[fmt.Sprintf("dashboard target %d", i)] = strings.ReplaceAll(e, "$policy", ".*")
	}
	if len(exprs) < 10 {
		t.Fatalf("only %d expressions found", len(exprs))
	}
	names := map[string]bool{}
	for what, e := range exprs {
		var res json.RawMessage
		if err := api.get(ctx, "/api/v1/query", url.Values{"query": {e}}, &res); err != nil {
			t.Errorf("%s: Prometheus refuses %q: %v", what, e, err)
		}
		ms, err := deploycheck.Metrics(e)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			names[m] = true
		}
	}
	var missing []string
	for m := range names {
		var res struct {
			Result []any `json:"result"`
		}
		if err := api.get(ctx, "/api/v1/query", url.Values{"query": {fmt.Sprintf(`count({__name__=%q})`, m)}}, &res); err != nil {
			t.Fatal(err)
		}
		if len(res.Result) == 0 {
			missing = append(missing, m)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("metrics named by alerts or the dashboard but absent from the scraped series: %s", strings.Join(missing, ", "))
	}
}

// dashboardExprs lists the "expr" strings of a Grafana dashboard.
func dashboardExprs(v any) []string {
	var out []string
	switch x := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if s, ok := x[k].(string); ok && k == "expr" {
				out = append(out, s)
				continue
			}
			out = append(out, dashboardExprs(x[k])...)
		}
	case []any:
		for _, e := range x {
			out = append(out, dashboardExprs(e)...)
		}
	}
	return out
}
