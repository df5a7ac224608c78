package demo

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// IsTerminal reports whether w is a character device (a terminal), where
// the live view redraws a table in place.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// View prints the live state once per call: a table redrawn in place on a
// terminal, one plain line otherwise. It is not safe for concurrent use.
type View struct {
	Out      io.Writer
	Terminal bool
	Story    *Story
	lines    int

	mu   sync.Mutex
	note string
}

// SetNote sets a line shown with every later update (what just happened
// and what to expect); "" removes it. It is safe to call while another
// goroutine calls Show.
func (v *View) SetNote(note string) {
	v.mu.Lock()
	v.note = note
	v.mu.Unlock()
}

// Show prints the state over the last second before now (offset from the
// start of the story).
func (v *View) Show(now time.Duration, w Window) {
	_, phase := v.Story.At(now)
	var gOff, gAdm, gShare float64
	for i := range w.Offered {
		gOff += w.Offered[i]
		gAdm += w.Admitted[i]
		gShare += w.Share[i]
	}
	budget := v.Story.RefillPerSecond
	v.mu.Lock()
	note := v.note
	v.mu.Unlock()
	if !v.Terminal {
		var b strings.Builder
		fmt.Fprintf(&b, "t=%5.1fs %-30s", now.Seconds(), phase.Name)
		for i, r := range v.Story.Regions {
			fmt.Fprintf(&b, " | %s share %.2f off %4.0f adm %4.0f", r, w.Share[i], w.Offered[i], w.Admitted[i])
		}
		fmt.Fprintf(&b, " | global adm %4.0f/s of budget %.0f/s", gAdm, budget)
		if note != "" {
			fmt.Fprintf(&b, " | %s", note)
		}
		b.WriteString("\n")
		io.WriteString(v.Out, b.String())
		return
	}
	var b strings.Builder
	if v.lines > 0 {
		fmt.Fprintf(&b, "\x1b[%dA\x1b[J", v.lines)
	}
	fmt.Fprintf(&b, "t=%5.1fs / %v   phase: %s\n", now.Seconds(), v.Story.Length(), phase.Name)
	fmt.Fprintf(&b, "%-10s %7s %12s %12s  %s\n", "region", "share", "offered/s", "admitted/s", "")
	for i, r := range v.Story.Regions {
		fmt.Fprintf(&b, "%-10s %7.3f %12.1f %12.1f  %s\n", r, w.Share[i], w.Offered[i], w.Admitted[i], bar(w.Admitted[i], budget, 30))
	}
	fmt.Fprintf(&b, "%-10s %7.3f %12.1f %12.1f  %s\n", "global", gShare, gOff, gAdm, bar(gAdm, budget, 30))
	fmt.Fprintf(&b, "%-10s %7s %12s %12.1f  %s| budget\n", "budget", "1", "", budget, strings.Repeat(" ", 30))
	v.lines = 4 + len(v.Story.Regions)
	if note != "" {
		fmt.Fprintf(&b, "%s\n", note)
		v.lines++
	}
	io.WriteString(v.Out, b.String())
}

// bar draws x against full as a bar of width cells, marking overshoot.
func bar(x, full float64, width int) string {
	if full <= 0 {
		return ""
	}
	n := int(x / full * float64(width))
	if n < 0 {
		n = 0
	}
	over := n > width
	if n > width+10 {
		n = width + 10
	}
	s := strings.Repeat("#", min(n, width))
	if over {
		s += "|" + strings.Repeat("!", n-width)
	}
	return s
}
