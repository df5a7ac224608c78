package redistest

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// Server is a redis-server process started by this package.
type Server struct {
	Addr string
	dir  string
	args []string

	mu  sync.Mutex
	cmd *exec.Cmd
}

var (
	sharedOnce sync.Once
	sharedAddr string
	sharedErr  error
	uniq       atomic.Uint64
)

// Addr returns the address of the shared Redis.
func Addr(tb testing.TB) string {
	tb.Helper()
	if a := os.Getenv("REDIS_ADDR"); a != "" {
		return a
	}
	sharedOnce.Do(func() {
		dir, err := os.MkdirTemp("", "redistest-")
		if err != nil {
			sharedErr = err
			return
		}
		s := &Server{dir: dir}
		if err := s.start(); err != nil {
			sharedErr = err
			return
		}
		// The process dies with the test binary (Pdeathsig).
		sharedAddr = s.Addr
	})
	if sharedErr != nil {
		tb.Fatalf("redistest: start shared redis-server: %v", sharedErr)
	}
	return sharedAddr
}

// Client returns a client of the shared Redis, closed at the end of the
// test. Like the clients of the others here, it speaks RESP2 with
// maintenance notifications off, as bucket.DialRedis's do: a store on it
// takes the paths a node's store takes.
func Client(tb testing.TB) *redis.Client {
	tb.Helper()
	c := redis.NewClient(options(Addr(tb)))
	tb.Cleanup(func() { _ = c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		tb.Fatalf("redistest: ping %s: %v", c.Options().Addr, err)
	}
	return c
}

// options are the options of a client of addr.
func options(addr string) *redis.Options {
	return &redis.Options{Addr: addr, Protocol: 2,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}}
}

// Unique returns a string no other call in this process returns, for key
// parts that keep tests apart on a shared server.
func Unique(tb testing.TB) string {
	return fmt.Sprintf("t%d-%d", os.Getpid(), uniq.Add(1))
}

// Start runs a private redis-server for tb with extra configuration
// arguments (such as "--maxmemory", "1mb"); it is stopped at cleanup.
func Start(tb testing.TB, args ...string) *Server {
	tb.Helper()
	s := &Server{dir: tb.TempDir(), args: args}
	if err := s.start(); err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	tb.Cleanup(s.Stop)
	return s
}

// Client returns a client of s, closed at the end of the test.
func (s *Server) Client(tb testing.TB) *redis.Client {
	c := redis.NewClient(options(s.Addr))
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// Stop kills the server (SIGKILL: the script cache and unsaved data are lost).
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// Restart stops the server and starts it again on the same address.
func (s *Server) Restart() error {
	s.Stop()
	return s.start()
}

func (s *Server) start() error {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return fmt.Errorf("redis-server not installed (run `make test`, which installs it): %w", err)
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		addr := s.Addr
		if addr == "" {
			addr, err = freeAddr()
			if err != nil {
				return err
			}
		}
		host, port, _ := net.SplitHostPort(addr)
		args := append([]string{
			"--bind", host, "--port", port, "--save", "", "--appendonly", "no",
			"--dir", s.dir, "--protected-mode", "no", "--daemonize", "no",
			"--logfile", filepath.Join(s.dir, "redis-"+port+".log"),
		}, s.args...)
		cmd := exec.Command(bin, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("start redis-server: %w", err)
		}
		if err := waitReady(addr, 5*time.Second); err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			lastErr = fmt.Errorf("redis-server on %s: %w (log: %s)", addr, err, tail(filepath.Join(s.dir, "redis-"+port+".log")))
			if s.Addr != "" {
				time.Sleep(200 * time.Millisecond)
			}
			continue
		}
		s.mu.Lock()
		s.cmd = cmd
		s.Addr = addr
		s.mu.Unlock()
		return nil
	}
	return lastErr
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find free port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func waitReady(addr string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			_ = c.SetDeadline(time.Now().Add(time.Second))
			_, _ = c.Write([]byte("PING\r\n"))
			line, rerr := bufio.NewReader(c).ReadString('\n')
			c.Close()
			if rerr == nil && strings.HasPrefix(line, "+PONG") {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v", within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) > 400 {
		b = b[len(b)-400:]
	}
	return strconv.Quote(string(b))
}

var evalshaRE = regexp.MustCompile(`cmdstat_evalsha:calls=(\d+)`)

// ScriptCalls returns how many EVALSHA commands the server behind c has
// run (INFO commandstats), for tests that count script calls.
func ScriptCalls(tb testing.TB, c *redis.Client) int {
	tb.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		tb.Fatal(err)
	}
	m := evalshaRE.FindStringSubmatch(info)
	if m == nil {
		return 0
	}
	n, err := strconv.Atoi(m[1])
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

// RequireAuth makes the Redis server at addr require credentials: the
// default user gets the password defaultPW, and an ACL user named user
// (all keys, channels and commands) the password userPW. Clients without
// them are refused (NOAUTH); clients of Server.Client no longer work.
func RequireAuth(tb testing.TB, addr, user, userPW, defaultPW string) {
	tb.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Do(ctx, "ACL", "SETUSER", user, "on", ">"+userPW, "~*", "&*", "+@all").Err(); err != nil {
		tb.Fatalf("redistest: ACL SETUSER on %s: %v", addr, err)
	}
	if err := c.ConfigSet(ctx, "requirepass", defaultPW).Err(); err != nil {
		tb.Fatalf("redistest: CONFIG SET requirepass on %s: %v", addr, err)
	}
}

// Info returns one integer field of the server's INFO section (for
// example "memory", "used_memory"); a missing field fails tb.
func Info(tb testing.TB, c *redis.Client, section, field string) int64 {
	tb.Helper()
	s, err := c.Info(context.Background(), section).Result()
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(s, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				tb.Fatalf("INFO %s %s=%q: %v", section, field, v, err)
			}
			return n
		}
	}
	tb.Fatalf("INFO %s has no %s", section, field)
	return 0
}

// DBSize returns the keys of the server's current database.
func DBSize(tb testing.TB, c *redis.Client) int64 {
	tb.Helper()
	n, err := c.DBSize(context.Background()).Result()
	if err != nil {
		tb.Fatal(err)
	}
	return n
}
