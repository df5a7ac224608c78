package regional

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/daemon"
)

// Main runs a regional node from command-line arguments, as cmd/regional
// does: args without the program name, env os.Environ()-style (QUOTA_*
// variables set flag defaults, see internal/daemon). The usage, the logs
// and the listening lines go to stderr. It returns flag.ErrHelp after -h,
// a *daemon.UsageError for a bad flag or variable, and otherwise what Run
// returns.
func Main(ctx context.Context, args, env []string, stderr io.Writer) error {
	c, err := parseFlags(args, env, stderr)
	if err != nil {
		return err
	}
	return Run(ctx, c)
}

// parseFlags reads a DaemonConfig from args, the flags' defaults from the
// QUOTA_* variables of env (daemon.Parse); the logger and the listening
// lines write to stderr. Run checks the result.
func parseFlags(args, env []string, stderr io.Writer) (DaemonConfig, error) {
	var (
		c                      DaemonConfig
		etcd, envoyPlainKeys   string
		unknownPolicy, headers string
		logs                   daemon.LogFlags
	)
	fs := flag.NewFlagSet("regional", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.Region, "region", "local", "this node's region, [A-Za-z0-9_-]")
	fs.StringVar(&c.NodeID, "node-id", "", "this node's id within its region, [A-Za-z0-9_.-]{1,64}: each node of a region registers, reports demand and acknowledges under its own etcd keys; default the hostname plus a random suffix")
	fs.StringVar(&c.GRPCAddr, "grpc-addr", ":8081", "gRPC listen address (own Admission API, Envoy RLS, health, reflection)")
	fs.StringVar(&c.HTTPAddr, "http-addr", ":8080", "HTTP listen address (/metrics, /healthz, /readyz)")
	fs.StringVar(&c.Redis, "redis", "", "Redis: host:port, a redis:// or rediss:// URL, or comma-separated cluster addresses; empty = in-process store")
	fs.StringVar(&etcd, "etcd", "", "comma-separated etcd endpoints; empty = standalone (share 1, policies from -policies)")
	fs.StringVar(&c.Policies, "policies", "", "policy file or directory (own YAML or Envoy rate limit service config), reloaded on change")
	fs.DurationVar(&c.StoreTimeout, "store-timeout", 5*time.Millisecond, "time budget of one Redis call before the policy's failure mode decides")
	fs.IntVar(&c.RedisMerge, "redis-merge", 0, fmt.Sprintf("most concurrent single-bucket checks merged into one Redis script call (within one hash slot on a cluster); 0 = %d, 1 = no merging, at most %d", bucket.DefaultMerge, maxRedisMerge))
	fs.IntVar(&c.BreakerThreshold, "breaker-threshold", 5, "consecutive Redis failures that open the circuit breaker")
	fs.DurationVar(&c.BreakerCooldown, "breaker-cooldown", time.Second, "how long the open breaker keeps Redis out before a probe")
	fs.StringVar(&c.OTLPEndpoint, "otlp-endpoint", "", "OTLP gRPC endpoint (host:port) for traces; empty = tracing off")
	fs.StringVar(&c.TLSCert, "tls-cert", "", "PEM certificate for the gRPC server (with -tls-key)")
	fs.StringVar(&c.TLSKey, "tls-key", "", "PEM private key for the gRPC server")
	fs.StringVar(&c.TLSClientCA, "tls-client-ca", "", "PEM CA bundle: require and verify client certificates")
	fs.StringVar(&c.RedisTLS.CAFile, "redis-tls-ca", "", "PEM CA bundle: connect to Redis over TLS and verify its certificate (reloaded on change)")
	fs.StringVar(&c.RedisTLS.CertFile, "redis-tls-cert", "", "PEM client certificate for Redis (with -redis-tls-key; mutual TLS)")
	fs.StringVar(&c.RedisTLS.KeyFile, "redis-tls-key", "", "PEM private key of -redis-tls-cert")
	fs.StringVar(&c.RedisTLS.ServerName, "redis-tls-server-name", "", "name Redis's certificate must carry; default the host of -redis (needed for cluster seeds given as IP addresses)")
	fs.StringVar(&c.EtcdTLS.CAFile, "etcd-tls-ca", "", "PEM CA bundle: connect to etcd over TLS (https) and verify its certificates (reloaded on change)")
	fs.StringVar(&c.EtcdTLS.CertFile, "etcd-tls-cert", "", "PEM client certificate for etcd (with -etcd-tls-key; mutual TLS, reloaded on change)")
	fs.StringVar(&c.EtcdTLS.KeyFile, "etcd-tls-key", "", "PEM private key of -etcd-tls-cert")
	fs.StringVar(&c.EtcdTLS.ServerName, "etcd-tls-server-name", "", "name every etcd certificate must carry; default each endpoint's host")
	fs.StringVar(&unknownPolicy, "unknown-policy", "error", "checks naming an unknown policy: error (NotFound), deny or allow")
	fs.StringVar(&headers, "rls-headers", "off", "Envoy API response headers: off or draft (RateLimit-Limit/-Remaining/-Reset)")
	fs.StringVar(&c.SubjectSalt, "subject-salt", "", "salt for hashed subjects; the same in every region")
	fs.StringVar(&envoyPlainKeys, "envoy-plain-keys", "", "comma-separated Envoy descriptor keys whose values are not secret and stay readable in Redis keys (e.g. tenant,path); every other value is hashed")
	fs.IntVar(&c.DecisionLogEvery, "decision-log-every", 0, "log one decision in N (subject hashed); 0 = off")
	fs.IntVar(&c.LocalMaxBuckets, "local-max-buckets", 100000, "bound on buckets of the in-process store")
	fs.DurationVar(&c.ReportInterval, "report-interval", 5*time.Second, "demand report interval (with -etcd)")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", daemon.DefaultShutdownTimeout, "how long a graceful shutdown may take")
	fs.DurationVar(&c.ReloadSettle, "reload-settle", 200*time.Millisecond, "quiet time after a policy file change before reloading")
	// Identity floods (see Config.MaxLiveSubjects).
	fs.IntVar(&c.MaxLiveSubjects, "max-live-subjects", 100000, "per policy, subjects this node lets hold a bucket of their own; newer ones share the policy's overflow bucket")
	fs.IntVar(&c.IPv6SubjectPrefix, "ipv6-subject-prefix", 64, "prefix length IPv6 subjects are aggregated to (ip policies, Envoy remote_address), 1 to 128")
	logs.Register(fs)
	if err := daemon.Parse(fs, args, env); err != nil {
		return c, err
	}
	c.EtcdEndpoints = daemon.SplitList(etcd)
	c.EnvoyPlainKeys = daemon.SplitList(envoyPlainKeys)
	c.UnknownPolicy, c.Headers = UnknownPolicy(unknownPolicy), HeaderMode(headers)
	var err error
	if c.Logger, err = logs.Logger("regional", stderr); err != nil {
		return c, err
	}
	c.Announce = stderr
	return c, nil
}
