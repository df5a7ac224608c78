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
	type acc struct {
		offered, admitted float64
		subjects          map[string]*SubjectDemand
	}
	pols := map[string]*acc{}
	for _, rep := range reports {
		for _, name := range slices.Sorted(maps.Keys(rep)) {
			d := rep[name]
			a := pols[name]
			if a == nil {
				a = &acc{subjects: map[string]*SubjectDemand{}}
				pols[name] = a
			}
			a.offered += orZero(d.Offered)
			a.admitted += orZero(d.Admitted)
			for i, sd := range d.Pressured {
				if i >= maxSubjects {
					break
				}
				cur := a.subjects[sd.Subject]
				if cur == nil {
					if len(a.subjects) >= 4*maxSubjects {
						continue
					}
					cur = &SubjectDemand{Subject: sd.Subject}
					a.subjects[sd.Subject] = cur
				}
				cur.Offered += orZero(sd.Offered)
				cur.Admitted += orZero(sd.Admitted)
				cur.Denied = cur.Denied || sd.Denied
			}
		}
	}
	out := make(map[string]PolicyDemand, len(pols))
	for name, a := range pols {
		pd := PolicyDemand{Offered: a.offered, Admitted: a.admitted}
		for _, sd := range a.subjects {
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
		out[name] = pd
	}
	return out
}

// orZero is v when it is a finite non-negative number, else 0: reported
// rates are input.
func orZero(v float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return 0
	}
	return v
}
