package e2e

import (
	"time"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/boundcheck"
	"github.com/quotacoord/quota/internal/policy"
)

// checkBound runs the bound checker over every admitted decision the
// regions' drivers recorded: in no window did the regions together admit
// more than one global limiter of each policy could. A recorded instant
// is when the answer arrived, so the slack is the longest call seen.
func (e *env) checkBound() boundcheck.Report {
	e.t.Helper()
	set, err := policy.Parse("e2e.yaml", policyDoc)
	if err != nil {
		e.t.Fatal(err)
	}
	limits := map[string]bucket.Limits{}
	for _, p := range set.Policies() {
		limits[p.Name] = p.Limits
	}
	var adms []boundcheck.Admission
	var slack time.Duration
	for _, r := range e.regions {
		r.load.mu.Lock()
		adms = append(adms, r.load.admitted...)
		slack = max(slack, r.load.maxRTT)
		r.load.mu.Unlock()
	}
	hist := e.allocHistory()
	rep, err := boundcheck.Check(boundcheck.Config{Limits: limits, Slack: slack,
		Shares: func(policy, region string, at time.Time) float64 {
			s := -1.0 // unknown: the history is the exports policy's
			if policy != policyName {
				return s
			}
			for _, a := range hist {
				if !a.PublishedAt.After(at) {
					s = share(a, region)
				}
			}
			return s
		}}, adms)
	if err != nil {
		e.t.Fatalf("bound check: %v", err)
	}
	e.t.Logf("bound check: %d admitted decisions, %d windows checked (slack %v), %d violations",
		rep.Decisions, rep.Windows, slack, len(rep.Violations))
	for _, v := range rep.Violations {
		e.t.Errorf("bound violated: %s", v)
	}
	if rep.Decisions == 0 {
		e.t.Error("bound check: no admitted decision recorded")
	}
	return rep
}
