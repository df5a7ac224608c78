package rebalance

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotacoord/quota/plan"
)

// TestShareGaugesFollowAllocations: the share series show each
// snapshot's allocations, as snapshots replace an allocation (a region
// left out), keep it, and drop a policy.
func TestShareGaugesFollowAllocations(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := newMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	a1 := &plan.Allocation{Policy: "p", Epoch: 1, Default: map[string]float64{"a": 0.5, "b": 0.5}}
	q1 := &plan.Allocation{Policy: "q", Epoch: 1, Default: map[string]float64{"a": 1}}
	a2 := &plan.Allocation{Policy: "p", Epoch: 2, Default: map[string]float64{"a": 0.8}}
	for i, c := range []struct {
		allocs map[string]*plan.Allocation
		want   string
	}{
		{map[string]*plan.Allocation{"p": a1, "q": q1}, "p a 0.5|p b 0.5|q a 1"},
		{map[string]*plan.Allocation{"p": a2, "q": q1}, "p a 0.8|q a 1"},
		{map[string]*plan.Allocation{"p": a2, "q": q1}, "p a 0.8|q a 1"},
		{map[string]*plan.Allocation{"p": a2}, "p a 0.8"},
		{map[string]*plan.Allocation{"p": a1}, "p a 0.5|p b 0.5"},
	} {
		m.observe(&snapshot{view: &plan.View{}, allocs: c.allocs})
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, f := range fams {
			if f.GetName() != "quota_coordinator_share" {
				continue
			}
			for _, s := range f.GetMetric() {
				labels := map[string]string{}
				for _, l := range s.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				got = append(got, fmt.Sprintf("%s %s %g", labels["policy"], labels["region"], s.GetGauge().GetValue()))
			}
		}
		slices.Sort(got)
		if strings.Join(got, "|") != c.want {
			t.Errorf("snapshot %d: shares %s, want %s", i, strings.Join(got, "|"), c.want)
		}
	}
}
