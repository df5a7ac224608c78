package regional

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	sdkresource "go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/clock"
	"github.com/quotacoord/quota/internal/daemon"
	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/regionsync"
	"github.com/quotacoord/quota/internal/tlsconfig"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

// Register adds the node's services to s: the own Admission API and
// Envoy's RateLimitService.
func (n *Node) Register(s grpc.ServiceRegistrar) {
	quotav1.RegisterAdmissionServer(s, &admission{n: n})
	rlsv3.RegisterRateLimitServiceServer(s, &rls{n: n})
}

// options are the command-line settings of one regional node.
type options struct {
	region, grpcAddr, httpAddr      string
	nodeID                          string
	redis, etcd, policies           string
	storeTimeout, breakerCooldown   time.Duration
	breakerThreshold                int
	logs                            daemon.LogFlags
	otlpEndpoint                    string
	tlsCert, tlsKey, tlsClientCA    string
	redisTLSCA, redisTLSCert        string
	redisTLSKey, redisTLSServerName string
	etcdTLSCA, etcdTLSCert          string
	etcdTLSKey, etcdTLSServerName   string
	unknownPolicy, headers          string
	subjectSalt                     string
	envoyPlainKeys                  string
	decisionLogEvery                int
	localMaxBuckets                 int
	reportInterval, shutdownTimeout time.Duration
	reloadSettle                    time.Duration
	redisMerge                      int
}

