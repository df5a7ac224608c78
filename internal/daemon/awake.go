package daemon

import (
	"fmt"
	"os"
	"strings"
	"syscall"
)

// AwakeSchedtrace is the GODEBUG schedtrace period, in milliseconds, that
// AwakeEnv sets: the largest the runtime accepts (about 24.8 days).
const AwakeSchedtrace = 1<<31 - 1

// AwakeEnv returns env with GODEBUG's schedtrace set to AwakeSchedtrace,
// and whether it changed anything; an env whose GODEBUG already names
// schedtrace, with any value (schedtrace=0 keeps the runtime's default), is
// returned as it is.
//
// Why: when every P of a Go process is idle, the runtime's monitor thread
// (sysmon) parks in a deep sleep, and the next system call of any goroutine
// wakes it with a futex, after which it polls every 20 µs until it finds
// the process idle again. A node answering one caller at a time goes idle
// twice per check (waiting for the request, waiting for Redis), so it paid
// two such wake-ups per check, on the CPU it shares with Redis
// (docs/performance.md has the figures). With schedtrace set the monitor
// never parks: it backs off to one wake-up per 10 ms when there is nothing
// to do. The period makes the first trace line due only once
// CLOCK_MONOTONIC passes about 24.8 days (then one line to stderr per
// period).
func AwakeEnv(env []string) ([]string, bool) {
	set := fmt.Sprintf("schedtrace=%d", AwakeSchedtrace)
	for i, kv := range env {
		v, ok := strings.CutPrefix(kv, "GODEBUG=")
		if !ok {
			continue
		}
		for _, s := range strings.Split(v, ",") {
			if strings.HasPrefix(strings.TrimSpace(s), "schedtrace=") {
				return env, false
			}
		}
		out := append([]string(nil), env...)
		if v == "" {
			out[i] = "GODEBUG=" + set
		} else {
			out[i] = kv + "," + set
		}
		return out, true
	}
	return append(append([]string(nil), env...), "GODEBUG="+set), true
}

// StayAwake re-executes the running program with AwakeEnv's environment
// when that differs from its own, so that the Go runtime reads the setting
// at start (it reads GODEBUG's schedtrace only then). The process keeps its
// PID, arguments and open files; call it first in main, before anything
// starts. It returns only when there was nothing to do or the exec failed
// (the error says why; the program can run on without the setting).
func StayAwake() error {
	env, changed := AwakeEnv(os.Environ())
	if !changed {
		return nil
	}
	// /proc/self/exe is the running binary even after its path was
	// replaced (an upgrade in place); elsewhere the path it started from.
	exe := "/proc/self/exe"
	if _, err := os.Stat(exe); err != nil {
		if exe, err = os.Executable(); err != nil {
			return fmt.Errorf("daemon: find own executable to set GODEBUG: %w", err)
		}
	}
	if err := syscall.Exec(exe, os.Args, env); err != nil {
		return fmt.Errorf("daemon: re-execute %s to set GODEBUG: %w", exe, err)
	}
	return nil // not reached: Exec returns only on error
}
