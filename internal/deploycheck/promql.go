package deploycheck

import (
	"fmt"
	"sort"
	"strings"
)

// promKeywords are PromQL words that are neither functions nor metrics.
var promKeywords = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true,
	"group_right": true, "and": true, "or": true, "unless": true, "bool": true,
	"offset": true, "atan2": true, "inf": true, "nan": true,
	// Aggregation operators, which may be followed by a grouping clause
	// rather than "(".
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true,
	"stdvar": true, "count": true, "count_values": true, "bottomk": true, "topk": true,
	"quantile": true, "limitk": true, "limit_ratio": true,
}

// groupingWords are followed by a parenthesised label list.
var groupingWords = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
}

// maxExprLen bounds the expressions Metrics reads.
const maxExprLen = 64 << 10

// Metrics returns the metric names an expression reads, sorted and without
// duplicates. It understands enough PromQL for rules and dashboards:
// functions and aggregations (a word followed by "("), label matchers in
// braces, ranges in brackets, strings, numbers, keywords and label lists
// after by, without, on, ignoring, group_left and group_right. Grafana's
// label_values(metric, label) yields metric only. Grafana variables ($x,
// ${x}) are ignored.
func Metrics(expr string) ([]string, error) {
	if len(expr) > maxExprLen {
		return nil, fmt.Errorf("deploycheck: expression of %d bytes, more than %d", len(expr), maxExprLen)
	}
	seen := map[string]bool{}
	i := 0
	skipLabels := false // the next "(" opens a label list
	labelValues := -1   // depth at which label_values' arguments are read
	depth := 0
	argIndex := 0
	for i < len(expr) {
		c := expr[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			j, err := skipString(expr, i)
			if err != nil {
				return nil, err
			}
			i = j
		case c == '{':
			j := strings.IndexByte(expr[i:], '}')
			if j < 0 {
				return nil, fmt.Errorf("deploycheck: unclosed { in %q", expr)
			}
			if i > 0 && expr[i-1] == '$' { // ${var}
				i += j + 1
				continue
			}
			// Skip the matchers, minding quoted braces.
			k := i + 1
			for k < len(expr) && expr[k] != '}' {
				if expr[k] == '"' || expr[k] == '\'' || expr[k] == '`' {
					e, err := skipString(expr, k)
					if err != nil {
						return nil, err
					}
					k = e
					continue
				}
				k++
			}
			if k >= len(expr) {
				return nil, fmt.Errorf("deploycheck: unclosed { in %q", expr)
			}
			i = k + 1
		case c == '[':
			j := strings.IndexByte(expr[i:], ']')
			if j < 0 {
				return nil, fmt.Errorf("deploycheck: unclosed [ in %q", expr)
			}
			i += j + 1
		case c == '(':
			depth++
			if skipLabels {
				j := strings.IndexByte(expr[i:], ')')
				if j < 0 {
					return nil, fmt.Errorf("deploycheck: unclosed ( in %q", expr)
				}
				i += j + 1
				depth--
				skipLabels = false
				continue
			}
			i++
		case c == ')':
			depth--
			if depth < labelValues {
				labelValues = -1
			}
			i++
		case c == ',':
			if depth == labelValues {
				argIndex++
			}
			i++
		case c == '$':
			i++
			for i < len(expr) && isWordByte(expr[i]) {
				i++
			}
		case isWordStart(c):
			j := i
			for j < len(expr) && isWordByte(expr[j]) {
				j++
			}
			word := expr[i:j]
			k := j
			for k < len(expr) && (expr[k] == ' ' || expr[k] == '\t' || expr[k] == '\n' || expr[k] == '\r') {
				k++
			}
			call := k < len(expr) && expr[k] == '('
			switch {
			case groupingWords[word]:
				skipLabels = call
			case promKeywords[word]:
			case call:
				if word == "label_values" {
					labelValues = depth + 1
					argIndex = 0
				}
			case labelValues >= 0 && depth == labelValues && argIndex > 0:
				// label_values' label argument.
			default:
				seen[word] = true
			}
			i = j
		case c >= '0' && c <= '9' || c == '.':
			// Numbers and durations (5m, 1e3, 0x1f).
			for i < len(expr) && (isWordByte(expr[i]) || expr[i] == '.') {
				i++
			}
		default:
			i++
		}
	}
	out := make([]string, 0, len(seen))
	for m := range seen {
		out = append(out, m)
	}
	sort.Strings(out)
	return out, nil
}

func skipString(s string, i int) (int, error) {
	q := s[i]
	for j := i + 1; j < len(s); j++ {
		if s[j] == '\\' && q != '`' {
			j++
			continue
		}
		if s[j] == q {
			return j + 1, nil
		}
	}
	return 0, fmt.Errorf("deploycheck: unterminated string in %q", s)
}

func isWordStart(c byte) bool {
	return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

func isWordByte(c byte) bool {
	return isWordStart(c) || c >= '0' && c <= '9'
}
