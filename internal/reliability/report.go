package reliability

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// Kinds of Entry.
const (
	KindFault     = "fault"
	KindLoad      = "load"
	KindSecurity  = "security"
	KindFuzz      = "fuzz"
	KindInvariant = "invariant"
	// KindBound is one randomized live run whose admitted decisions were
	// checked against the cross-region bound (internal/boundcheck).
	KindBound = "bound"
)

// Entry is one line of a report: a fault injected, a soak, a security
// check or a fuzz run, with what it measured.
type Entry struct {
	Kind string `json:"kind"`
	Name string `json:"name"`
	// Injected says the fault (or check) really happened; Survived that
	// everything it asserts held.
	Injected bool `json:"injected"`
	Survived bool `json:"survived"`
	// Decisions counts the checks decided during the fault by how they
	// were decided: normal, open, closed, local.
	Decisions map[string]int64 `json:"decisions,omitempty"`
	// Lost counts checks that got no decision (an error or no answer).
	Lost int64 `json:"lost"`
	// InvariantChecks counts the invariant checks made (etcd revisions
	// replayed, or budget bounds checked).
	InvariantChecks int64 `json:"invariant_checks,omitempty"`
	// Violations counts invariant violations found.
	Violations int64 `json:"violations,omitempty"`
	// BoundDecisions and BoundWindows count the admitted decisions and
	// the windows a bound row checked; its windows over the bound are
	// counted in Violations.
	BoundDecisions int64 `json:"bound_decisions,omitempty"`
	BoundWindows   int64 `json:"bound_windows,omitempty"`
	// FuzzExecs counts fuzz executions (bad inputs tried).
	FuzzExecs int64 `json:"fuzz_execs,omitempty"`
	// Memory before and after, in bytes, by what was measured
	// (node_heap, redis_used_memory, redis_keys).
	Before map[string]int64 `json:"before,omitempty"`
	After  map[string]int64 `json:"after,omitempty"`
	// P99 is the 99th percentile decision latency, when measured.
	P99 time.Duration `json:"p99,omitempty"`
	// Recovery is how long normal decisions took to resume.
	Recovery time.Duration `json:"recovery,omitempty"`
	// Requests, LimitsLifted and FailOpen describe an attack (a security
	// row): the requests the attacker sent, the admissions beyond the
	// limits those requests were under, and the answers the input turned
	// into admission by failing open (an error a failing-open proxy admits,
	// or a degraded open decision). The last two must be 0.
	Requests     int64 `json:"requests,omitempty"`
	LimitsLifted int64 `json:"limits_lifted,omitempty"`
	FailOpen     int64 `json:"fail_open,omitempty"`
	// Note is free text.
	Note string `json:"note,omitempty"`
}

// Recorder appends entries to a report file as JSON lines.
type Recorder struct {
	mu   sync.Mutex
	path string
}

// NewRecorder records to path; an empty path records nothing.
func NewRecorder(path string) *Recorder { return &Recorder{path: path} }

// Record appends e to the report file.
func (r *Recorder) Record(e Entry) error {
	if r == nil || r.path == "" {
		return nil
	}
	b, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("reliability: encode entry %q: %w", e.Name, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	f, err := os.OpenFile(r.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("reliability: open report: %w", err)
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return fmt.Errorf("reliability: write report: %w", err)
	}
	return f.Close()
}

// MaxEntries bounds the entries ReadEntries accepts.
const MaxEntries = 100000

// ReadEntries reads JSON lines written by a Recorder.
func ReadEntries(rd io.Reader) ([]Entry, error) {
	var out []Entry
	sc := bufio.NewScanner(rd)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		if len(out) >= MaxEntries {
			return nil, fmt.Errorf("reliability: more than %d entries", MaxEntries)
		}
		var e Entry
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			return nil, fmt.Errorf("reliability: report line %d: %w", n, err)
		}
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reliability: read report: %w", err)
	}
	return out, nil
}

// fuzzLine matches the progress lines of `go test -fuzz`.
var fuzzLine = regexp.MustCompile(`fuzz: elapsed: [^,]+, execs: (\d+)`)

// ErrNoFuzzRun reports fuzz output without any progress line.
var ErrNoFuzzRun = errors.New("reliability: no fuzz progress line")

// FuzzExecs returns the executions of one `go test -fuzz` run from its
// output: the last progress line's count.
func FuzzExecs(output string) (int64, error) {
	m := fuzzLine.FindAllStringSubmatch(output, -1)
	if len(m) == 0 {
		return 0, ErrNoFuzzRun
	}
	n, err := strconv.ParseInt(m[len(m)-1][1], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("reliability: fuzz execs %q: %w", m[len(m)-1][1], err)
	}
	return n, nil
}

// Summary is the table of `make reliability`.
type Summary struct {
	FaultsInjected, FaultsSurvived int
	Decisions                      map[string]int64
	FuzzExecs                      int64
	FuzzTargets                    int
	InvariantChecks, Violations    int64
	Lost                           int64
	// Attacks counts security rows; Requests, LimitsLifted and FailOpen
	// add up theirs.
	Attacks                          int
	Requests, LimitsLifted, FailOpen int64
	// BoundRuns counts bound rows; BoundDecisions, BoundWindows and
	// BoundViolations add up theirs.
	BoundRuns                                     int
	BoundDecisions, BoundWindows, BoundViolations int64
	Failed                                        []string
	Rows                                          []Entry
}

