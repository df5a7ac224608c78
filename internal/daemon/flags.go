package daemon

import (
	"errors"
	"flag"
	"fmt"
	"strings"

	"github.com/hashicorp/go-hclog"
)

// EnvPrefix starts the name of every environment variable that sets a
// flag's default.
const EnvPrefix = "QUOTA_"

// UsageError is a command line or an environment the daemon cannot start
// from: a bad flag, a bad QUOTA_* variable, a stray argument. Its message
// names the flag or variable.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }

func (e *UsageError) Unwrap() error { return e.Err }

func usage(format string, args ...any) error {
	return &UsageError{Err: fmt.Errorf(format, args...)}
}

// EnvName is the environment variable that sets the default of the flag
// named name: QUOTA_ and the name in upper case, dashes as underscores
// (-grpc-addr is QUOTA_GRPC_ADDR).
func EnvName(name string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// Parse sets the flags of fs from env (os.Environ()-style) and then from
// args, so a flag on the command line wins over its variable. Variables
// starting with QUOTA_ that name no flag are ignored (the other daemon's
// settings may share the environment). It refuses positional arguments.
// Errors are a *UsageError naming the flag or variable; -h and -help return
// flag.ErrHelp after fs printed its usage.
func Parse(fs *flag.FlagSet, args, env []string) error {
	vars := map[string]string{}
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, EnvPrefix) {
			vars[k] = v
		}
	}
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		k := EnvName(f.Name)
		if v, ok := vars[k]; ok && err == nil {
			if serr := f.Value.Set(v); serr != nil {
				err = usage("%s=%q (flag -%s): %w", k, v, f.Name, serr)
			}
		}
	})
	if err != nil {
		return err
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &UsageError{Err: err}
	}
	if fs.NArg() > 0 {
		return usage("unexpected arguments %q", fs.Args())
	}
	return nil
}

// Secret is the value of the variable QUOTA_<NAME> (EnvName) in env
// (os.Environ()-style), "" when unset. A secret such as the Redis password
// comes from the environment or from a file named by a flag, never from a
// flag of its own: every user of the host can read a command line (ps).
func Secret(env []string, name string) string {
	k := EnvName(name) + "="
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, k); ok {
			return v
		}
	}
	return ""
}

// SplitList splits a comma-separated flag value, trimming blanks around
// each element and dropping empty ones.
func SplitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// levelNames are the accepted -log-level values, least severe first.
const levelNames = "trace, debug, info, warn or error"

// ParseLevel parses a log level name: trace, debug, info, warn or error
// (any case).
func ParseLevel(s string) (hclog.Level, error) {
	switch l := hclog.LevelFromString(s); l {
	case hclog.Trace, hclog.Debug, hclog.Info, hclog.Warn, hclog.Error:
		return l, nil
	}
	return hclog.NoLevel, usage("-log-level %q, want %s", s, levelNames)
}

// LogFlags are the logging flags of every daemon.
type LogFlags struct {
	// Level is -log-level; default info.
	Level string
	// JSON is -json-logs: one JSON object per line.
	JSON bool
}

// Register adds -log-level and -json-logs to fs.
func (l *LogFlags) Register(fs *flag.FlagSet) {
	fs.StringVar(&l.Level, "log-level", "info", levelNames)
	fs.BoolVar(&l.JSON, "json-logs", false, "log JSON lines")
}