// parseFlags reads the node's flags from args, their defaults from the
// QUOTA_* variables of env (daemon.Parse), and checks them.
func parseFlags(args []string, env []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("regional", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.region, "region", "local", "this node's region, [A-Za-z0-9_-]")
	fs.StringVar(&o.nodeID, "node-id", "", "this node's id within its region, [A-Za-z0-9_.-]{1,64}: each node of a region registers, reports demand and acknowledges under its own etcd keys; default the hostname plus a random suffix")
	fs.StringVar(&o.grpcAddr, "grpc-addr", ":8081", "gRPC listen address (own Admission API, Envoy RLS, health, reflection)")
	fs.StringVar(&o.httpAddr, "http-addr", ":8080", "HTTP listen address (/metrics, /healthz, /readyz)")
	fs.StringVar(&o.redis, "redis", "", "Redis: host:port, a redis:// or rediss:// URL, or comma-separated cluster addresses; empty = in-process store")
	fs.StringVar(&o.etcd, "etcd", "", "comma-separated etcd endpoints; empty = standalone (share 1, policies from -policies)")
	fs.StringVar(&o.policies, "policies", "", "policy file or directory (own YAML or Envoy rate limit service config), reloaded on change")
	fs.DurationVar(&o.storeTimeout, "store-timeout", 5*time.Millisecond, "time budget of one Redis call before the policy's failure mode decides")
	fs.IntVar(&o.redisMerge, "redis-merge", 0, fmt.Sprintf("most concurrent single-bucket checks merged into one Redis script call (within one hash slot on a cluster); 0 = %d, 1 = no merging, at most %d", bucket.DefaultMerge, maxRedisMerge))
	fs.IntVar(&o.breakerThreshold, "breaker-threshold", 5, "consecutive Redis failures that open the circuit breaker")
	fs.DurationVar(&o.breakerCooldown, "breaker-cooldown", time.Second, "how long the open breaker keeps Redis out before a probe")
	fs.StringVar(&o.otlpEndpoint, "otlp-endpoint", "", "OTLP gRPC endpoint (host:port) for traces; empty = tracing off")
	fs.StringVar(&o.tlsCert, "tls-cert", "", "PEM certificate for the gRPC server (with -tls-key)")
	fs.StringVar(&o.tlsKey, "tls-key", "", "PEM private key for the gRPC server")
	fs.StringVar(&o.tlsClientCA, "tls-client-ca", "", "PEM CA bundle: require and verify client certificates")
	fs.StringVar(&o.redisTLSCA, "redis-tls-ca", "", "PEM CA bundle: connect to Redis over TLS and verify its certificate (reloaded on change)")
	fs.StringVar(&o.redisTLSCert, "redis-tls-cert", "", "PEM client certificate for Redis (with -redis-tls-key; mutual TLS)")
	fs.StringVar(&o.redisTLSKey, "redis-tls-key", "", "PEM private key of -redis-tls-cert")
	fs.StringVar(&o.redisTLSServerName, "redis-tls-server-name", "", "name Redis's certificate must carry; default the host of -redis (needed for cluster seeds given as IP addresses)")
	fs.StringVar(&o.etcdTLSCA, "etcd-tls-ca", "", "PEM CA bundle: connect to etcd over TLS (https) and verify its certificates (reloaded on change)")
	fs.StringVar(&o.etcdTLSCert, "etcd-tls-cert", "", "PEM client certificate for etcd (with -etcd-tls-key; mutual TLS, reloaded on change)")
	fs.StringVar(&o.etcdTLSKey, "etcd-tls-key", "", "PEM private key of -etcd-tls-cert")
	fs.StringVar(&o.etcdTLSServerName, "etcd-tls-server-name", "", "name every etcd certificate must carry; default each endpoint's host")
	fs.StringVar(&o.unknownPolicy, "unknown-policy", "error", "checks naming an unknown policy: error (NotFound), deny or allow")
	fs.StringVar(&o.headers, "rls-headers", "off", "Envoy API response headers: off or draft (RateLimit-Limit/-Remaining/-Reset)")
	fs.StringVar(&o.subjectSalt, "subject-salt", "", "salt for hashed subjects; the same in every region")
	fs.StringVar(&o.envoyPlainKeys, "envoy-plain-keys", "", "comma-separated Envoy descriptor keys whose values are not secret and stay readable in Redis keys (e.g. tenant,path); every other value is hashed")
	fs.IntVar(&o.decisionLogEvery, "decision-log-every", 0, "log one decision in N (subject hashed); 0 = off")
	fs.IntVar(&o.localMaxBuckets, "local-max-buckets", 100000, "bound on buckets of the in-process store")
	fs.DurationVar(&o.reportInterval, "report-interval", 5*time.Second, "demand report interval (with -etcd)")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", daemon.DefaultShutdownTimeout, "how long a graceful shutdown may take")
	fs.DurationVar(&o.reloadSettle, "reload-settle", 200*time.Millisecond, "quiet time after a policy file change before reloading")
	o.logs.Register(fs)
	if err := daemon.Parse(fs, args, env); err != nil {
		return nil, err
	}
	if o.policies == "" && o.etcd == "" {
		return nil, errors.New("regional: give -policies FILE (standalone) or -etcd ENDPOINTS")
	}
	if (o.tlsCert == "") != (o.tlsKey == "") {
		return nil, errors.New("regional: -tls-cert and -tls-key go together")
	}
	if o.tlsClientCA != "" && o.tlsCert == "" {
		return nil, errors.New("regional: -tls-client-ca needs -tls-cert and -tls-key")
	}
	if (o.redisTLSCert == "") != (o.redisTLSKey == "") {
		return nil, errors.New("regional: -redis-tls-cert and -redis-tls-key go together")
	}
	if (o.redisTLSCA != "" || o.redisTLSCert != "" || o.redisTLSServerName != "") && o.redis == "" {
		return nil, errors.New("regional: -redis-tls-* flags need -redis")
	}
	if o.redisMerge < 0 || o.redisMerge > maxRedisMerge {
		return nil, fmt.Errorf("regional: -redis-merge %d, want 0 to %d", o.redisMerge, maxRedisMerge)
	}
	if (o.etcdTLSCert == "") != (o.etcdTLSKey == "") {
		return nil, errors.New("regional: -etcd-tls-cert and -etcd-tls-key go together")
	}
	if (o.etcdTLSCA != "" || o.etcdTLSCert != "" || o.etcdTLSServerName != "") && o.etcd == "" {
		return nil, errors.New("regional: -etcd-tls-* flags need -etcd")
	}
	if o.nodeID == "" {
		o.nodeID = regionsync.DefaultNodeID()
	}
	if !etcdlayout.ValidName(o.nodeID) {
		return nil, fmt.Errorf("regional: -node-id %q, want [A-Za-z0-9_.-]{1,%d}", o.nodeID, etcdlayout.MaxNameLen)
	}
	if o.localMaxBuckets < 1 {
		return nil, fmt.Errorf("regional: -local-max-buckets %d, want at least 1", o.localMaxBuckets)
	}
	return o, nil
}

