package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quotacoord/quota/internal/daemon"
	"github.com/quotacoord/quota/internal/logbuf"
	"github.com/quotacoord/quota/internal/regional"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

// runMainEnv set to 1 makes the test binary run the command's main
// instead of the tests (TestSIGTERMDrains starts it so).
const runMainEnv = "REGIONAL_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		return
	}
	goleak.VerifyTestMain(m)
}

// TestUsage runs the node as main does: -h prints the usage and exits 0,
// a bad flag or QUOTA_* variable exits 2 with a message naming it.
func TestUsage(t *testing.T) {
	var out bytes.Buffer
	if code := daemon.Exec(t.Context(), "regional", run, []string{"-h"}, nil, &out); code != daemon.ExitOK ||
		!strings.Contains(out.String(), "Usage of regional") || !strings.Contains(out.String(), "-log-level") {
		t.Fatalf("-h: exit %d, output:\n%s", code, out.String())
	}
	for _, c := range []struct {
		args, env []string
		names     string
	}{
		{[]string{"-no-such-flag"}, nil, "-no-such-flag"},
		{[]string{"-store-timeout", "soon"}, nil, "-store-timeout"},
		{[]string{"-policies", "x", "-log-level", "loud"}, nil, "-log-level"},
		{[]string{"-policies", "x"}, []string{"QUOTA_BREAKER_THRESHOLD=many"}, "QUOTA_BREAKER_THRESHOLD"},
	} {
		out.Reset()
		code := daemon.Exec(t.Context(), "regional", run, c.args, c.env, &out)
		if code != daemon.ExitUsage || !strings.Contains(out.String(), "regional: ") || !strings.Contains(out.String(), c.names) {
			t.Errorf("%v %v: exit %d, output:\n%s", c.args, c.env, code, out.String())
		}
	}
}

