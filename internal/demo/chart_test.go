package demo

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"testing"
	"time"
)

// checkChart parses an SVG written by Chart.WriteSVG as XML to its end and
// demands an <svg> root, the budget and total series, each region in both
// panels and each phase.
func checkChart(t *testing.T, raw []byte, regions []string, phases []string) {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(raw))
	var root string
	panels := map[string]map[string]bool{}
	seenPhase, seenSeries := map[string]bool{}, map[string]bool{}
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("chart is not well-formed XML: %v", err)
		}
		el, ok := tok.(xml.StartElement)
		if !ok {
			continue
		}
		if root == "" {
			root = el.Name.Local
		}
		attr := map[string]string{}
		for _, a := range el.Attr {
			attr[a.Name.Local] = a.Value
		}
		if r, ok := attr["data-region"]; ok {
			if panels[attr["data-panel"]] == nil {
				panels[attr["data-panel"]] = map[string]bool{}
			}
			panels[attr["data-panel"]][r] = true
		}
		if p, ok := attr["data-phase"]; ok {
			seenPhase[p] = true
		}
		if s, ok := attr["data-series"]; ok {
			seenSeries[s] = true
		}
	}
	if root != "svg" {
		t.Fatalf("root element %q, want svg", root)
	}
	for _, s := range []string{"budget", "total"} {
		if !seenSeries[s] {
			t.Errorf("chart lacks the %s series", s)
		}
	}
	for _, panel := range []string{"admitted", "share"} {
		for _, r := range regions {
			if !panels[panel][r] {
				t.Errorf("chart lacks region %s in the %s panel", r, panel)
			}
		}
	}
	for _, p := range phases {
		if !seenPhase[p] {
			t.Errorf("chart lacks phase %q", p)
		}
	}
}

func TestChartSVG(t *testing.T) {
	s := PartnerStory(9*time.Second, 100)
	s.Phases[0].Name = `steady <"quoted"> & more`
	rec := NewRecorder(len(s.Regions), s.Length())
	for i := 0; i < 90; i++ {
		at := time.Duration(i) * Bin
		rec.Decision(Event{At: at, Region: i % 3, Cost: 1, Admitted: i%4 != 0}, 0)
	}
	c := ChartOf(&s)
	for i := 0; i <= 9; i++ {
		c.AddShares(time.Duration(i)*time.Second, []float64{0.2, 0.3, 0.5})
	}
	c.FillAdmitted(rec, s.Length())
	if c.Step != time.Second || len(c.Admitted[0]) != 9 {
		t.Fatalf("step %v, %d points; want 1s, 9", c.Step, len(c.Admitted[0]))
	}
	var buf bytes.Buffer
	if err := c.WriteSVG(&buf); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range s.Phases {
		names = append(names, p.Name)
	}
	checkChart(t, buf.Bytes(), s.Regions, names)

	if err := (&Chart{}).WriteSVG(io.Discard); !errors.Is(err, ErrChart) {
		t.Errorf("empty chart: %v, want ErrChart", err)
	}
}

// TestChartBounds: share samples stay under MaxShareSamples however long
// the run, and a day-long story draws at most MaxChartPoints points.
func TestChartBounds(t *testing.T) {
	c := &Chart{}
	for i := 0; i < 5*MaxShareSamples; i++ {
		c.AddShares(time.Duration(i)*time.Second, []float64{1})
	}
	if len(c.Shares) > MaxShareSamples || c.Shares[0].At != 0 {
		t.Errorf("%d samples from %v", len(c.Shares), c.Shares[0].At)
	}
	s := PartnerStory(MaxLength, 100)
	c = ChartOf(&s)
	c.FillAdmitted(NewRecorder(3, time.Second), MaxLength)
	if n := len(c.Admitted[0]); n > MaxChartPoints {
		t.Errorf("%d points for %v", n, MaxLength)
	}
}
