package boundcheck

import (
	"strings"
	"testing"
	"time"

	"github.com/quotacoord/quota/bucket"
)

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// at returns n admissions of cost 1 of policy p for subject "s" by region
// r, spread evenly over [from, from+over).
func at(p, r string, from time.Duration, over time.Duration, n int) []Admission {
	out := make([]Admission, n)
	for i := range out {
		out[i] = Admission{Policy: p, Subject: "s", Region: r, Cost: 1, At: t0.Add(from + over*time.Duration(i)/time.Duration(n))}
	}
	return out
}

func join(parts ...[]Admission) []Admission {
	var out []Admission
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func TestCheck(t *testing.T) {
	limits := map[string]bucket.Limits{
		"tb": {Capacity: 10, RefillPerSecond: 1},
		"fw": {Algorithm: bucket.FixedWindow, Capacity: 60, Window: time.Minute},
		"sl": {Algorithm: bucket.SlidingLog, Capacity: 60, Window: time.Minute},
		"ov": {Capacity: 10, RefillPerSecond: 1, Overcommit: 0.5},
	}
	cases := []struct {
		name  string
		adms  []Admission
		slack time.Duration
		want  string // "" : no violation; else a substring of the first
	}{
		{"burst then refill", join(at("tb", "a", 0, time.Second, 10), at("tb", "b", 5*time.Second, 5*time.Second, 5)), 0, ""},
		{"two regions each a full burst", join(at("tb", "a", 0, time.Second, 10), at("tb", "b", 0, time.Second, 10)), 0, "tb/s admitted 20"},
		{"overcommit allows 1.5 bursts", join(at("ov", "a", 0, time.Second, 10), at("ov", "b", 0, time.Second, 5)), 0, ""},
		{"overcommit exceeded", join(at("ov", "a", 0, time.Second, 10), at("ov", "b", 0, time.Second, 8)), 0, "ov/s admitted 18"},
		{"fixed window within budget", join(at("fw", "a", 0, 30*time.Second, 30), at("fw", "b", 30*time.Second, 30*time.Second, 30)), 0, ""},
		{"a window's budget again in the next window", join(at("fw", "a", 0, 30*time.Second, 60), at("fw", "b", time.Minute, 30*time.Second, 60)), 0, ""},
		{"fixed window share grew mid-window", join(at("fw", "b", 0, 10*time.Second, 30), at("fw", "a", 20*time.Second, 30*time.Second, 48)), 0, "fw/s admitted 78"},
		{"slack narrows the window", join(at("fw", "a", 0, time.Second, 30), at("fw", "b", 10*time.Second, 10*time.Second, 40)), 2 * time.Second, ""},
		{"sliding log across the boundary", join(at("sl", "a", 40*time.Second, 10*time.Second, 40), at("sl", "b", 70*time.Second, 10*time.Second, 40)), 0, "sl/s admitted 80"},
	}
	for _, c := range cases {
		rep, err := Check(Config{Limits: limits, Slack: c.slack, Windows: []time.Duration{time.Second, 10 * time.Second},
			Shares: func(policy, region string, at time.Time) float64 { return 0.5 }}, c.adms)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if rep.Decisions != len(c.adms) || rep.Windows == 0 {
			t.Errorf("%s: %d decisions, %d windows checked", c.name, rep.Decisions, rep.Windows)
		}
		if over := rep.Peak > 1+1e-9; over != (len(rep.Violations) > 0) || rep.Peak <= 0 {
			t.Errorf("%s: peak %.3f of the bound with %d violations", c.name, rep.Peak, len(rep.Violations))
		}
		switch {
		case c.want == "" && len(rep.Violations) > 0:
			t.Errorf("%s: unexpected violation %v", c.name, rep.Violations[0])
		case c.want != "" && len(rep.Violations) == 0:
			t.Errorf("%s: no violation, want %q", c.name, c.want)
		case c.want != "" && !strings.Contains(rep.Violations[0].String(), c.want):
			t.Errorf("%s: violation %v, want %q", c.name, rep.Violations[0], c.want)
		case c.want != "" && !strings.Contains(rep.Violations[0].String(), "(share 0.500)"):
			t.Errorf("%s: violation %v without the shares", c.name, rep.Violations[0])
		}
	}
}

func TestCheckRejectsBadInput(t *testing.T) {
	limits := map[string]bucket.Limits{"tb": {Capacity: 10, RefillPerSecond: 1}}
	for _, adms := range [][]Admission{
		{{Policy: "other", Subject: "s", Cost: 1, At: t0}},
		{{Policy: "tb", Subject: "s", Cost: 0, At: t0}},
		{{Policy: "tb", Subject: "s", Cost: 1, At: t0, Sent: t0.Add(time.Millisecond)}},
	} {
		if _, err := Check(Config{Limits: limits}, adms); err == nil {
			t.Errorf("Check(%+v) accepted", adms)
		}
	}
	if _, err := Check(Config{Limits: limits, Slack: -time.Second}, nil); err == nil {
		t.Error("a negative slack was accepted")
	}
}

// sentBefore returns adms with each Sent set d before its At.
func sentBefore(d time.Duration, adms []Admission) []Admission {
	for i := range adms {
		adms[i].Sent = adms[i].At.Add(-d)
	}
	return adms
}

// TestCheckSentInstants: a decision known only to lie in [Sent, At]
// counts in a window only when the whole interval is inside it, so a
// slow answer (a paused node's) cannot make a violation, while answers
// that arrive quickly are checked sharply.
func TestCheckSentInstants(t *testing.T) {
	limits := map[string]bucket.Limits{
		"tb": {Capacity: 10, RefillPerSecond: 1},
		"fw": {Algorithm: bucket.FixedWindow, Capacity: 60, Window: time.Minute},
	}
	cfg := Config{Limits: limits, Windows: []time.Duration{time.Second}}
	cases := []struct {
		name string
		adms []Admission
		want int // violations
	}{
		// 12 in one second: over C + r·1s = 11 when the answers came fast.
		{"fast answers", sentBefore(time.Millisecond, at("tb", "a", 0, time.Second, 12)), 1},
		// The same answers, each sent 3 s before it arrived: they may
		// have been decided over 4 s, under the bound of any 1 s window.
		{"slow answers", sentBefore(3*time.Second, at("tb", "a", 0, time.Second, 12)), 0},
		// 70 in one aligned minute, but those sent before it started
		// may belong to the previous minute.
		{"window straddled by the sends", sentBefore(20*time.Second, at("fw", "a", time.Second, 30*time.Second, 70)), 0},
		{"window holding the sends", sentBefore(time.Second, at("fw", "a", 2*time.Second, 30*time.Second, 70)), 1},
	}
	for _, c := range cases {
		rep, err := Check(cfg, c.adms)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if len(rep.Violations) != c.want {
			t.Errorf("%s: %d violations %v, want %d", c.name, len(rep.Violations), rep.Violations, c.want)
		}
	}
}

// TestViolationListsDecisions: a violation lists the decisions inside
// its window (at most MaxListed, saying how many more) with their
// region, node and share, and the regions' shares at both ends.
func TestViolationListsDecisions(t *testing.T) {
	limits := map[string]bucket.Limits{"tb": {Capacity: 10, RefillPerSecond: 1}}
	adms := join(at("tb", "a", 0, time.Second, 50), at("tb", "b", 0, time.Second, 50))
	for i := range adms {
		adms[i].Node, adms[i].Share = "n1", 0.25
	}
	shares := func(policy, region string, at time.Time) float64 {
		if at.After(t0) {
			return 0.75
		}
		return 0.5
	}
	rep, err := Check(Config{Limits: limits, Windows: []time.Duration{2 * time.Second}, Shares: shares}, adms)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Violations) != 1 {
		t.Fatalf("%d violations, want 1: %v", len(rep.Violations), rep.Violations)
	}
	v := rep.Violations[0]
	if v.Admitted != 100 || len(v.Decisions) != MaxListed || v.Unlisted != 100-MaxListed {
		t.Fatalf("admitted %d, %d decisions listed, %d unlisted; want 100, %d, %d", v.Admitted, len(v.Decisions), v.Unlisted, MaxListed, 100-MaxListed)
	}
	s := v.String()
	for _, want := range []string{"a=50 (share 0.500 -> 0.750)", "b=50", "a/n1 share 0.250 cost 1", "... 36 more"} {
		if !strings.Contains(s, want) {
			t.Errorf("violation %q lacks %q", s, want)
		}
	}
	if got := strings.Count(s, "\n  +"); got != MaxListed {
		t.Errorf("violation prints %d decisions, want %d", got, MaxListed)
	}
}