// TestServeAndStop starts a standalone node as main does, with its
// listening addresses from QUOTA_* variables, reads the listening lines
// and logs on the one stream, and stops it by cancelling (SIGTERM): exit 0.
func TestServeAndStop(t *testing.T) {
	var out logbuf.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- daemon.Exec(ctx, "regional", run, []string{"-policies", "../../examples/policies", "-region", "eu-west"},
			[]string{"QUOTA_GRPC_ADDR=127.0.0.1:0", "QUOTA_HTTP_ADDR=127.0.0.1:0", "QUOTA_JSON_LOGS=true", "QUOTA_DRAIN=0s"}, &out)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), "http listening on 127.0.0.1:") {
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("never listened:\n%s", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	select {
	case code := <-done:
		if code != daemon.ExitOK {
			t.Fatalf("exit %d:\n%s", code, out.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("node did not stop after cancel")
	}
	if logs := out.String(); !strings.Contains(logs, `"@message":"policies loaded"`) || !strings.Contains(logs, `"@message":"stopped"`) {
		t.Fatalf("JSON logs missing from the stream:\n%s", logs)
	}
}

// TestParse: the defaults are safe (HTTP on loopback, no reflection,
// traces over TLS); flags and QUOTA_* variables reach the DaemonConfig (a
// flag wins over its variable), lists are split, and the logger and the
// listening lines go to stderr.
func TestParse(t *testing.T) {
	var out bytes.Buffer
	d, err := parse(nil, nil, &out)
	if err != nil || d.HTTPAddr != "127.0.0.1:8080" || d.GRPCAddr != ":8081" || d.GRPCReflection || d.OTLPInsecure {
		t.Fatalf("defaults: %+v, %v", d, err)
	}
	d, err = parse([]string{"-http-addr", ":8080", "-grpc-reflection", "-otlp-endpoint", "otel:4317", "-otlp-insecure"}, nil, &out)
	if err != nil || d.HTTPAddr != ":8080" || !d.GRPCReflection || !d.OTLPInsecure || d.OTLPEndpoint != "otel:4317" {
		t.Fatalf("opened: %+v, %v", d, err)
	}
	c, err := parse([]string{"-etcd", "http://a:2379, http://b:2379", "-node-id", "eu-1.pod_7", "-redis-merge", "8", "-loss-guard",
		"-envoy-plain-keys", "tenant,path", "-unknown-policy", "deny", "-store-timeout", "20ms"},
		[]string{"QUOTA_REGION=eu-west", "QUOTA_NODE_ID=from-env", "QUOTA_RLS_HEADERS=draft", "QUOTA_REPORT_INTERVAL=2s"}, &out)
	if err != nil {
		t.Fatal(err)
	}
	if c.Region != "eu-west" || c.NodeID != "eu-1.pod_7" || c.RedisMerge != 8 || !c.LossGuard || c.UnknownPolicy != regional.UnknownDeny ||
		c.Headers != regional.HeadersDraft || c.StoreTimeout != 20*time.Millisecond || c.ReportInterval != 2*time.Second ||
		!slices.Equal(c.EtcdEndpoints, []string{"http://a:2379", "http://b:2379"}) || !slices.Equal(c.EnvoyPlainKeys, []string{"tenant", "path"}) {
		t.Fatalf("parsed %+v", c)
	}
	if c.Announce != &out || c.Logger == nil {
		t.Fatalf("logger %v and announce %v, want both on stderr", c.Logger, c.Announce)
	}
	if c, err := parse([]string{"-max-live-subjects", "7", "-ipv6-subject-prefix", "48"}, nil, &out); err != nil || c.MaxLiveSubjects != 7 || c.IPv6SubjectPrefix != 48 {
		t.Fatalf("identity-flood flags: MaxLiveSubjects %d, IPv6SubjectPrefix %d, %v; want 7, 48", c.MaxLiveSubjects, c.IPv6SubjectPrefix, err)
	}
	if c, err := parse(nil, []string{"QUOTA_NODE_ID=from-env"}, &out); err != nil || c.NodeID != "from-env" {
		t.Fatalf("QUOTA_NODE_ID: %q, %v", c.NodeID, err)
	}
	// Redis credentials: the user and the password file from flags or
	// variables, the password itself only from QUOTA_REDIS_PASSWORD.
	c, err = parse([]string{"-redis", "10.0.0.1:6379", "-redis-username", "limiter"},
		[]string{"QUOTA_REDIS_PASSWORD=s3cret", "QUOTA_REDIS_PASSWORD_FILE=/run/secrets/redis"}, &out)
	if err != nil || c.RedisUsername != "limiter" || c.RedisPassword != "s3cret" || c.RedisPasswordFile != "/run/secrets/redis" {
		t.Fatalf("redis credentials: %q %q %q, %v", c.RedisUsername, c.RedisPassword, c.RedisPasswordFile, err)
	}
	if _, err := parse([]string{"-redis-password", "s3cret"}, nil, io.Discard); err == nil {
		t.Fatal("-redis-password accepted: a password on the command line")
	}
	// Sentinels in place of -redis, their credentials beside the data
	// nodes', the password only from QUOTA_REDIS_SENTINEL_PASSWORD.
	c, err = parse([]string{"-redis-sentinel", "10.0.0.1:26379,10.0.0.2:26379", "-redis-sentinel-master", "quota", "-redis-sentinel-username", "watcher"},
		[]string{"QUOTA_REDIS_SENTINEL_PASSWORD=w-s3cret", "QUOTA_REDIS_PASSWORD=s3cret", "QUOTA_REDIS_SENTINEL_PASSWORD_FILE=/run/secrets/sentinel"}, &out)
	if err != nil || c.Redis != "10.0.0.1:26379,10.0.0.2:26379" || c.RedisSentinelMaster != "quota" || c.RedisSentinelUsername != "watcher" ||
		c.RedisSentinelPassword != "w-s3cret" || c.RedisSentinelPasswordFile != "/run/secrets/sentinel" || c.RedisPassword != "s3cret" {
		t.Fatalf("sentinel settings: %q %q %q %q %q, %v", c.Redis, c.RedisSentinelMaster, c.RedisSentinelUsername, c.RedisSentinelPassword, c.RedisSentinelPasswordFile, err)
	}
	for _, args := range [][]string{
		{"-redis", "10.0.0.1:6379", "-redis-sentinel", "10.0.0.1:26379", "-redis-sentinel-master", "quota"},
		{"-redis-sentinel", "10.0.0.1:26379"},
		{"-redis", "10.0.0.1:6379", "-redis-sentinel-master", "quota"},
		{"-redis-sentinel", "10.0.0.1:26379", "-redis-sentinel-master", "quota", "-redis-sentinel-password", "s3cret"},
	} {
		var ue *daemon.UsageError
		if _, err := parse(args, nil, io.Discard); !errors.As(err, &ue) {
			t.Errorf("%v: %v, want a usage error", args, err)
		}
	}
	// etcd credentials alike, the password only from QUOTA_ETCD_PASSWORD.
	c, err = parse([]string{"-etcd", "a:2379", "-etcd-username", "quota-region/eu"},
		[]string{"QUOTA_ETCD_PASSWORD=e-s3cret", "QUOTA_ETCD_PASSWORD_FILE=/run/secrets/etcd"}, &out)
	if err != nil || c.EtcdAuth.Username != "quota-region/eu" || c.EtcdAuth.Password != "e-s3cret" || c.EtcdAuth.PasswordFile != "/run/secrets/etcd" {
		t.Fatalf("etcd credentials: %+v, %v", c.EtcdAuth, err)
	}
	if _, err := parse([]string{"-etcd-password", "s3cret"}, nil, io.Discard); err == nil {
		t.Fatal("-etcd-password accepted: a password on the command line")
	}
}

// TestSIGTERMDrains runs the command as a process and sends it SIGTERM:
// /readyz turns 503 at once while checks on new connections still
// succeed for -drain, and then the process exits 0, not before.
func TestSIGTERMDrains(t *testing.T) {
	const drain = 2 * time.Second
	cmd := exec.Command(os.Args[0], "-policies", "../../examples/policies", "-grpc-addr", "127.0.0.1:0", "-http-addr", "127.0.0.1:0",
		"-drain", drain.String())
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var out logbuf.Buffer
	cmd.Stderr = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	addrs := map[string]string{}
	listen := regexp.MustCompile(`(grpc|http) listening on (\S+)`)
	for deadline := time.Now().Add(10 * time.Second); len(addrs) < 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("never listened:\n%s", out.String())
		}
		for _, m := range listen.FindAllStringSubmatch(out.String(), -1) {
			addrs[m[1]] = m[2]
		}
	}
	readyz := func() (int, string) {
		resp, err := http.Get("http://" + addrs["http"] + "/readyz")
		if err != nil {
			t.Fatalf("/readyz: %v\n%s", err, out.String())
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	check := func() error {
		conn, err := grpc.NewClient(addrs["grpc"], grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		r, err := quotav1.NewAdmissionClient(conn).Check(ctx, &quotav1.CheckRequest{Subject: "acme", Policies: []string{"exports"}})
		if err == nil && !r.Allowed {
			err = fmt.Errorf("denied: %v", r)
		}
		return err
	}
	if code, body := readyz(); code != http.StatusOK {
		t.Fatalf("/readyz before SIGTERM: %d %q", code, body)
	}
	// main re-executed itself with the runtime's monitor kept awake
	// (daemon.StayAwake), keeping its PID.
	env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("schedtrace=%d", daemon.AwakeSchedtrace); !strings.Contains(string(env), want) {
		t.Fatalf("the node runs without GODEBUG %s; its environment: %q", want, env)
	}
	start := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for {
		code, body := readyz()
		if code == http.StatusServiceUnavailable && body == "draining\n" {
			break
		}
		if time.Since(start) > drain/2 {
			t.Fatalf("/readyz still %d %q %v after SIGTERM", code, body, time.Since(start))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := check(); err != nil {
		t.Fatalf("check during the drain: %v", err)
	}
	if d := time.Since(start); d >= drain {
		t.Fatalf("the drain checks took %v, the whole drain: the test proves nothing", d)
	}
	select {
	case err := <-exited:
		exited <- err // for the cleanup
		if d := time.Since(start); err != nil || d < drain {
			t.Fatalf("exit %v after %v; want status 0 after the drain of %v\n%s", err, d, drain, out.String())
		}
	case <-time.After(drain + 15*time.Second):
		t.Fatalf("still running %v after SIGTERM\n%s", time.Since(start), out.String())
	}
}
