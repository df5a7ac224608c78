package sim

import (
	"bytes"
	"encoding/xml"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// svgFacts parses data as XML and returns the root element's name, every
// <text> content and the point counts of every <polyline>.
func svgFacts(t *testing.T, data []byte) (root string, texts []string, lines []int) {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(data))
	dec.Strict = true
	var inText bool
	var cur strings.Builder
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v", err)
		}
		switch el := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = el.Name.Local
			}
			if el.Name.Local == "text" {
				inText = true
				cur.Reset()
			}
			if el.Name.Local == "polyline" {
				for _, a := range el.Attr {
					if a.Name.Local == "points" {
						lines = append(lines, len(strings.Fields(a.Value)))
					}
				}
			}
		case xml.CharData:
			if inText {
				cur.Write(el)
			}
		case xml.EndElement:
			if el.Name.Local == "text" {
				texts = append(texts, cur.String())
				inText = false
			}
		}
	}
	return root, texts, lines
}

func checkPlot(t *testing.T, name string, data []byte, labels ...string) {
	t.Helper()
	root, texts, lines := svgFacts(t, data)
	if root != "svg" {
		t.Errorf("%s: root element %q, want svg", name, root)
	}
	for _, l := range labels {
		found := false
		for _, tx := range texts {
			found = found || tx == l
		}
		if !found {
			t.Errorf("%s: no axis label %q among %q", name, l, texts)
		}
	}
	if len(lines) == 0 {
		t.Errorf("%s: no line drawn", name)
	}
	for i, n := range lines {
		if n < 2 {
			t.Errorf("%s: line %d has %d points", name, i, n)
		}
	}
}

var plotLabels = map[string][]string{
	"overshoot.svg":       {"rebalance interval (s, log scale)", "worst overshoot", "independent buckets"},
	"under_admission.svg": {"rebalance interval (s, log scale)", "under-admission"},
	"series-steady.svg":   {"time (min)", "admitted requests / s", "ideal global"},
}

// TestReportPlots writes a small sweep's report and checks every plot is
// well-formed SVG with labelled axes.
func TestReportPlots(t *testing.T) {
	sc, err := LoadScenario("steady")
	if err != nil {
		t.Fatal(err)
	}
	var results []*Result
	for _, iv := range []time.Duration{time.Second, 30 * time.Second} {
		for _, p := range []Protocol{TwoStep, Naive} {
			res, err := Run(Config{Scenario: sc, Subjects: 100, Duration: 2 * time.Minute, Seed: 2, RebalanceInterval: iv, Protocol: p})
			if err != nil {
				t.Fatal(err)
			}
			results = append(results, res)
		}
	}
	dir := t.TempDir()
	if err := WriteReport(dir, results); err != nil {
		t.Fatal(err)
	}
	for name, labels := range plotLabels {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		checkPlot(t, name, data, labels...)
	}
}

// TestDocPlots checks the plots committed for the README (docs/img, made
// from `make sim` as docs/img/README.md says).
func TestDocPlots(t *testing.T) {
	for name, src := range map[string]string{"sim-overshoot.svg": "overshoot.svg", "sim-under-admission.svg": "under_admission.svg"} {
		data, err := os.ReadFile(filepath.Join("..", "docs", "img", name))
		if err != nil {
			t.Fatal(err)
		}
		checkPlot(t, name, data, plotLabels[src]...)
		for _, s := range Builtin() {
			if !bytes.Contains(data, []byte(s+" two-step")) || !bytes.Contains(data, []byte(s+" naive")) {
				t.Errorf("%s: scenario %s missing (not made by the default sweep?)", name, s)
			}
		}
	}
}
