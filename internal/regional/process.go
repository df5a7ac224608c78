package regional

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"sync"
	"time"

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

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/clock"
	"github.com/quotacoord/quota/internal/daemon"
	"github.com/quotacoord/quota/internal/etcdauth"
	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/regionsync"
	"github.com/quotacoord/quota/internal/tlsconfig"
)

// DaemonConfig configures a regional node process (Run): its listeners,
// its stores, its etcd, TLS, and the settings it passes to the Node
// (Config). Zero fields take the defaults listed; the flag of each field
// (cmd/regional) is named in its errors.
type DaemonConfig struct {
	// RLQS serves Envoy's Rate Limit Quota Service (rlqs.go).
	RLQS RLQSConfig
	// Region is this node's region; default "local".
	Region string
	// NodeID is this node's id within its region,
	// [A-Za-z0-9_.-]{1,etcdlayout.MaxNameLen}: each node of a region
	// registers, reports demand and acknowledges under its own etcd keys.
	// Default regionsync.DefaultNodeID() (the host name plus a random
	// suffix).
	NodeID string
	// GRPCAddr serves the Admission API, Envoy's RLS and health (and
	// reflection with GRPCReflection); default ":8081".
	GRPCAddr string
	// GRPCReflection turns gRPC server reflection on; default off.
	GRPCReflection bool
	// HTTPAddr serves /metrics, /healthz and /readyz; default
	// "127.0.0.1:8080", loopback: metrics are for the host's scraper
	// unless an address is given (the deploy manifests give ":8080").
	HTTPAddr string
	// Redis is the primary store: host:port, a redis:// or rediss:// URL,
	// or comma-separated cluster seeds. Empty uses the in-process store
	// (one node only).
	Redis string
	// RedisMerge is the most concurrent single-bucket checks merged into
	// one script call: 0 means bucket.DefaultMerge, 1 no merging, at most
	// 256.
	RedisMerge int
	// LossGuard starts buckets conservatively after the primary store
	// lost its state (bucket.RedisConfig.LossGuard; without Redis, the
	// in-process store treats this process's start as such a loss):
	// for one refill time after a Redis restart without persistence,
	// FLUSHALL or a failover to an empty replica, a bucket it finds
	// absent starts empty (token bucket) or full (window algorithms),
	// as does every bucket of a new Redis. Every node sharing a Redis
	// should set it alike.
	LossGuard bool
	// RedisTLS connects to Redis over TLS (files reloaded on change); it
	// needs Redis.
	RedisTLS RedisTLS
	// RedisUsername is the Redis ACL user; empty means the default user.
	// RedisPassword is its password, or RedisPasswordFile names a file
	// holding it (one line; read at start), not both. They work with every
	// form of Redis; a URL may carry credentials instead, not as well.
	// Run sends a PING at start: Redis refusing the credentials is an
	// error (Redis unreachable is not: the failure modes decide).
	RedisUsername, RedisPassword, RedisPasswordFile string
	// RedisSentinelMaster, when set, makes Redis the comma-separated
	// host:port addresses of Redis Sentinels that monitor the primary of
	// this name: the node follows the primary they name through failovers
	// without a restart (bucket.DialOptions.SentinelMaster; RedisTLS
	// applies to the Sentinels too). RedisSentinelUsername and
	// RedisSentinelPassword, or RedisSentinelPasswordFile, authenticate
	// to the Sentinels as the Redis credentials do to the data nodes.
	RedisSentinelMaster                                                     string
	RedisSentinelUsername, RedisSentinelPassword, RedisSentinelPasswordFile string
	// EtcdEndpoints join the region to the coordinator's etcd. Empty runs
	// standalone: share 1, policies from Policies.
	EtcdEndpoints []string
	// EtcdTLS is the etcd client's TLS; it needs EtcdEndpoints. Its Logger
	// is filled in.
	EtcdTLS tlsconfig.Etcd
	// EtcdAuth is the etcd user the node authenticates as (-etcd-username)
	// and its password (-etcd-password-file or QUOTA_ETCD_PASSWORD); it
	// needs EtcdEndpoints. With a user the node authenticates at start:
	// credentials etcd refuses stop Run with an error wrapping
	// etcdauth.ErrRefused. The zero value authenticates as nobody (or by
	// the client certificate's common name).
	EtcdAuth etcdauth.Credentials
	// Policies is a policy file or directory, reloaded on change; without
	// it the policies come from etcd. One of Policies and EtcdEndpoints
	// is required.
	Policies string
	// ReloadSettle is the quiet time after a policy, grants or tokens file
	// change before reloading; default 200ms.
	ReloadSettle time.Duration
	// StoreTimeout, BreakerThreshold, BreakerCooldown, UnknownPolicy,
	// Headers, SubjectSalt, EnvoyPlainKeys and DecisionLogEvery are the
	// Node's (Config, with its defaults), except that an empty SubjectSalt
	// with EtcdEndpoints is the deployment's salt stored in etcd
	// (etcdlayout.Layout.SubjectSalt), created by the first node to start
	// and shared by every region; a node that cannot read it does not
	// start. Without etcd an empty SubjectSalt is random per process.
	StoreTimeout     time.Duration
	BreakerThreshold int
	BreakerCooldown  time.Duration
	UnknownPolicy    UnknownPolicy
	Headers          HeaderMode
	SubjectSalt      string
	EnvoyPlainKeys   []string
	DecisionLogEvery int
	// GrantsFile says which callers may check, peek, refund and override
	// on which policies (YAML or JSON, see internal/grants); empty grants
	// check, and nothing else, to every caller. Callers are identified by
	// the URI and DNS SANs of their verified client certificates
	// (TLSClientCA) and by TokensFile. Both files are reloaded when they
	// change (a bad version keeps the last good one).
	GrantsFile string
	// TokensFile lists bearer tokens ("NAME TOKEN" lines) that identify
	// callers as "token:NAME"; empty accepts none. Tokens travel in the
	// clear without TLSCert.
	TokensFile string
	// CallerMaxInflight bounds the bucket operations one caller may have
	// in flight on the node (Config.CallerMaxInflight): 0 means
	// DefaultCallerMaxInflight, negative no bound.
	CallerMaxInflight int
	// OTLPEndpoint (host:port) receives traces over OTLP gRPC with TLS
	// (the system roots), or in plaintext with OTLPInsecure; empty turns
	// tracing off.
	OTLPEndpoint string
	OTLPInsecure bool
	// TLSCert and TLSKey serve gRPC over TLS; TLSClientCA then requires
	// client certificates from it. Files are reloaded on change.
	TLSCert, TLSKey, TLSClientCA string
	// LocalMaxBuckets bounds the in-process store; default 100000.
	LocalMaxBuckets int
	// MaxLiveSubjects and IPv6SubjectPrefix are the Node's (Config).
	MaxLiveSubjects   int
	IPv6SubjectPrefix int
	// ReportInterval is the demand report interval (with etcd); default
	// 5s.
	ReportInterval time.Duration
	// Drain is how long the node keeps serving, not ready (Node.Drain,
	// gRPC health NOT_SERVING), once ctx ends and before the graceful stop
	// (daemon.Servers.Drain); zero stops at once. cmd/regional's -drain
	// defaults to 5s.
	Drain time.Duration
	// ShutdownTimeout bounds each graceful stop; default
	// daemon.DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
	// Logger defaults to hclog.NewNullLogger(); Run adds the region and
	// node to every line.
	Logger hclog.Logger
	// Announce, when set, receives "grpc listening on ADDR" and
	// "http listening on ADDR" once the node listens.
	Announce io.Writer
	// Clock is the node's clock, for its decisions (Config.Clock) and its
	// etcd side (regionsync.Config.Clock: lease age on its monotonic
	// reading); nil is the system clock. Tests step it.
	Clock clock.Clock
}

