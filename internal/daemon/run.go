package daemon

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/hashicorp/go-hclog"
)

// Logger is the daemon's logger named name, writing to w (stderr) at l's
// level, as text or as JSON lines.
func (l LogFlags) Logger(name string, w io.Writer) (hclog.Logger, error) {
	level, err := ParseLevel(l.Level)
	if err != nil {
		return nil, err
	}
	return hclog.New(&hclog.LoggerOptions{Name: name, Output: w, Level: level, JSONFormat: l.JSON}), nil
}

// RunFunc is a daemon's run function: it parses args and env (Parse),
// writes its usage and logs to stderr, and serves until ctx ends.
type RunFunc func(ctx context.Context, args, env []string, stderr io.Writer) error

// Exit statuses of Exec.
const (
	ExitOK    = 0 // stopped cleanly, or -h
	ExitError = 1 // failed to start or to serve
	ExitUsage = 2 // a bad flag or QUOTA_* variable
)

// Exec runs run and returns the process's exit status: ExitOK when it
// returned nil or after -h printed the usage, ExitUsage for a *UsageError,
// ExitError for any other error. Errors are written to stderr as
// "name: error" (once, when the error already starts with the name).
func Exec(ctx context.Context, name string, run RunFunc, args, env []string, stderr io.Writer) int {
	err := run(ctx, args, env, stderr)
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return ExitOK
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, name+": ") {
		msg = name + ": " + msg
	}
	fmt.Fprintln(stderr, msg)
	if errors.As(err, new(*UsageError)) {
		return ExitUsage
	}
	return ExitError
}

// Main is a daemon's main function: Exec with the process's arguments,
// environment and stderr, under a context that SIGINT or SIGTERM cancels
// (a graceful stop), then os.Exit with the status.
func Main(name string, run RunFunc) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := Exec(ctx, name, run, os.Args[1:], os.Environ(), os.Stderr)
	stop()
	os.Exit(code)
}
