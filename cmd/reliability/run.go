package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/quotacoord/quota/internal/reliability"
)

// errFailed is returned when the table's verdict is FAIL.
var errFailed = errors.New("verdict FAIL")

func run(_ context.Context, args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: reliability fuzz|table [flags]")
	}
	fs := flag.NewFlagSet("reliability "+args[0], flag.ContinueOnError)
	fs.SetOutput(stdout)
	report := fs.String("report", "", "report file (JSON lines)")
	name := fs.String("name", "", "fuzz: target name")
	logPath := fs.String("log", "", "fuzz: output of go test -fuzz")
	exit := fs.Int("exit", 0, "fuzz: exit status of go test -fuzz")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if *report == "" {
		return errors.New("-report is required")
	}
	switch args[0] {
	case "fuzz":
		if *name == "" || *logPath == "" {
			return errors.New("fuzz needs -name and -log")
		}
		out, err := os.ReadFile(*logPath)
		if err != nil {
			return fmt.Errorf("read fuzz log: %w", err)
		}
		execs, err := reliability.FuzzExecs(string(out))
		e := reliability.Entry{Kind: reliability.KindFuzz, Name: *name, Injected: err == nil, Survived: err == nil && *exit == 0, FuzzExecs: execs}
		if err != nil {
			e.Note = err.Error()
		} else if *exit != 0 {
			e.Note = fmt.Sprintf("go test -fuzz exited %d: a failing input was written to testdata/fuzz", *exit)
		}
		return reliability.NewRecorder(*report).Record(e)
	case "table":
		f, err := os.Open(*report)
		if err != nil {
			return fmt.Errorf("open report: %w", err)
		}
		defer f.Close()
		entries, err := reliability.ReadEntries(f)
		if err != nil {
			return err
		}
		s := reliability.Summarize(entries)
		if err := s.WriteTable(stdout); err != nil {
			return err
		}
		if !s.OK() {
			return errFailed
		}
		return nil
	}
	return fmt.Errorf("unknown command %q, want fuzz or table", args[0])
}
