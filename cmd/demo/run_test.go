package main

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/quotacoord/quota/internal/logbuf"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
		goleak.IgnoreTopFunction("github.com/golang/glog.(*fileSink).flushDaemon"),
		goleak.IgnoreAnyFunction("go.etcd.io/etcd/pkg/v3/logutil.(*MergeLogger).outputLoop"),
		goleak.IgnoreAnyFunction("gopkg.in/natefinch/lumberjack%2ev2.(*Logger).millRun"),
	)
}

func TestBadArgs(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"extra"}, "unexpected arguments"},
		{[]string{"-duration", "1s"}, "duration 1s"},
		{[]string{"-scenario", "steady"}, "-scenario needs -agree"},
		{[]string{"-agree", "-scenario", "steady"}, "limited to 1m0s"},
		{[]string{"-agree", "-scenario", "/no/such/file.json"}, "neither built in"},
		{[]string{"-nope"}, "flag provided but not defined"},
		{[]string{"-agree", "-smoothing", "0"}, "-smoothing 0"},
	}
	for _, c := range cases {
		var out, errOut bytes.Buffer
		err := run(context.Background(), c.args, &out, &errOut)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want one containing %q", c.args, err, c.want)
		}
	}
}

// TestInterrupt: Ctrl-C during the story stops everything, says so and
// exits cleanly (goleak checks the goroutines; no redis-server the demo
// started may outlive it).
func TestInterrupt(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var out, errOut logbuf.Buffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"-duration", "60s", "-plain"}, &out, &errOut) }()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(out.String(), "t=  1.0s") {
		if time.Now().After(deadline) {
			cancel()
			<-done
			t.Fatalf("the story did not start:\n%s", out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run after Ctrl-C: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("run did not return after Ctrl-C")
	}
	if !strings.Contains(out.String(), "interrupted: everything the demo started is stopped") {
		t.Errorf("output lacks the interruption line:\n%s", out.String())
	}
	// The redis-servers the demo started are gone.
	for _, line := range strings.Split(out.String(), "\n") {
		if !strings.HasPrefix(line, "store: a real redis-server per region:") {
			continue
		}
		for _, f := range strings.Fields(line) {
			if i := strings.Index(f, "(pid "); i >= 0 {
				pid := strings.TrimSuffix(f[i+5:], ")")
				if err := exec.Command("kill", "-0", pid).Run(); err == nil {
					t.Errorf("redis-server pid %s still runs", pid)
				}
			}
		}
	}
}
