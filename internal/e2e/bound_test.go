package e2e

import (
	"time"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/boundcheck"
	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/policy"
)

// clockSlack is how far the instants the drivers record may be from the
// stores' (Redis TIME, read from the same host clock in microseconds).
const clockSlack = time.Millisecond

// checkBound runs the bound checker over every admitted decision the
// drivers recorded: in no window did the regions together admit more
// than one global limiter of each policy could. Each decision lies
// between the send of its check and the arrival of its answer. A
// violation fails the test and prints its window, the regions' shares
// (the subject's, from the allocations published) and its decisions.
func (e *env) checkBound() boundcheck.Report {
	e.t.Helper()
	limits := map[string]bucket.Limits{}
	hist := map[string][]etcdlayout.Allocation{}
	for _, doc := range e.docs {
		set, err := policy.Parse("e2e.yaml", doc)
		if err != nil {
			e.t.Fatal(err)
		}
		for _, p := range set.Policies() {
			limits[p.Name] = p.Limits
			hist[p.Name] = e.allocHistory(p.Name)
		}
	}
	var adms []boundcheck.Admission
	for _, d := range e.drivers {
		d.mu.Lock()
		adms = append(adms, d.admitted...)
		d.mu.Unlock()
	}
	if e.admissions != nil {
		adms = append(adms, e.admissions()...)
	}
	rep, err := boundcheck.Check(boundcheck.Config{Limits: limits, Slack: clockSlack}, adms)
	if err != nil {
		e.t.Fatalf("bound check: %v", err)
	}
	// The shares a violation's subject held, as published.
	shareAt := func(policy, subject, region string, at time.Time) float64 {
		s := -1.0 // no allocation published yet
		for _, a := range hist[policy] {
			if !a.PublishedAt.After(at) {
				s = subjectShare(a, subject, region)
			}
		}
		return s
	}
	for i := range rep.Violations {
		v := &rep.Violations[i]
		v.Shares, v.SharesAtEnd = map[string]float64{}, map[string]float64{}
		for r := range v.ByRegion {
			v.Shares[r] = shareAt(v.Policy, v.Subject, r, v.From)
			v.SharesAtEnd[r] = shareAt(v.Policy, v.Subject, r, v.To)
		}
	}
	e.t.Logf("bound check: %d admitted decisions, %d windows checked, %d violations; the fullest window admitted %.0f%% of its bound",
		rep.Decisions, rep.Windows, len(rep.Violations), 100*rep.Peak)
	for _, v := range rep.Violations {
		e.t.Errorf("bound violated: %s", v)
	}
	if rep.Decisions == 0 {
		e.t.Error("bound check: no admitted decision recorded")
	}
	return rep
}