// Main runs one regional node until ctx is done, then shuts down
// gracefully: health turns NOT_SERVING, in-flight checks finish (within
// -shutdown-timeout), the last demand report is flushed and the stores
// close. args are the command-line arguments without the program name,
// env is os.Environ()-style (QUOTA_* variables set flag defaults, see
// internal/daemon); the usage, the logs and the "grpc listening on" and
// "http listening on" lines go to stderr. It starts goroutines for the
// servers and the policy watcher and waits for all of them before
// returning.
func Main(ctx context.Context, args, env []string, stderr io.Writer) error {
	o, err := parseFlags(args, env, stderr)
	if err != nil {
		return err
	}
	log, err := o.logs.Logger("regional", stderr)
	if err != nil {
		return err
	}
	log = log.With("region", o.region, "node", o.nodeID)
	var cleanup daemon.Cleanup
	defer cleanup.Run()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	var tp trace.TracerProvider = noop.NewTracerProvider()
	if o.otlpEndpoint != "" {
		exp, err := otlptracegrpc.New(ctx, otlptracegrpc.WithEndpoint(o.otlpEndpoint), otlptracegrpc.WithInsecure())
		if err != nil {
			return fmt.Errorf("regional: OTLP exporter: %w", err)
		}
		res, _ := sdkresource.Merge(sdkresource.Default(), sdkresource.NewSchemaless())
		sdk := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
		cleanup.Push(func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = sdk.Shutdown(sctx)
		})
		tp = sdk
	}

	local, err := bucket.NewMemory(bucket.MemoryConfig{Clock: clock.Real{}, MaxBuckets: o.localMaxBuckets})
	if err != nil {
		return fmt.Errorf("regional: local store: %w", err)
	}
	var store bucket.Store = local
	if o.redis != "" {
		rtls, err := redisTLS(o, log)
		if err != nil {
			return err
		}
		rc, err := redisClient(o.redis, o.storeTimeout, rtls)
		if err != nil {
			return err
		}
		cleanup.Push(func() { _ = rc.Close() })
		// One pipeline in flight per P, at most the store's default: a
		// node on one core then sends every waiting call in one pipeline
		// rather than splitting them over two (pipelines twice as large,
		// 10-13% less CPU per check for the node and for a Redis on the
		// same core, bench-regional.sh).
		rs, err := bucket.NewRedis(bucket.RedisConfig{Client: rc, Flushers: min(bucket.DefaultFlushers, runtime.GOMAXPROCS(0)), Merge: o.redisMerge})
		if err != nil {
			return fmt.Errorf("regional: redis store: %w", err)
		}
		cleanup.Push(func() { _ = rs.Close() })
		store = rs
		log.Info("using redis", "redis", redactURL(o.redis))
	} else {
		log.Info("no -redis: using the in-process store (one node only)")
	}

	ss, err := startSync(ctx, o, log)
	if err != nil {
		return err
	}
	cleanup.Push(ss.stop)
	cfg := Config{
		Region: o.region, Store: store, Local: local, Shares: ss.shares, Demand: ss.demand,
		Logger: log, Registerer: reg, TracerProvider: tp, StoreTimeout: o.storeTimeout,
		BreakerThreshold: o.breakerThreshold, BreakerCooldown: o.breakerCooldown,
		UnknownPolicy: UnknownPolicy(o.unknownPolicy), SubjectSalt: o.subjectSalt, EnvoyPlainKeys: daemon.SplitList(o.envoyPlainKeys),
		DecisionLogEvery: o.decisionLogEvery, Headers: HeaderMode(o.headers),
	}
	n, err := New(cfg)
	if err != nil {
		return err
	}
	if o.policies != "" {
		if err := n.LoadPolicies(o.policies); err != nil {
			return err
		}
		log.Info("policies loaded", "path", o.policies, "policies", n.set.Load().Len())
	}
	ss.attach(n)

	// The gRPC tracing handler only when tracing is on: even with a no-op
	// provider it costs allocations and CPU on every call.
	// Stream workers serve calls on reused goroutines (no new goroutine and
	// stack per call); gRPC shares write buffers by default.
	// Fixed flow-control windows turn off gRPC's bandwidth-delay probing:
	// its PING went out in a write of its own while a check waited for
	// Redis (about half a write syscall more per check at c=1, each one
	// waking the client).
	serverOpts := []grpc.ServerOption{grpc.NumStreamWorkers(uint32(4 * runtime.GOMAXPROCS(0))),
		grpc.InitialWindowSize(GRPCWindow), grpc.InitialConnWindowSize(GRPCWindow)}
	if o.otlpEndpoint != "" {
		serverOpts = append(serverOpts, grpc.StatsHandler(otelgrpc.NewServerHandler(
			otelgrpc.WithTracerProvider(tp), otelgrpc.WithPropagators(propagation.TraceContext{}))))
	}
	if o.tlsCert != "" {
		tc, err := serverTLS(o, log)
		if err != nil {
			return err
		}
		serverOpts = append(serverOpts, grpc.Creds(credentials.NewTLS(tc)))
	}
	gs := grpc.NewServer(serverOpts...)
	n.Register(gs)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	reflection.Register(gs)

	gl, hl, err := daemon.Listen(o.grpcAddr, o.httpAddr)
	if err != nil {
		return fmt.Errorf("regional: %w", err)
	}
	servers := daemon.Servers{GRPC: gs, GRPCListener: gl, HTTPListener: hl, Health: hs,
		HTTP:            &http.Server{Handler: n.Handler(reg), ReadHeaderTimeout: 5 * time.Second},
		ShutdownTimeout: o.shutdownTimeout, Announce: stderr, Logger: log}

	// The node's own goroutines run until the servers stopped.
	nctx, stopNode := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = local.Run(nctx) // sweeps expired in-process buckets until nctx ends
	}()
	if o.policies != "" {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := n.WatchPolicies(nctx, o.policies, o.reloadSettle); err != nil {
				log.Error("policy watcher stopped; no more reloads", "error", err)
			}
		}()
	}
	// Serving status follows readiness (until Serve's shutdown turns it
	// NOT_SERVING for good).
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			st := healthpb.HealthCheckResponse_NOT_SERVING
			if n.Ready() {
				st = healthpb.HealthCheckResponse_SERVING
			}
			hs.SetServingStatus("", st)
			hs.SetServingStatus("quota.v1.Admission", st)
			hs.SetServingStatus("envoy.service.ratelimit.v3.RateLimitService", st)
			n.RefreshShareGauges()
			select {
			case <-nctx.Done():
				return
			case <-t.C:
			}
		}
	}()

	runErr := daemon.Serve(ctx, servers)
	if runErr != nil {
		runErr = fmt.Errorf("regional: %w", runErr)
	}
	stopNode()
	wg.Wait()
	fctx, cancel := context.WithTimeout(context.Background(), o.shutdownTimeout)
	defer cancel()
	if err := ss.flush(fctx); err != nil {
		log.Warn("last demand report failed", "error", err)
	}
	log.Info("stopped")
	return runErr
}