// RedisTLS is the Redis client's TLS: the CA Redis's certificate is
// verified against, a client certificate and key for mutual TLS, and the
// name Redis's certificate must carry (default the host of
// DaemonConfig.Redis, needed for cluster seeds given as IP addresses).
type RedisTLS struct {
	CAFile, CertFile, KeyFile, ServerName string
}

// DefaultHTTPAddr is where a node serves /metrics, /healthz and /readyz
// unless told otherwise: loopback, so that only the host's scraper reads
// them until an operator opens the port (-http-addr).
const DefaultHTTPAddr = "127.0.0.1:8080"

// MaxRedisMerge bounds DaemonConfig.RedisMerge: a merged script call holds
// single-threaded Redis for the time of every bucket in it
// (bucket.DefaultMerge).
const MaxRedisMerge = 256

// withDefaults returns c with defaults filled in, or an ErrConfig naming
// the first bad field by its flag.
func (c DaemonConfig) withDefaults() (DaemonConfig, error) {
	bad := func(format string, args ...any) (DaemonConfig, error) {
		return c, fmt.Errorf("%w: "+format, append([]any{ErrConfig}, args...)...)
	}
	if len(c.EtcdEndpoints) == 0 && c.Policies == "" {
		return bad("give -policies FILE (standalone) or -etcd ENDPOINTS")
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		return bad("-tls-cert and -tls-key go together")
	}
	if c.TLSClientCA != "" && c.TLSCert == "" {
		return bad("-tls-client-ca needs -tls-cert and -tls-key")
	}
	if (c.RedisTLS.CertFile == "") != (c.RedisTLS.KeyFile == "") {
		return bad("-redis-tls-cert and -redis-tls-key go together")
	}
	if c.RedisTLS != (RedisTLS{}) && c.Redis == "" {
		return bad("-redis-tls-* flags need -redis")
	}
	if c.RedisPassword != "" && c.RedisPasswordFile != "" {
		return bad("-redis-password-file and QUOTA_REDIS_PASSWORD both give the Redis password")
	}
	if (c.RedisUsername != "" || c.RedisPassword != "" || c.RedisPasswordFile != "") && c.Redis == "" {
		return bad("-redis-username, -redis-password-file and QUOTA_REDIS_PASSWORD need -redis")
	}
	if c.RedisSentinelMaster != "" && c.Redis == "" {
		return bad("-redis-sentinel-master needs -redis-sentinel")
	}
	if c.RedisSentinelPassword != "" && c.RedisSentinelPasswordFile != "" {
		return bad("-redis-sentinel-password-file and QUOTA_REDIS_SENTINEL_PASSWORD both give the Sentinel password")
	}
	if (c.RedisSentinelUsername != "" || c.RedisSentinelPassword != "" || c.RedisSentinelPasswordFile != "") && c.RedisSentinelMaster == "" {
		return bad("-redis-sentinel-username, -redis-sentinel-password-file and QUOTA_REDIS_SENTINEL_PASSWORD need -redis-sentinel")
	}
	if c.RedisMerge < 0 || c.RedisMerge > MaxRedisMerge {
		return bad("-redis-merge %d, want 0 to %d", c.RedisMerge, MaxRedisMerge)
	}
	if (c.EtcdTLS.CertFile == "") != (c.EtcdTLS.KeyFile == "") {
		return bad("-etcd-tls-cert and -etcd-tls-key go together")
	}
	if c.EtcdTLS.Enabled() && len(c.EtcdEndpoints) == 0 {
		return bad("-etcd-tls-* flags need -etcd")
	}
	if c.EtcdAuth != (etcdauth.Credentials{}) && len(c.EtcdEndpoints) == 0 {
		return bad("-etcd-username, -etcd-password-file and QUOTA_ETCD_PASSWORD need -etcd")
	}
	if c.OTLPInsecure && c.OTLPEndpoint == "" {
		return bad("-otlp-insecure needs -otlp-endpoint")
	}
	if c.NodeID == "" {
		c.NodeID = regionsync.DefaultNodeID()
	}
	if !etcdlayout.ValidName(c.NodeID) {
		return bad("-node-id %q, want [A-Za-z0-9_.-]{1,%d}", c.NodeID, etcdlayout.MaxNameLen)
	}
	if c.LocalMaxBuckets < 0 {
		return bad("-local-max-buckets %d, want at least 1", c.LocalMaxBuckets)
	}
	if c.Drain < 0 {
		return bad("-drain %v is negative", c.Drain)
	}
	defaults := []struct {
		v    *time.Duration
		def  time.Duration
		flag string
	}{
		{&c.ReloadSettle, 200 * time.Millisecond, "-reload-settle"},
		{&c.StoreTimeout, 5 * time.Millisecond, "-store-timeout"},
		{&c.ReportInterval, 5 * time.Second, "-report-interval"},
		{&c.ShutdownTimeout, daemon.DefaultShutdownTimeout, "-shutdown-timeout"},
	}
	for _, d := range defaults {
		switch {
		case *d.v == 0:
			*d.v = d.def
		case *d.v < 0:
			return bad("%s %v is negative", d.flag, *d.v)
		}
	}
	if c.Region == "" {
		c.Region = "local"
	}
	if c.GRPCAddr == "" {
		c.GRPCAddr = ":8081"
	}
	if c.HTTPAddr == "" {
		c.HTTPAddr = DefaultHTTPAddr
	}
	if c.LocalMaxBuckets == 0 {
		c.LocalMaxBuckets = 100000
	}
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	return c, nil
}

