package demo

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("demo: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// RedisServer finds redis-server: on PATH, or installed by
// scripts/deps.sh under root when running as root. It returns "" when
// neither works; log receives what was tried.
func RedisServer(moduleRoot string, log func(string)) string {
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p
	}
	deps := filepath.Join(moduleRoot, "scripts", "deps.sh")
	if os.Geteuid() != 0 {
		log("redis-server is not installed and this is not root: using the embedded store")
		return ""
	}
	if _, err := os.Stat(deps); err != nil {
		log("redis-server is not installed and scripts/deps.sh is not here: using the embedded store")
		return ""
	}
	log("redis-server is not installed: installing it with scripts/deps.sh")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, deps).CombinedOutput(); err != nil {
		log(fmt.Sprintf("scripts/deps.sh failed (%v): %s; using the embedded store", err, out))
		return ""
	}
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p
	}
	return ""
}

// Redis is a redis-server process started by StartRedis.
type Redis struct {
	Addr string
	cmd  *exec.Cmd
	done chan struct{}
}

// StartRedis starts bin on a free loopback port with no persistence,
// working in dir, and waits until it answers PING.
func StartRedis(ctx context.Context, bin, dir string) (*Redis, error) {
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "--bind", "127.0.0.1", "--port", strconv.Itoa(port), "--save", "",
		"--appendonly", "no", "--dir", dir, "--logfile", filepath.Join(dir, "redis.log"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("demo: start redis-server: %w", err)
	}
	r := &Redis{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(r.done) }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if err := ping(r.Addr); err == nil {
			return r, nil
		} else if time.Now().After(deadline) || ctx.Err() != nil {
			r.Stop()
			return nil, fmt.Errorf("demo: redis-server on %s did not answer: %w", r.Addr, errors.Join(err, ctx.Err()))
		}
		select {
		case <-r.done:
			return nil, fmt.Errorf("demo: redis-server on %s exited at start (see %s)", r.Addr, filepath.Join(dir, "redis.log"))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// PID is the server's process id.
func (r *Redis) PID() int { return r.cmd.Process.Pid }

// Stop ends the process by its PID (SIGTERM, then SIGKILL after 3 s) and
// waits for it.
func (r *Redis) Stop() {
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
	case <-time.After(3 * time.Second):
		_ = r.cmd.Process.Kill()
		<-r.done
	}
}

// ping speaks just enough RESP to ask PING (only bucket speaks Redis
// through a client library).
func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "+PONG\r\n" {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}
