package daemon

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

func TestAwakeEnv(t *testing.T) {
	const set = "GODEBUG=schedtrace=2147483647"
	cases := []struct {
		env     []string
		want    []string
		changed bool
	}{
		{nil, []string{set}, true},
		{[]string{"A=1"}, []string{"A=1", set}, true},
		{[]string{"GODEBUG="}, []string{set}, true},
		{[]string{"A=1", "GODEBUG=gctrace=1", "B=2"}, []string{"A=1", "GODEBUG=gctrace=1,schedtrace=2147483647", "B=2"}, true},
		{[]string{"GODEBUG=schedtrace=0"}, []string{"GODEBUG=schedtrace=0"}, false},
		{[]string{"GODEBUG=gctrace=1, schedtrace=1000"}, []string{"GODEBUG=gctrace=1, schedtrace=1000"}, false},
		{[]string{"XGODEBUG=schedtrace=1"}, []string{"XGODEBUG=schedtrace=1", set}, true},
	}
	for _, c := range cases {
		in := slices.Clone(c.env)
		got, changed := AwakeEnv(c.env)
		if !slices.Equal(got, c.want) || changed != c.changed {
			t.Errorf("AwakeEnv(%q) = %q, %v; want %q, %v", c.env, got, changed, c.want, c.changed)
		}
		if !slices.Equal(c.env, in) {
			t.Errorf("AwakeEnv changed its argument: %q, was %q", c.env, in)
		}
	}
}

func TestStayAwakeReexecutes(t *testing.T) {
	for _, godebug := range []string{"", "gctrace=0"} {
		cmd := exec.Command(os.Args[0], "-test.run", "^$")
		cmd.Env = append(os.Environ(), "DAEMON_AWAKE_CHILD=1", "GODEBUG="+godebug)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("child: %v: %s", err, out)
		}
		want := "GODEBUG=schedtrace=2147483647 err=<nil>"
		if godebug != "" {
			want = "GODEBUG=" + godebug + ",schedtrace=2147483647 err=<nil>"
		}
		if got := strings.TrimSpace(string(out)); got != want {
			t.Errorf("with GODEBUG=%q the child printed %q, want %q", godebug, got, want)
		}
	}
}