// Summarize adds up entries.
func Summarize(entries []Entry) Summary {
	s := Summary{Decisions: map[string]int64{}}
	for _, e := range entries {
		s.Rows = append(s.Rows, e)
		if e.Kind == KindFault && e.Injected {
			s.FaultsInjected++
			if e.Survived {
				s.FaultsSurvived++
			}
		}
		if e.Kind == KindFault {
			for k, v := range e.Decisions {
				s.Decisions[k] += v
			}
		}
		if e.Kind == KindFuzz {
			s.FuzzTargets++
		}
		if e.Kind == KindSecurity {
			s.Attacks++
			s.Requests += e.Requests
			s.LimitsLifted += e.LimitsLifted
			s.FailOpen += e.FailOpen
		}
		if e.Kind == KindBound {
			s.BoundRuns++
			s.BoundDecisions += e.BoundDecisions
			s.BoundWindows += e.BoundWindows
			s.BoundViolations += e.Violations
		}
		s.FuzzExecs += e.FuzzExecs
		s.InvariantChecks += e.InvariantChecks
		s.Violations += e.Violations
		s.Lost += e.Lost
		if !e.Survived {
			s.Failed = append(s.Failed, e.Kind+"/"+e.Name)
		}
	}
	return s
}

// OK reports whether nothing failed, nothing was lost, no invariant was
// violated, and no attack lifted a limit or made a decision fail open.
func (s Summary) OK() bool {
	return len(s.Failed) == 0 && s.Lost == 0 && s.Violations == 0 && s.LimitsLifted == 0 && s.FailOpen == 0
}

func joinCounts(m map[string]int64) string {
	if len(m) == 0 {
		return "-"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, m[k])
	}
	return strings.Join(parts, " ")
}

func mib(b int64) string { return fmt.Sprintf("%.1fMiB", float64(b)/(1<<20)) }

func memory(e Entry) string {
	if len(e.Before) == 0 {
		return "-"
	}
	keys := make([]string, 0, len(e.Before))
	for k := range e.Before {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		b, a := e.Before[k], e.After[k]
		if strings.HasSuffix(k, "_keys") || strings.HasSuffix(k, "goroutines") {
			parts = append(parts, fmt.Sprintf("%s %d→%d", k, b, a))
		} else {
			parts = append(parts, fmt.Sprintf("%s %s→%s", k, mib(b), mib(a)))
		}
	}
	return strings.Join(parts, ", ")
}

// WriteTable prints one row per entry and the totals.
func (s Summary) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tNAME\tRESULT\tDECISIONS DURING FAULT\tLOST\tINVARIANT CHECKS\tMEMORY BEFORE→AFTER\tNOTE")
	for _, e := range s.Rows {
		note := e.Note
		if e.FuzzExecs > 0 {
			note = strings.TrimSpace(fmt.Sprintf("%d execs %s", e.FuzzExecs, note))
		}
		if e.P99 > 0 {
			note = strings.TrimSpace(fmt.Sprintf("p99 %v %s", e.P99, note))
		}
		if e.Recovery > 0 {
			note = strings.TrimSpace(fmt.Sprintf("recovered in %v %s", e.Recovery.Round(time.Millisecond), note))
		}
		inv := "-"
		switch {
		case e.Kind == KindBound:
			inv = fmt.Sprintf("%d decisions, %d windows (%d violations)", e.BoundDecisions, e.BoundWindows, e.Violations)
		case e.InvariantChecks > 0:
			inv = fmt.Sprintf("%d (%d violations)", e.InvariantChecks, e.Violations)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", e.Kind, e.Name, result(e), joinCounts(e.Decisions), e.Lost, inv, memory(e), note)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("reliability: write table: %w", err)
	}
	if err := s.writeSecurity(w); err != nil {
		return err
	}
	verdict := "PASS"
	if !s.OK() {
		verdict = "FAIL"
	}
	_, err := fmt.Fprintf(w, `
faults injected / survived:      %d / %d
decisions during faults by mode: %s
bad inputs tried (fuzz execs):   %d over %d targets
invariant checks:                %d (%d violations)
lost decisions:                  %d (must be 0)
bound runs (live, randomized):   %d
decisions checked against bound: %d
windows checked against bound:   %d
windows over the bound:          %d (must be 0)
attacks tried:                   %d (%d requests)
limits lifted:                   %d (must be 0)
fail-open decisions by input:    %d (must be 0)
verdict:                         %s
`, s.FaultsInjected, s.FaultsSurvived, joinCounts(s.Decisions), s.FuzzExecs, s.FuzzTargets, s.InvariantChecks, s.Violations, s.Lost,
		s.BoundRuns, s.BoundDecisions, s.BoundWindows, s.BoundViolations,
		s.Attacks, s.Requests, s.LimitsLifted, s.FailOpen, verdict)
	if err == nil && len(s.Failed) > 0 {
		_, err = fmt.Fprintf(w, "failed:                          %s\n", strings.Join(s.Failed, ", "))
	}
	return err
}

// writeSecurity prints the security table: one row per attack with the
// requests it sent, the limits it lifted and the decisions its input made
// fail open.
func (s Summary) writeSecurity(w io.Writer) error {
	if s.Attacks == 0 {
		return nil
	}
	if _, err := fmt.Fprintln(w, "\nsecurity"); err != nil {
		return fmt.Errorf("reliability: write security table: %w", err)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ATTACK\tRESULT\tREQUESTS\tLIMITS LIFTED\tFAIL-OPEN BY INPUT")
	for _, e := range s.Rows {
		if e.Kind != KindSecurity {
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\n", e.Name, result(e), e.Requests, e.LimitsLifted, e.FailOpen)
	}
	fmt.Fprintf(tw, "%d attacks\t\t%d\t%d\t%d\n", s.Attacks, s.Requests, s.LimitsLifted, s.FailOpen)
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("reliability: write security table: %w", err)
	}
	return nil
}

// result is a row's RESULT column.
func result(e Entry) string {
	switch {
	case !e.Injected:
		return "NOT INJECTED"
	case !e.Survived:
		return "FAILED"
	}
	return "ok"
}
