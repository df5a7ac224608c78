package deploycheck

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// promRules is the part of a Prometheus rule file these tests read.
type promRules struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert  string `yaml:"alert"`
			Record string `yaml:"record"`
			Expr   string `yaml:"expr"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// promTests is the part of a promtool unit test file these tests read.
type promTests struct {
	RuleFiles []string `yaml:"rule_files"`
	Tests     []struct {
		AlertRuleTest []struct {
			Alertname string `yaml:"alertname"`
			ExpAlerts []any  `yaml:"exp_alerts"`
		} `yaml:"alert_rule_test"`
	} `yaml:"tests"`
}

// promtool returns the path of Debian's promtool; its absence fails the
// test, since the rules would otherwise go unchecked.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool is not installed (Debian package prometheus; run scripts/deps.sh): %v", err)
	}
	return p
}

func runPromtool(t *testing.T, dir string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, promtool(t), args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// ruleFiles splits deploy/prometheus's YAML files into rule files and
// promtool unit test files (*_test.yaml).
func ruleFiles(t *testing.T) (dir string, rules, tests []string) {
	t.Helper()
	root, _ := repo(t)
	dir = filepath.Join(root, "deploy", "prometheus")
	names, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if strings.HasSuffix(n, "_test.yaml") {
			tests = append(tests, filepath.Base(n))
		} else {
			rules = append(rules, filepath.Base(n))
		}
	}
	if len(rules) == 0 || len(tests) == 0 {
		t.Fatalf("deploy/prometheus: %d rule files and %d test files, want both", len(rules), len(tests))
	}
	return dir, rules, tests
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// TestPromtoolRules runs promtool check rules on every rule file and
// promtool test rules on every unit test file of deploy/prometheus, and
// demands a firing case for every alert.
func TestPromtoolRules(t *testing.T) {
	dir, rules, tests := ruleFiles(t)
	if out, err := runPromtool(t, dir, append([]string{"check", "rules"}, rules...)...); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	if out, err := runPromtool(t, dir, append([]string{"test", "rules"}, tests...)...); err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
	firing := map[string]bool{}
	for _, f := range tests {
		var pt promTests
		readYAML(t, filepath.Join(dir, f), &pt)
		for _, tc := range pt.Tests {
			for _, a := range tc.AlertRuleTest {
				if len(a.ExpAlerts) > 0 {
					firing[a.Alertname] = true
				}
			}
		}
	}
	var missing []string
	for _, f := range rules {
		var pr promRules
		readYAML(t, filepath.Join(dir, f), &pr)
		for _, g := range pr.Groups {
			for _, r := range g.Rules {
				if r.Alert != "" && !firing[r.Alert] {
					missing = append(missing, f+": "+r.Alert)
				}
			}
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("alerts without a firing case in a promtool unit test: %s", strings.Join(missing, ", "))
	}
}

// TestPromtoolTestsCatchSilencedAlerts replaces one alert's expression at
// a time by one that never fires and demands that promtool test rules
// then fail: each alert's firing case really depends on its expression.
func TestPromtoolTestsCatchSilencedAlerts(t *testing.T) {
	dir, rules, tests := ruleFiles(t)
	for _, f := range rules {
		raw, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		var doc yaml.Node
		if err := yaml.Unmarshal(raw, &doc); err != nil {
			t.Fatal(err)
		}
		for _, expr := range alertExprs(&doc) {
			name, node := expr[0].Value, expr[1]
			t.Run(name, func(t *testing.T) {
				tmp := t.TempDir()
				for _, other := range append(append([]string{}, rules...), tests...) {
					b, err := os.ReadFile(filepath.Join(dir, other))
					if err != nil {
						t.Fatal(err)
					}
					if err := os.WriteFile(filepath.Join(tmp, other), b, 0o600); err != nil {
						t.Fatal(err)
					}
				}
				old := node.Value
				node.Value, node.Style = "vector(0) > 1", 0
				silenced, err := yaml.Marshal(&doc)
				node.Value = old
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(tmp, f), silenced, 0o600); err != nil {
					t.Fatal(err)
				}
				out, err := runPromtool(t, tmp, append([]string{"test", "rules"}, tests...)...)
				if err == nil {
					t.Fatalf("promtool test rules passed with %s silenced:\n%s", name, out)
				}
				if !bytes.Contains([]byte(out), []byte(name)) {
					t.Errorf("promtool failed, but not on %s:\n%s", name, out)
				}
			})
		}
	}
}

// alertExprs finds each alerting rule's name node and expr node in a
// parsed rule file.
func alertExprs(doc *yaml.Node) [][2]*yaml.Node {
	var out [][2]*yaml.Node
	var walk func(n *yaml.Node)
	walk = func(n *yaml.Node) {
		if n.Kind == yaml.MappingNode {
			var name, expr *yaml.Node
			for i := 0; i+1 < len(n.Content); i += 2 {
				switch n.Content[i].Value {
				case "alert":
					name = n.Content[i+1]
				case "expr":
					expr = n.Content[i+1]
				}
			}
			if name != nil && expr != nil {
				out = append(out, [2]*yaml.Node{name, expr})
				return
			}
		}
		for _, c := range n.Content {
			walk(c)
		}
	}
	walk(doc)
	return out
}
