package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/quotacoord/quota/internal/loadgen"
)

func TestRunJSONAgainstNoop(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- loadgen.ServeNoop(ctx, l) }()
	defer func() { cancel(); <-done }()

	var out, errb bytes.Buffer
	if err := run(context.Background(), []string{"-addr", l.Addr().String(), "-c", "2", "-n", "50", "-json"}, &out, &errb, nil); err != nil {
		t.Fatalf("%v (%s)", err, errb.String())
	}
	var res loadgen.Result
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("%v: %q", err, out.String())
	}
	if res.Requests != 50 || res.OK != 50 {
		t.Fatalf("result %+v", res)
	}
	out.Reset()
	if err := run(context.Background(), []string{"-addr", l.Addr().String(), "-c", "1", "-duration", "50ms"}, &out, &errb, nil); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "decisions/s") {
		t.Fatalf("text output %q", out.String())
	}
	// -rlqs against a service without RLQS: no usage report gets through.
	err = run(context.Background(), []string{"-rlqs", "-addr", l.Addr().String(), "-streams", "2", "-warmup", "200ms", "-duration", "300ms", "-report-interval", "50ms"}, &out, &errb, nil)
	if err == nil || !strings.Contains(err.Error(), "no usage report reached") {
		t.Fatalf("-rlqs against the no-work service: %v", err)
	}
}

func TestRunBadFlags(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"-c", "0", "-n", "1"}, "at least 1"},
		{[]string{"-zipf", "-2", "-n", "1"}, "zipf"},
		{[]string{"extra"}, "unexpected arguments"},
		{[]string{"-hits", "99999999999"}, "32 bits"},
		{[]string{"-nope"}, "not defined"},
		{[]string{"-rlqs", "-streams", "-3"}, "streams"},
		{[]string{"-rlqs", "-n", "10"}, "-n does not apply"},
		{[]string{"-rlqs", "-node-pid", "-1"}, "-node-pid"},
		{[]string{"-rlqs", "-node-pid", "999999999"}, "-node-pid 999999999"},
		{[]string{"-rlqs", "-rate", "-1"}, "rate"},
	}
	for _, tt := range tests {
		var out, errb bytes.Buffer
		err := run(context.Background(), tt.args, &out, &errb, nil)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: err = %v, want one about %q", tt.args, err, tt.want)
		}
	}
}

func TestServeNoopFlag(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	var out, errb bytes.Buffer
	tuned := 0
	if err := run(ctx, []string{"-serve-noop", "127.0.0.1:0"}, &out, &errb, func(io.Writer) { tuned++ }); err != nil {
		t.Fatal(err)
	}
	if tuned != 1 {
		t.Fatalf("the no-work server took the node's runtime settings %d times, want 1", tuned)
	}
	if !strings.Contains(out.String(), "no-work rate limit service on 127.0.0.1:") {
		t.Fatalf("output %q", out.String())
	}
}

func TestNoopRedisNeedsServeNoop(t *testing.T) {
	var out, errb bytes.Buffer
	err := run(context.Background(), []string{"-noop-redis", "127.0.0.1:6379"}, &out, &errb, nil)
	if err == nil || !strings.Contains(err.Error(), "-noop-redis needs -serve-noop") {
		t.Fatalf("err = %v", err)
	}
}