// maxRedisMerge bounds -redis-merge: a merged script call holds Redis for
// about 11 µs per bucket (bucket.DefaultMerge).
const maxRedisMerge = 256

// redisClient dials the store's Redis. The client honours context
// deadlines (the store time budget) and never retries: the failure mode is
// faster than a retry. Its own timeouts are a backstop at ten times the
// budget, at least 100 ms.
func redisClient(spec string, budget time.Duration, tc *tls.Config) (bucket.RedisConn, error) {
	timeout := max(10*budget, 100*time.Millisecond)
	rc, err := bucket.DialRedis(spec, bucket.DialOptions{TLS: tc, DialTimeout: timeout, ReadTimeout: timeout, WriteTimeout: timeout})
	if err != nil {
		return nil, fmt.Errorf("regional: -redis: %w", err)
	}
	return rc, nil
}

// redactURL hides a password in a redis URL for logs.
func redactURL(s string) string {
	if i := strings.Index(s, "@"); i >= 0 && strings.Contains(s[:i], "://") {
		return s[:strings.Index(s, "://")+3] + "***" + s[i:]
	}
	return s
}

// serverTLS is the gRPC listener's TLS configuration: -tls-cert and
// -tls-key, and with -tls-client-ca mutual TLS. The files are reloaded when
// they change (internal/tlsconfig), so a rotated certificate or CA is used
// by the next connection without a restart.
func serverTLS(o *options, log hclog.Logger) (*tls.Config, error) {
	r, err := tlsconfig.New(tlsconfig.Config{CertFile: o.tlsCert, KeyFile: o.tlsKey, CAFile: o.tlsClientCA,
		Logger: log.Named("grpc-tls")})
	if err != nil {
		return nil, fmt.Errorf("regional: gRPC TLS: %w", err)
	}
	base := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}}
	if o.tlsClientCA != "" {
		base.ClientAuth = tls.RequireAndVerifyClientCert
	}
	tc, err := r.ServerConfig(base)
	if err != nil {
		return nil, fmt.Errorf("regional: gRPC TLS: %w", err)
	}
	return tc, nil
}