// TestCheckWholeRun: a subject admitted a little over the refill rate
// for a long time stays within C + r·W in every short window but not
// over the whole run, which is checked too.
func TestCheckWholeRun(t *testing.T) {
	limits := map[string]bucket.Limits{"tb": {Capacity: 10, RefillPerSecond: 1}}
	cfg := Config{Limits: limits, Windows: []time.Duration{time.Second, 10 * time.Second}}
	for _, c := range []struct {
		n    int
		want string
	}{{105, ""}, {120, "tb/s admitted 120"}} {
		rep, err := Check(cfg, at("tb", "a", 0, 100*time.Second, c.n))
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case c.want == "" && len(rep.Violations) > 0:
			t.Errorf("%d over 100 s: unexpected violation %v", c.n, rep.Violations[0])
		case c.want != "" && (len(rep.Violations) == 0 || !strings.Contains(rep.Violations[0].String(), c.want)):
			t.Errorf("%d over 100 s: violations %v, want %q", c.n, rep.Violations, c.want)
		}
	}
}

// TestIdealAdmitted: a bucket of 5, 2 per second, offered 10 at once then
// one every 100 ms for 2 s admits 5 at once and then its refill, 4.
func TestIdealAdmitted(t *testing.T) {
	var offers []time.Time
	for i := 1; i <= 20; i++ {
		offers = append(offers, t0.Add(time.Duration(i)*100*time.Millisecond))
	}
	for range 10 {
		offers = append(offers, t0) // out of order: sorted first
	}
	l := bucket.Limits{Algorithm: bucket.TokenBucket, Capacity: 5, RefillPerSecond: 2}
	if got := IdealAdmitted(offers, l); got != 9 {
		t.Errorf("IdealAdmitted = %d, want 9", got)
	}
	if got := IdealAdmitted(nil, l); got != 0 {
		t.Errorf("IdealAdmitted of no offers = %d", got)
	}
}
