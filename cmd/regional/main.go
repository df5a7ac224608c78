// Command regional runs one regional admission node; see
// internal/regional for what it serves and `regional -h` for its flags.
// Settings, logging and shutdown follow internal/daemon, as for
// cmd/coordinator: QUOTA_<FLAG> environment variables set flag defaults (a
// flag wins), logs go to stderr (-log-level, -json-logs), SIGINT or SIGTERM
// stop it gracefully within -shutdown-timeout.
//
// At start the node re-executes itself once (same PID and arguments) with
// GODEBUG's schedtrace set, which keeps the Go runtime's monitor thread
// from parking and being woken again by every check that finds the node
// idle (daemon.StayAwake); GODEBUG=schedtrace=0 keeps the runtime's
// default. GOGC defaults to regional.GCPercent.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"time"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/daemon"
	"github.com/quotacoord/quota/internal/regional"
)

func main() {
	if err := daemon.StayAwake(); err != nil {
		fmt.Fprintln(os.Stderr, "regional:", err)
	}
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(regional.GCPercent)
	}
	daemon.Main("regional", run)
}

// run parses args and env into a regional.DaemonConfig and runs the node
// until ctx ends, logging to stderr. It returns flag.ErrHelp after -h, a
// *daemon.UsageError for a bad flag or variable, and otherwise what
// regional.Run returns.
func run(ctx context.Context, args, env []string, stderr io.Writer) error {
	c, err := parse(args, env, stderr)
	if err != nil {
		return err
	}
	return regional.Run(ctx, c)
}