// redisTLS is the Redis client's TLS configuration from the -redis-tls-*
// flags (nil without them: a rediss:// URL then uses the system roots).
// The CA and the client certificate are reloaded when their files change.
// The server name defaults to the host of -redis (the first cluster seed).
func redisTLS(o *options, log hclog.Logger) (*tls.Config, error) {
	if o.redisTLSCA == "" && o.redisTLSCert == "" {
		if o.redisTLSServerName != "" {
			return &tls.Config{MinVersion: tls.VersionTLS12, ServerName: o.redisTLSServerName}, nil
		}
		return nil, nil
	}
	r, err := tlsconfig.New(tlsconfig.Config{CertFile: o.redisTLSCert, KeyFile: o.redisTLSKey, CAFile: o.redisTLSCA,
		Logger: log.Named("redis-tls")})
	if err != nil {
		return nil, fmt.Errorf("regional: Redis TLS: %w", err)
	}
	name := o.redisTLSServerName
	if name == "" {
		name = redisHost(o.redis)
	}
	return r.ClientConfig(&tls.Config{MinVersion: tls.VersionTLS12, ServerName: name}), nil
}

// redisHost is the host of a -redis value: a URL's host, or the host of
// the first host:port.
func redisHost(spec string) string {
	spec = strings.TrimSpace(spec)
	if i := strings.Index(spec, "://"); i >= 0 {
		spec = spec[i+3:]
		if j := strings.LastIndex(spec, "@"); j >= 0 {
			spec = spec[j+1:]
		}
		if j := strings.IndexAny(spec, "/?"); j >= 0 {
			spec = spec[:j]
		}
	}
	spec, _, _ = strings.Cut(spec, ",")
	host, _, err := net.SplitHostPort(strings.TrimSpace(spec))
	if err != nil {
		return strings.TrimSpace(spec)
	}
	return host
}

func isDir(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
}