// otlpExportTimeout bounds one export of spans to the OTLP collector.
const otlpExportTimeout = 3 * time.Second

// Run runs one regional node until ctx is done, then shuts down
// gracefully: health turns NOT_SERVING and /readyz 503 while the node
// keeps serving for Drain, then in-flight checks finish (within
// ShutdownTimeout), the last demand report is flushed and the stores
// close. It starts goroutines for the servers, the etcd side and the
// policy watcher and waits for all of them before returning.
func Run(ctx context.Context, c DaemonConfig) error {
	c, err := c.withDefaults()
	if err != nil {
		return err
	}
	log := c.Logger.With("region", c.Region, "node", c.NodeID)
	var cleanup daemon.Cleanup
	defer cleanup.Run()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	var tp trace.TracerProvider = noop.NewTracerProvider()
	if c.OTLPEndpoint != "" {
		// An export (retries included) ends within otlpExportTimeout, so
		// the flush at shutdown ends within its own budget and leaves no
		// exporter goroutine behind, even when the collector never answers.
		opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(c.OTLPEndpoint), otlptracegrpc.WithTimeout(otlpExportTimeout)}
		if c.OTLPInsecure {
			opts = append(opts, otlptracegrpc.WithInsecure())
		}
		exp, err := otlptracegrpc.New(ctx, opts...)
		if err != nil {
			return fmt.Errorf("regional: OTLP exporter: %w", err)
		}
		res, _ := sdkresource.Merge(sdkresource.Default(), sdkresource.NewSchemaless())
		sdk := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
		cleanup.Push(func() {
			sctx, cancel := context.WithTimeout(context.Background(), otlpExportTimeout+2*time.Second)
			defer cancel()
			if err := sdk.Shutdown(sctx); err != nil {
				log.Warn("last trace export failed", "error", err)
			}
		})
		tp = sdk
	}

	// The in-process store guards against loss only as the primary: as
	// the fallback of failure mode local its buckets start at the
	// region's share divided among its nodes, as documented for that mode.
	local, err := bucket.NewMemory(bucket.MemoryConfig{Clock: clock.Real{}, MaxBuckets: c.LocalMaxBuckets, LossGuard: c.LossGuard && c.Redis == ""})
	if err != nil {
		return fmt.Errorf("regional: local store: %w", err)
	}
	var store bucket.Store = local
	if c.Redis != "" {
		rtls, err := redisTLS(c, log)
		if err != nil {
			return err
		}
		rc, err := openRedis(ctx, c, rtls, log)
		if err != nil {
			return err
		}
		cleanup.Push(func() { _ = rc.Close() })
		// One pipeline in flight per P, at most the store's default: a
		// node on one core then sends every waiting call in one pipeline
		// rather than splitting them over two (pipelines twice as large,
		// 10-13% less CPU per check for the node and for a Redis on the
		// same core, bench-regional.sh).
		rs, err := bucket.NewRedis(bucket.RedisConfig{Client: rc, Flushers: min(bucket.DefaultFlushers, runtime.GOMAXPROCS(0)), Merge: c.RedisMerge,
			LossGuard: c.LossGuard})
		if err != nil {
			return fmt.Errorf("regional: redis store: %w", err)
		}
		cleanup.Push(func() { _ = rs.Close() })
		store = rs
		log.Info("using redis", "redis", redactURL(c.Redis), "sentinel_master", c.RedisSentinelMaster)
	} else {
		log.Info("no -redis: using the in-process store (one node only)")
	}

	c.RLQS.gate = &rlqsGate{}
	ss, err := startSync(ctx, c, log)
	if err != nil {
		return err
	}
	cleanup.Push(ss.stop)
	if c.SubjectSalt == "" {
		c.SubjectSalt = ss.salt
	}
	g, toks, err := loadGrants(c, log)
	if err != nil {
		return err
	}
	ncfg := Config{
		Region: c.Region, Store: store, Local: local, Shares: ss.shares, Demand: ss.demand,
		Logger: log, Registerer: reg, TracerProvider: tp, StoreTimeout: c.StoreTimeout,
		BreakerThreshold: c.BreakerThreshold, BreakerCooldown: c.BreakerCooldown,
		UnknownPolicy: c.UnknownPolicy, SubjectSalt: c.SubjectSalt, EnvoyPlainKeys: c.EnvoyPlainKeys,
		DecisionLogEvery: c.DecisionLogEvery, Headers: c.Headers, Grants: g, Tokens: toks,
		CallerMaxInflight: c.CallerMaxInflight,
		MaxLiveSubjects:   c.MaxLiveSubjects, IPv6SubjectPrefix: c.IPv6SubjectPrefix,
		Clock: c.Clock,
	}
	n, err := New(ncfg)
	if err != nil {
		return err
	}
	c.RLQS.gate.node.Store(n)
	cleanup.Push(n.releaseLeases)
	if c.Policies != "" {
		if err := n.LoadPolicies(c.Policies); err != nil {
			return err
		}
		log.Info("policies loaded", "path", c.Policies, "policies", n.set.Load().Len())
	}
	ss.attach(n)

	// The gRPC tracing handler only when tracing is on: even with a no-op
	// provider it costs allocations and CPU on every call.
	serverOpts := grpcServerOptions()
	if c.OTLPEndpoint != "" {
		serverOpts = append(serverOpts, grpc.StatsHandler(otelgrpc.NewServerHandler(
			otelgrpc.WithTracerProvider(tp), otelgrpc.WithPropagators(propagation.TraceContext{}))))
	}
	if c.TLSCert != "" {
		tc, err := serverTLS(c, log)
		if err != nil {
			return err
		}
		serverOpts = append(serverOpts, grpc.Creds(credentials.NewTLS(tc)))
	}
	gs := grpc.NewServer(serverOpts...)
	n.Register(gs)
	if err := startRLQS(ctx, c, n, store, ss.shares, gs, reg, log, &cleanup); err != nil {
		return err
	}
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)

	gl, hl, err := daemon.Listen(c.GRPCAddr, c.HTTPAddr)
	if err != nil {
		return fmt.Errorf("regional: %w", err)
	}
	servers := daemon.Servers{GRPC: gs, GRPCListener: gl, HTTPListener: hl, Health: hs, Reflection: c.GRPCReflection,
		HTTP:  &http.Server{Handler: n.Handler(reg), ReadHeaderTimeout: 5 * time.Second},
		Drain: c.Drain, OnDrain: n.Drain, ShutdownTimeout: c.ShutdownTimeout, Announce: c.Announce, Logger: log}

	// The node's own goroutines run until the servers stopped.
	nctx, stopNode := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = local.Run(nctx) // sweeps expired in-process buckets until nctx ends
	}()
	if c.GrantsFile != "" || c.TokensFile != "" {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := n.WatchGrants(nctx, c.GrantsFile, c.TokensFile, c.ReloadSettle); err != nil {
				log.Error("grants watcher stopped; no more reloads", "error", err)
			}
		}()
	}
	if c.Policies != "" {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := n.WatchPolicies(nctx, c.Policies, c.ReloadSettle); err != nil {
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
	fctx, cancel := context.WithTimeout(context.Background(), c.ShutdownTimeout)
	defer cancel()
	if err := ss.flush(fctx); err != nil {
		log.Warn("last demand report failed", "error", err)
	}
	log.Info("stopped")
	return runErr
}

// grpcServerOptions are the options of the node's gRPC server that do not
// depend on its configuration.
//
// Stream workers serve calls on reused goroutines, whose stacks have
// grown to the check path's depth (about 16 KiB). A call that finds no
// idle worker runs on a new goroutine, whose stack starts at the
// runtime's average (a few KiB) and is grown, and copied, several times
// on the way down: at 50 concurrent callers with 4 workers per P, stack
// growth took about 8 µs of node CPU per check, a sixth of it. So there
// are at least as many workers as concurrent calls a node usually holds
// (streamWorkers); an idle one costs a small stack, which the garbage
// collector shrinks. gRPC shares write buffers by default.
//
// Fixed flow-control windows turn off gRPC's bandwidth-delay probing: its
// PING went out in a write of its own while a check waited for Redis
// (about half a write syscall more per check at c=1, each one waking the
// client).
func grpcServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.NumStreamWorkers(uint32(max(streamWorkers, 4*runtime.GOMAXPROCS(0)))),
		grpc.InitialWindowSize(GRPCWindow), grpc.InitialConnWindowSize(GRPCWindow)}
}

// streamWorkers is the least number of the gRPC server's stream workers
// (see grpcServerOptions).
const streamWorkers = 128