// parse reads the node's flags from args, their defaults from the QUOTA_*
// variables of env (daemon.Parse); the logger and the listening lines
// write to stderr. regional.Run validates the result.
func parse(args, env []string, stderr io.Writer) (regional.DaemonConfig, error) {
	var (
		c                      regional.DaemonConfig
		etcd, envoyPlainKeys   string
		sentinels              string
		unknownPolicy, headers string
		logs                   daemon.LogFlags
	)
	fs := flag.NewFlagSet("regional", flag.ContinueOnError)
	fs.SetOutput(stderr)
	regional.RLQSFlags(fs, &c.RLQS)
	fs.StringVar(&c.Region, "region", "local", "this node's region, [A-Za-z0-9_-]")
	fs.StringVar(&c.NodeID, "node-id", "", "this node's id within its region, [A-Za-z0-9_.-]{1,64}: each node of a region registers, reports demand and acknowledges under its own etcd keys; default the hostname plus a random suffix")
	fs.StringVar(&c.GRPCAddr, "grpc-addr", ":8081", "gRPC listen address (own Admission API, Envoy RLS, health)")
	fs.BoolVar(&c.GRPCReflection, "grpc-reflection", false, "serve gRPC reflection on -grpc-addr (lists every service to anyone who reaches it)")
	fs.StringVar(&c.HTTPAddr, "http-addr", regional.DefaultHTTPAddr, "HTTP listen address (/metrics, /healthz, /readyz); loopback unless given, e.g. :8080")
	fs.StringVar(&c.Redis, "redis", "", "Redis: host:port, a redis:// or rediss:// URL, or comma-separated cluster addresses; empty = in-process store")
	fs.StringVar(&etcd, "etcd", "", "comma-separated etcd endpoints; empty = standalone (share 1, policies from -policies)")
	fs.StringVar(&c.Policies, "policies", "", "policy file or directory (own YAML or Envoy rate limit service config), reloaded on change")
	fs.DurationVar(&c.StoreTimeout, "store-timeout", 5*time.Millisecond, "time budget of one Redis call before the policy's failure mode decides")
	fs.BoolVar(&c.LossGuard, "loss-guard", false, "detect a store that lost its state (Redis restarted without persistence, flushed, failed over to an empty replica; without -redis, this process's start) and start the buckets it finds absent spent, for one refill time; a new Redis starts so too")
	fs.IntVar(&c.RedisMerge, "redis-merge", 0, fmt.Sprintf("most concurrent single-bucket checks merged into one Redis script call (within one hash slot on a cluster); 0 = %d, 1 = no merging, at most %d", bucket.DefaultMerge, regional.MaxRedisMerge))
	fs.IntVar(&c.BreakerThreshold, "breaker-threshold", 5, "consecutive Redis failures that open the circuit breaker")
	fs.DurationVar(&c.BreakerCooldown, "breaker-cooldown", time.Second, "how long the open breaker keeps Redis out before a probe")
	fs.StringVar(&c.OTLPEndpoint, "otlp-endpoint", "", "OTLP gRPC endpoint (host:port) for traces, over TLS; empty = tracing off")
	fs.BoolVar(&c.OTLPInsecure, "otlp-insecure", false, "send traces to -otlp-endpoint in plaintext")
	fs.StringVar(&c.TLSCert, "tls-cert", "", "PEM certificate for the gRPC server (with -tls-key)")
	fs.StringVar(&c.TLSKey, "tls-key", "", "PEM private key for the gRPC server")
	fs.StringVar(&c.TLSClientCA, "tls-client-ca", "", "PEM CA bundle: require and verify client certificates")
	fs.StringVar(&c.RedisUsername, "redis-username", "", "Redis ACL user (with -redis-password-file or QUOTA_REDIS_PASSWORD); empty = the default user")
	fs.StringVar(&c.RedisPasswordFile, "redis-password-file", "", "file holding the Redis password (one line); or set QUOTA_REDIS_PASSWORD, never a flag")
	fs.StringVar(&sentinels, "redis-sentinel", "", "comma-separated Redis Sentinel addresses (host:port) in place of -redis: the node follows the primary they name for -redis-sentinel-master")
	fs.StringVar(&c.RedisSentinelMaster, "redis-sentinel-master", "", "name of the primary the -redis-sentinel Sentinels monitor")
	fs.StringVar(&c.RedisSentinelUsername, "redis-sentinel-username", "", "Sentinel ACL user (with -redis-sentinel-password-file or QUOTA_REDIS_SENTINEL_PASSWORD); -redis-username and its password are the data nodes'")
	fs.StringVar(&c.RedisSentinelPasswordFile, "redis-sentinel-password-file", "", "file holding the Sentinels' password (one line); or set QUOTA_REDIS_SENTINEL_PASSWORD, never a flag")
	fs.StringVar(&c.RedisTLS.CAFile, "redis-tls-ca", "", "PEM CA bundle: connect to Redis over TLS and verify its certificate (reloaded on change)")
	fs.StringVar(&c.RedisTLS.CertFile, "redis-tls-cert", "", "PEM client certificate for Redis (with -redis-tls-key; mutual TLS)")
	fs.StringVar(&c.RedisTLS.KeyFile, "redis-tls-key", "", "PEM private key of -redis-tls-cert")
	fs.StringVar(&c.RedisTLS.ServerName, "redis-tls-server-name", "", "name Redis's certificate must carry; default the host of -redis (needed for cluster seeds given as IP addresses)")
	fs.StringVar(&c.EtcdTLS.CAFile, "etcd-tls-ca", "", "PEM CA bundle: connect to etcd over TLS (https) and verify its certificates (reloaded on change)")
	fs.StringVar(&c.EtcdTLS.CertFile, "etcd-tls-cert", "", "PEM client certificate for etcd (with -etcd-tls-key; mutual TLS, reloaded on change)")
	fs.StringVar(&c.EtcdTLS.KeyFile, "etcd-tls-key", "", "PEM private key of -etcd-tls-cert")
	fs.StringVar(&c.EtcdAuth.Username, "etcd-username", "", "etcd user to authenticate as (with -etcd-password-file or QUOTA_ETCD_PASSWORD); empty = none, or the -etcd-tls-cert common name")
	fs.StringVar(&c.EtcdAuth.PasswordFile, "etcd-password-file", "", "file holding the etcd password (one line); or set QUOTA_ETCD_PASSWORD, never a flag")
	fs.StringVar(&c.EtcdTLS.ServerName, "etcd-tls-server-name", "", "name every etcd certificate must carry; default each endpoint's host")
	fs.StringVar(&unknownPolicy, "unknown-policy", "error", "checks naming an unknown policy: error (NotFound), deny or allow")
	fs.StringVar(&headers, "rls-headers", "off", "Envoy API response headers: off or draft (RateLimit-Limit/-Remaining/-Reset)")
	fs.StringVar(&c.SubjectSalt, "subject-salt", "", "secret HMAC key of hashed subjects, the same in every region; empty = the deployment's salt in etcd (with -etcd, created once), else a random salt of this process (warned)")
	fs.StringVar(&envoyPlainKeys, "envoy-plain-keys", "", "comma-separated Envoy descriptor keys whose values are not secret and stay readable in Redis keys (e.g. tenant,path); every other value is hashed")
	fs.IntVar(&c.DecisionLogEvery, "decision-log-every", 0, "log one decision in N (subject hashed); 0 = off")
	fs.IntVar(&c.LocalMaxBuckets, "local-max-buckets", 100000, "bound on buckets of the in-process store")
	fs.DurationVar(&c.ReportInterval, "report-interval", 5*time.Second, "demand report interval (with -etcd)")
	fs.DurationVar(&c.Drain, "drain", 5*time.Second, "on SIGTERM, how long to keep serving with readiness off (/readyz 503, gRPC health NOT_SERVING) before the graceful stop, so that proxies move away first")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", daemon.DefaultShutdownTimeout, "how long a graceful shutdown may take")
	fs.DurationVar(&c.ReloadSettle, "reload-settle", 200*time.Millisecond, "quiet time after a policy file change before reloading")
	// Callers of the admission listener: who may refund, override and peek.
	fs.StringVar(&c.GrantsFile, "grants", "", "YAML or JSON file granting check, peek, refund and override per caller and policy (see internal/grants); empty = every caller may check, nothing else")
	fs.IntVar(&c.CallerMaxInflight, "caller-max-inflight", regional.DefaultCallerMaxInflight, "most bucket operations one caller (identity and IP address) may have in flight on this node; beyond it a request is refused at once; negative = no bound")
	fs.StringVar(&c.TokensFile, "auth-tokens", "", "file of bearer tokens identifying callers, NAME TOKEN per line (identity token:NAME in -grants); empty = no tokens")
	// Identity floods (see regional.Config.MaxLiveSubjects).
	fs.IntVar(&c.MaxLiveSubjects, "max-live-subjects", 100000, "per policy, subjects this node lets hold a bucket of their own; newer ones share the policy's overflow bucket")
	fs.IntVar(&c.IPv6SubjectPrefix, "ipv6-subject-prefix", 64, "prefix length IPv6 subjects are aggregated to (ip policies, Envoy remote_address), 1 to 128")
	logs.Register(fs)
	if err := daemon.Parse(fs, args, env); err != nil {
		return c, err
	}
	switch {
	case sentinels != "" && c.Redis != "":
		return c, &daemon.UsageError{Err: errors.New("-redis and -redis-sentinel both name the Redis")}
	case (sentinels == "") != (c.RedisSentinelMaster == ""):
		return c, &daemon.UsageError{Err: errors.New("-redis-sentinel and -redis-sentinel-master go together")}
	case sentinels != "":
		c.Redis = sentinels
	}
	c.RedisPassword = daemon.Secret(env, "redis-password")
	c.RedisSentinelPassword = daemon.Secret(env, "redis-sentinel-password")
	c.EtcdAuth.Password = daemon.Secret(env, "etcd-password")
	c.EtcdEndpoints = daemon.SplitList(etcd)
	c.EnvoyPlainKeys = daemon.SplitList(envoyPlainKeys)
	c.UnknownPolicy, c.Headers = regional.UnknownPolicy(unknownPolicy), regional.HeaderMode(headers)
	var err error
	if c.Logger, err = logs.Logger("regional", stderr); err != nil {
		return c, err
	}
	c.Announce = stderr
	return c, nil
}
