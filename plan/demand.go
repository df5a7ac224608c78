package plan

import (
	"cmp"
	"maps"
	"math"
	"slices"
	"strings"
)

// SumDemand is one region's demand per policy: the sum over its nodes'
// reports of offered and admitted rates, per policy and per pressured
// subject (denied when any node denied it). Pressured subjects are ranked
// by summed offered rate, at most maxSubjects per policy, and at most
// 4·maxSubjects distinct ones are summed per policy. Reports are input:
// a rate that is not a finite non-negative number counts as 0.
func SumDemand(reports []map[string]PolicyDemand, maxSubjects int) map[string]PolicyDemand {
	per := map[string][]PolicyDemand{}
	for _, rep := range reports {
		for _, name := range slices.Sorted(maps.Keys(rep)) {
			per[name] = append(per[name], rep[name])
		}
	}
	out := make(map[string]PolicyDemand, len(per))
	for name, ds := range per {
		out[name] = SumPolicyDemand(ds, maxSubjects)
	}
	return out
}

// SumPolicyDemand is SumDemand for one policy, whose demand in each
// node's report is one of ds, in the reports' order: a caller that keeps
// the reports sums again only the policies whose demand changed.
func SumPolicyDemand(ds []PolicyDemand, maxSubjects int) PolicyDemand {
	var offered, admitted float64
	subjects := map[string]*SubjectDemand{}
	for _, d := range ds {
		offered += orZero(d.Offered)
		admitted += orZero(d.Admitted)
		for i, sd := range d.Pressured {
			if i >= maxSubjects {
				break
			}
			cur := subjects[sd.Subject]
			if cur == nil {
				if len(subjects) >= 4*maxSubjects {
					continue
				}
				cur = &SubjectDemand{Subject: sd.Subject}
				subjects[sd.Subject] = cur
			}
			cur.Offered += orZero(sd.Offered)
			cur.Admitted += orZero(sd.Admitted)
			cur.Denied = cur.Denied || sd.Denied
		}
	}
	pd := PolicyDemand{Offered: offered, Admitted: admitted}
	for _, sd := range subjects {
		pd.Pressured = append(pd.Pressured, *sd)
	}
	slices.SortFunc(pd.Pressured, func(x, y SubjectDemand) int {
		if x.Offered != y.Offered {
			return cmp.Compare(y.Offered, x.Offered)
		}
		return strings.Compare(x.Subject, y.Subject)
	})
	if len(pd.Pressured) > maxSubjects {
		pd.Pressured = pd.Pressured[:maxSubjects]
	}
	return pd
}

// orZero is v when it is a finite non-negative number, else 0: reported
// rates are input.
func orZero(v float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return 0
	}
	return v
}
