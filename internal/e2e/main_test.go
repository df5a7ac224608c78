package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"testing"

	"github.com/hashicorp/go-hclog"
	"go.uber.org/goleak"

	"github.com/quotacoord/quota/internal/regional"
)

func TestMain(m *testing.M) {
	if cfg, ok := os.LookupEnv(childNodeEnv); ok {
		os.Exit(runChildNode(cfg))
	}
	goleak.VerifyTestMain(m,
		// grpc-go's and otel's process-wide helpers, started on first use.
		goleak.IgnoreTopFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
	)
}

// childNodeEnv carries a child node's configuration (regional.DaemonConfig
// as JSON, without its logger) to the test binary started as that node.
const childNodeEnv = "E2E_CHILD_NODE"

// startChildNode starts the test binary as a regional node with cfg: a
// process of its own that a test can pause (SIGSTOP) or kill. Its log
// and announcements go to out. The child dies with this process.
func startChildNode(cfg regional.DaemonConfig, out io.Writer) (*exec.Cmd, error) {
	cfg.Logger, cfg.Announce, cfg.Clock = nil, nil, nil
	js, err := json.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("encode the child node's config: %w", err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childNodeEnv+"="+string(js))
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the child node: %w", err)
	}
	return cmd, nil
}

// runChildNode runs regional.Run with the configuration cfg (JSON) until
// SIGTERM, logging to stdout, and returns the process's exit code.
func runChildNode(cfg string) int {
	var c regional.DaemonConfig
	if err := json.Unmarshal([]byte(cfg), &c); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", childNodeEnv, err)
		return 2
	}
	c.Logger = hclog.New(&hclog.LoggerOptions{Name: "regional", Output: os.Stdout})
	c.Announce = os.Stdout
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if err := regional.Run(ctx, c); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}
