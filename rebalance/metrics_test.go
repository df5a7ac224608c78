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
		if got := gauges(t, reg, "quota_coordinator_share", "policy", "region"); got != c.want {
			t.Errorf("snapshot %d: shares %s, want %s", i, got, c.want)
		}
	}
}

// gauges is every series of the gauge family name in reg, as "label
// values… value" joined by "|" in sorted order.
func gauges(t *testing.T, reg *prometheus.Registry, name string, labels ...string) string {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, s := range f.GetMetric() {
			values := map[string]string{}
			for _, l := range s.GetLabel() {
				values[l.GetName()] = l.GetValue()
			}
			var b strings.Builder
			for _, l := range labels {
				b.WriteString(values[l] + " ")
			}
			got = append(got, fmt.Sprintf("%s%g", b.String(), s.GetGauge().GetValue()))
		}
	}
	slices.Sort(got)
	return strings.Join(got, "|")
}

// TestAckLagLooksOnlyAtWhatChanged: the acknowledgement lag of a policy
// is counted again when its allocation changed or the records say its
// acknowledgements did (snapshot.ackMoved), not by looking at every
// allocation × node each round: acknowledgements nobody told of are not
// looked at, and the lag follows once they are.
func TestAckLagLooksOnlyAtWhatChanged(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := newMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	view := func(a, b uint64) *plan.View {
		return &plan.View{Regions: map[string]map[string]plan.Node{
			"a": {"n1": {Acked: map[string]uint64{"p": a}}},
			"b": {"n1": {Acked: map[string]uint64{"p": b}}, "n2": {Acked: map[string]uint64{"p": 5}}},
		}}
	}
	p5 := &plan.Allocation{Policy: "p", Epoch: 5, Default: map[string]float64{"a": 0.5, "b": 0.5}}
	p6 := &plan.Allocation{Policy: "p", Epoch: 6, Default: map[string]float64{"a": 0.5, "b": 0.5}}
	moved := newDirtySet()
	for i, c := range []struct {
		what  string
		view  *plan.View
		alloc *plan.Allocation
		mark  bool
		want  string
	}{
		{"the first snapshot counts every policy", view(3, 4), p5, false, "a 2|b 1"},
		{"acknowledgements nobody told of are not looked at", view(5, 5), p5, false, "a 2|b 1"},
		{"acknowledgements told of are", view(5, 5), p5, true, "a 0|b 0"},
		{"a new allocation is counted", view(5, 5), p6, false, "a 1|b 1"},
		{"the policy gone", view(5, 5), nil, false, ""},
	} {
		if c.mark {
			moved.mark("p")
		}
		allocs := map[string]*plan.Allocation{}
		if c.alloc != nil {
			allocs["p"] = c.alloc
		}
		m.observe(&snapshot{view: c.view, allocs: allocs, ackMoved: moved})
		if got := gauges(t, reg, "quota_coordinator_ack_lag_epochs", "region"); got != c.want {
			t.Errorf("%d, %s: lag %q, want %q", i, c.what, got, c.want)
		}
	}
}
