package rebalance

import (
	"maps"
	"slices"
	"sort"

	"github.com/quotacoord/quota/internal/etcdlayout"
)

// sumDemand is one region's demand: the sum over its nodes' reports of
// offered and admitted rates, per policy and per pressured subject (a
// subject is denied when any node denied it). Pressured subjects are
// ranked by summed offered rate, at most maxSubjects per policy. At is the
// latest report's and IntervalSeconds the longest interval.
func sumDemand(region string, reports []etcdlayout.DemandReport, maxSubjects int) etcdlayout.DemandReport {
	out := etcdlayout.DemandReport{Region: region, Policies: map[string]etcdlayout.PolicyDemand{}}
	type acc struct {
		offered, admitted float64
		subjects          map[string]*etcdlayout.SubjectDemand
	}
	pols := map[string]*acc{}
	for _, rep := range reports {
		if rep.At.After(out.At) {
			out.At = rep.At
		}
		out.IntervalSeconds = max(out.IntervalSeconds, finite(rep.IntervalSeconds))
		for _, name := range slices.Sorted(maps.Keys(rep.Policies)) {
			d := rep.Policies[name]
			a := pols[name]
			if a == nil {
				a = &acc{subjects: map[string]*etcdlayout.SubjectDemand{}}
				pols[name] = a
			}
			a.offered += finite(d.Offered)
			a.admitted += finite(d.Admitted)
			for i, sd := range d.Pressured {
				if i >= maxSubjects {
					break
				}
				cur := a.subjects[sd.Subject]
				if cur == nil {
					if len(a.subjects) >= 4*maxSubjects {
						continue
					}
					cur = &etcdlayout.SubjectDemand{Subject: sd.Subject}
					a.subjects[sd.Subject] = cur
				}
				cur.Offered += finite(sd.Offered)
				cur.Admitted += finite(sd.Admitted)
				cur.Denied = cur.Denied || sd.Denied
			}
		}
	}
	for name, a := range pols {
		pd := etcdlayout.PolicyDemand{Offered: a.offered, Admitted: a.admitted}
		for _, sd := range a.subjects {
			pd.Pressured = append(pd.Pressured, *sd)
		}
		sort.Slice(pd.Pressured, func(i, j int) bool {
			x, y := pd.Pressured[i], pd.Pressured[j]
			if x.Offered != y.Offered {
				return x.Offered > y.Offered
			}
			return x.Subject < y.Subject
		})
		if len(pd.Pressured) > maxSubjects {
			pd.Pressured = pd.Pressured[:maxSubjects]
		}
		out.Policies[name] = pd
	}
	return out
}
