package coordinator

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/quotacoord/quota/internal/clock"
	"github.com/quotacoord/quota/internal/daemon"
	"github.com/quotacoord/quota/internal/etcdauth"
	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/operatortoken"
	"github.com/quotacoord/quota/internal/tlsconfig"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
	"github.com/quotacoord/quota/rebalance"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"golang.org/x/crypto/bcrypt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// ErrConfig wraps configuration errors.
var ErrConfig = errors.New("coordinator: invalid config")

// Config configures a coordinator process.
type Config struct {
	// EtcdEndpoints of an existing etcd; empty starts an embedded etcd.
	EtcdEndpoints []string
	// DataDir holds the embedded etcd's data. Default "coordinator-data".
	DataDir string
	// EmbeddedEtcdAddr is where the embedded etcd serves clients. Default
	// 127.0.0.1:2379.
	EmbeddedEtcdAddr string
	// EmbeddedPeerAddr is the embedded etcd's peer address. Default a free
	// loopback port.
	EmbeddedPeerAddr string
	// EmbeddedTLSCert and EmbeddedTLSKey make the embedded etcd serve its
	// clients over TLS (https); EmbeddedClientCA then requires client
	// certificates from that CA (mutual TLS), and the coordinator's own
	// client presents EtcdTLS's certificate. Without EtcdTLS.CAFile the
	// coordinator's client trusts EmbeddedTLSCert itself. Without them the
	// embedded etcd serves plain http (keep it on loopback).
	EmbeddedTLSCert, EmbeddedTLSKey, EmbeddedClientCA string
	// EtcdTLS is the TLS of the coordinator's etcd client, for
	// EtcdEndpoints or the embedded etcd; its files are reloaded when they
	// change. The zero value means plaintext.
	EtcdTLS tlsconfig.Etcd
	// EtcdAuth is the etcd user the coordinator authenticates as, for
	// EtcdEndpoints (-etcd-username, -etcd-password-file or
	// QUOTA_ETCD_PASSWORD). Credentials etcd refuses stop Start with an
	// error wrapping etcdauth.ErrRefused.
	EtcdAuth etcdauth.Credentials
	// EmbeddedAuth turns authentication on in the embedded etcd (the
	// command's default; -embedded-etcd-no-auth turns it off): the
	// coordinator creates etcd's root user and its own user
	// CoordinatorEtcdUser, with random passwords kept in
	// DataDir/etcd-auth, and then nobody without a password reads or
	// writes allocations, policies or controls.
	EmbeddedAuth bool
	// EmbeddedAuthRegions (-embedded-etcd-auth) are the regions whose
	// nodes get a user, etcdauth.RegionUser(region), shared by the
	// region's nodes, its password in RegionPasswordFile. At every start
	// the coordinator adds the regions newly listed; later regions can
	// also be added with quotactl etcd-auth region as root. Listing any
	// implies EmbeddedAuth.
	EmbeddedAuthRegions []string
	// GRPCAddr serves the operator API and health (and reflection with
	// GRPCReflection). Default
	// 127.0.0.1:8091: loopback, because without TLS bearer tokens travel
	// in plaintext (see checkOperatorTransport).
	GRPCAddr string
	// GRPCReflection turns gRPC server reflection on; default off.
	GRPCReflection bool
	// HTTPAddr serves /metrics and /healthz. Default 127.0.0.1:8090,
	// loopback: an address must be given to serve other hosts (the
	// deploy manifests give ":8090").
	HTTPAddr string
	// TokenFile holds the operator tokens; created when absent. Default
	// "operator-tokens" in DataDir (or the working directory with
	// EtcdEndpoints).
	TokenFile string
	// TLSCert and TLSKey enable TLS on the operator API. ClientCA enables
	// mTLS client certificates; WriteNames lists the common names allowed
	// to write ("*" for all). The files are reloaded when they change.
	TLSCert, TLSKey, ClientCA string
	WriteNames                []string
	// InsecureOperatorPlaintext allows the operator API without TLS on a
	// non-loopback GRPCAddr, where bearer tokens travel in plaintext.
	// Without it Start refuses such a configuration.
	InsecureOperatorPlaintext bool
	// Rebalance configures the loop; its Client, Name, Logger and
	// Registerer are filled in.
	Rebalance rebalance.Config
	// Drain is how long the servers keep serving, gRPC health
	// NOT_SERVING, once the context ends and before the graceful stop
	// (daemon.Servers.Drain); zero stops at once.
	Drain time.Duration
	// ShutdownTimeout bounds the graceful stop of each server once the
	// context ends. Default daemon.DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
	// Announce, when set, receives "grpc listening on ADDR" and
	// "http listening on ADDR" lines once the servers listen.
	Announce io.Writer
	// AuditMax bounds the audit log. Default 1000.
	AuditMax int
	// Clock defaults to the real clock.
	Clock clock.Clock
	// Logger defaults to an hclog logger on stderr.
	Logger hclog.Logger
}

// DefaultHTTPAddr is where the coordinator serves /metrics and /healthz
// unless told otherwise: loopback, until an operator opens the port
// (-http-addr).
const DefaultHTTPAddr = "127.0.0.1:8090"

// Coordinator is a running coordinator.
type Coordinator struct {
	// GRPCAddr and HTTPAddr are the bound addresses.
	GRPCAddr, HTTPAddr string
	// EtcdEndpoints are the etcd client URLs in use.
	EtcdEndpoints []string
	// TokenFile is the token file in use.
	TokenFile string
	// Loop is the rebalance loop.
	Loop *rebalance.Loop

	done chan struct{}
	err  error
}

// Start starts everything and returns once the servers listen. It starts
// goroutines that stop when ctx ends; Wait waits for them.
func Start(ctx context.Context, cfg Config) (*Coordinator, error) {
	if cfg.Logger == nil {
		cfg.Logger = hclog.New(&hclog.LoggerOptions{Name: "coordinator"})
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.GRPCAddr == "" {
		cfg.GRPCAddr = "127.0.0.1:8091"
	}
	if cfg.HTTPAddr == "" {
		cfg.HTTPAddr = DefaultHTTPAddr
	}
	if cfg.Drain < 0 {
		return nil, fmt.Errorf("%w: -drain %v is negative", ErrConfig, cfg.Drain)
	}
	if cfg.AuditMax <= 0 {
		cfg.AuditMax = 1000
	}
	if cfg.DataDir == "" {
		cfg.DataDir = "coordinator-data"
	}
	if err := checkOperatorTransport(cfg); err != nil {
		return nil, err
	}
	var cleanup daemon.Cleanup
	fail := func(err error) (*Coordinator, error) {
		cleanup.Run()
		return nil, err
	}
	log := cfg.Logger
	c := &Coordinator{done: make(chan struct{})}
	endpoints, etcdTLS, err := etcdClientSettings(cfg)
	if err != nil {
		return fail(err)
	}
	etcdAuth := cfg.EtcdAuth
	if len(cfg.EtcdEndpoints) == 0 {
		stopEtcd, err := startEmbedded(cfg)
		if err != nil {
			return fail(err)
		}
		cleanup.Push(stopEtcd)
		log.Info("embedded etcd serving", "client_url", endpoints[0], "data_dir", cfg.DataDir,
			"client_cert_auth", cfg.EmbeddedClientCA != "", "auth", cfg.embeddedAuthOn(), "log", embeddedLogFile(cfg))
		if cfg.embeddedAuthOn() {
			if etcdAuth, err = embeddedAuth(ctx, cfg, endpoints, etcdTLS, log); err != nil {
				return fail(err)
			}
		}
	}
	ccfg := clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
	if err := etcdTLS.Apply(&ccfg); err != nil {
		return fail(fmt.Errorf("coordinator: etcd client: %w", err))
	}
	if err := etcdAuth.Apply(&ccfg); err != nil {
		return fail(fmt.Errorf("coordinator: etcd client: %w", err))
	}
	c.EtcdEndpoints = ccfg.Endpoints
	cli, err := clientv3.New(ccfg)
	if err != nil {
		return fail(fmt.Errorf("coordinator: etcd client: %w", etcdauth.Refusal(err)))
	}
	cleanup.Push(func() { _ = cli.Close() })
	tokenFile := cfg.TokenFile
	if tokenFile == "" {
		tokenFile = "operator-tokens"
		if len(cfg.EtcdEndpoints) == 0 {
			tokenFile = cfg.DataDir + "/operator-tokens"
		}
	}
	tokens, err := operatortoken.LoadFile(tokenFile)
	if err != nil {
		return fail(err)
	}
	c.TokenFile = tokenFile
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	grpcLis, httpLis, err := daemon.Listen(cfg.GRPCAddr, cfg.HTTPAddr)
	if err != nil {
		return fail(fmt.Errorf("coordinator: %w", err))
	}
	cleanup.Push(func() { _ = grpcLis.Close(); _ = httpLis.Close() })
	c.GRPCAddr, c.HTTPAddr = grpcLis.Addr().String(), httpLis.Addr().String()
	rc := cfg.Rebalance
	rc.Client = cli
	if rc.Name == "" {
		rc.Name = c.GRPCAddr
	}
	rc.Logger = log.Named("rebalance")
	rc.Registerer = reg
	if rc.Clock == nil {
		rc.Clock = cfg.Clock
	}
	loop, err := rebalance.New(rc)
	if err != nil {
		return fail(err)
	}
	c.Loop = loop
	var opts []grpc.ServerOption
	if cfg.TLSCert != "" || cfg.TLSKey != "" {
		tc, err := serverTLS(cfg)
		if err != nil {
			return fail(err)
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(tc)))
	} else if cfg.ClientCA != "" {
		return fail(fmt.Errorf("%w: a client CA needs TLSCert and TLSKey", ErrConfig))
	}
	auth := newAuthorizer(tokens, cfg.WriteNames, log.Named("auth"))
	opts = append(opts, grpc.ChainUnaryInterceptor(auth.unary), grpc.ChainStreamInterceptor(auth.stream))
	gs := grpc.NewServer(opts...)
	op := &operator{cli: cli, layout: etcdlayout.Layout{Prefix: rc.Prefix}, loop: loop, clock: cfg.Clock, log: log.Named("operator"), auditMax: cfg.AuditMax}
	quotav1.RegisterOperatorServer(gs, op)
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(quotav1.Operator_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(gs, hs)
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		hctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if _, err := cli.Get(hctx, etcdlayout.Layout{Prefix: rc.Prefix}.Settings()); err != nil {
			// The endpoint is unauthenticated: the error (endpoints,
			// TLS details) goes to the log only.
			log.Warn("/healthz: etcd unreachable", "error", err)
			http.Error(w, "etcd unreachable", http.StatusServiceUnavailable)
			return
		}
		role := "follower"
		if loop.IsLeader() {
			role = "leader"
		}
		fmt.Fprintf(w, "ok %s\n", role)
	})
	servers := daemon.Servers{GRPC: gs, GRPCListener: grpcLis, HTTPListener: httpLis, Health: hs, Reflection: cfg.GRPCReflection,
		HTTP: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}, Drain: cfg.Drain, ShutdownTimeout: cfg.ShutdownTimeout,
		Announce: cfg.Announce, Logger: log}
	var wg sync.WaitGroup
	var mu sync.Mutex
	record := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if c.err == nil {
			c.err = err
		}
	}
	rctx, stopLoop := context.WithCancel(ctx)
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := loop.Run(rctx); err != nil {
			record(err)
		}
	}()
	go func() {
		defer wg.Done()
		if err := daemon.Serve(rctx, servers); err != nil {
			record(fmt.Errorf("coordinator: %w", err))
		}
		stopLoop() // a failed server stops the loop too
	}()
	log.Info("coordinator started", "grpc", c.GRPCAddr, "http", c.HTTPAddr, "etcd", endpoints, "token_file", tokenFile)
	go func() {
		wg.Wait()
		cleanup.Run()
		close(c.done)
	}()
	return c, nil
}

// Wait blocks until the coordinator stopped and returns the first error a
// server reported.
func (c *Coordinator) Wait() error {
	<-c.done
	return c.err
}

// Run is Start followed by Wait.
func Run(ctx context.Context, cfg Config) error {
	c, err := Start(ctx, cfg)
	if err != nil {
		return err
	}
	return c.Wait()
}

// EmbeddedEtcdAddrOrDefault returns the embedded etcd client address.
func (cfg Config) EmbeddedEtcdAddrOrDefault() string {
	if cfg.EmbeddedEtcdAddr == "" {
		return "127.0.0.1:2379"
	}
	return cfg.EmbeddedEtcdAddr
}

// etcdClientSettings returns the endpoints and the TLS of the
// coordinator's etcd client: cfg.EtcdEndpoints with cfg.EtcdTLS, or the
// embedded etcd's URL, https with its TLS flags, where the client trusts
// the embedded certificate itself unless EtcdTLS names a CA. It checks the
// embedded TLS flags (ErrConfig) without reading any file.
// embeddedAuthOn says whether the coordinator turns authentication on in
// its embedded etcd.
func (cfg Config) embeddedAuthOn() bool { return cfg.EmbeddedAuth || len(cfg.EmbeddedAuthRegions) > 0 }

func etcdClientSettings(cfg Config) ([]string, tlsconfig.Etcd, error) {
	embedded := cfg.EmbeddedTLSCert != "" || cfg.EmbeddedTLSKey != "" || cfg.EmbeddedClientCA != ""
	if cfg.embeddedAuthOn() {
		if len(cfg.EtcdEndpoints) > 0 || cfg.EtcdAuth != (etcdauth.Credentials{}) {
			return nil, cfg.EtcdTLS, fmt.Errorf("%w: -embedded-etcd-auth is for the embedded etcd, whose users the coordinator creates "+
				"(no -etcd, -etcd-username, -etcd-password-file)", ErrConfig)
		}
		for _, r := range cfg.EmbeddedAuthRegions {
			if !etcdlayout.ValidName(r) {
				return nil, cfg.EtcdTLS, fmt.Errorf("%w: -embedded-etcd-auth region %q, want [A-Za-z0-9_.-]{1,%d}", ErrConfig, r, etcdlayout.MaxNameLen)
			}
		}
	}
	if len(cfg.EtcdEndpoints) > 0 {
		if embedded {
			return nil, cfg.EtcdTLS, fmt.Errorf("%w: embedded etcd TLS settings with etcd endpoints (no embedded etcd runs)", ErrConfig)
		}
		return cfg.EtcdEndpoints, cfg.EtcdTLS, nil
	}
	if !embedded {
		if cfg.EtcdTLS.Enabled() {
			return nil, cfg.EtcdTLS, fmt.Errorf("%w: etcd client TLS for an embedded etcd that serves plain http: "+
				"give the embedded etcd a certificate (-embedded-etcd-tls-cert, -embedded-etcd-tls-key)", ErrConfig)
		}
		return []string{"http://" + cfg.EmbeddedEtcdAddrOrDefault()}, cfg.EtcdTLS, nil
	}
	if cfg.EmbeddedTLSCert == "" || cfg.EmbeddedTLSKey == "" {
		return nil, cfg.EtcdTLS, fmt.Errorf("%w: the embedded etcd's TLS needs a certificate and its key "+
			"(-embedded-etcd-tls-cert, -embedded-etcd-tls-key)", ErrConfig)
	}
	t := cfg.EtcdTLS
	if cfg.EmbeddedClientCA != "" && t.CertFile == "" {
		return nil, t, fmt.Errorf("%w: an embedded etcd requiring client certificates (-embedded-etcd-client-ca) "+
			"needs one for the coordinator's own client (-etcd-tls-cert, -etcd-tls-key)", ErrConfig)
	}
	if t.CAFile == "" {
		t.CAFile = cfg.EmbeddedTLSCert
	}
	return []string{"https://" + cfg.EmbeddedEtcdAddrOrDefault()}, t, nil
}

// The embedded etcd's limits (docs/scale.md, "etcd limits").
const (
	// EmbeddedMaxRequestBytes is etcd's default request limit, kept: every
	// record and transaction of the deployment stays within a quarter of
	// it (etcdlayout.MaxTxnBytes).
	EmbeddedMaxRequestBytes = 1536 * 1024
	// EmbeddedMaxTxnOps is etcd's default, kept (etcdlayout.MaxTxnOps).
	EmbeddedMaxTxnOps = etcdlayout.MaxTxnOps
	// EmbeddedQuotaBytes is the backend quota, etcd's suggested maximum:
	// 10,000 policies seen by 300 nodes keep about 1 GiB of demand shards
	// live, and the quota must also hold the history not yet compacted.
	EmbeddedQuotaBytes = 8 << 30
	// EmbeddedCompactionRetention is how much history the embedded etcd
	// keeps: it compacts every retention period to the revision of one
	// period before. Nodes whose allocation watch falls behind a
	// compaction read the allocations again; the leader reads everything
	// each round; nothing needs older history.
	EmbeddedCompactionRetention = 10 * time.Minute
)

// embeddedLimits sets the request limits, backend quota and periodic
// compaction of the embedded etcd.
func embeddedLimits(ec *embed.Config) {
	ec.MaxRequestBytes = EmbeddedMaxRequestBytes
	ec.MaxTxnOps = EmbeddedMaxTxnOps
	ec.QuotaBackendBytes = EmbeddedQuotaBytes
	ec.AutoCompactionMode = "periodic"
	ec.AutoCompactionRetention = EmbeddedCompactionRetention.String()
}

// embeddedLogFile is where the embedded etcd logs (errors only).
func embeddedLogFile(cfg Config) string { return filepath.Join(cfg.DataDir, "etcd.log") }

// startEmbedded starts the embedded etcd in DataDir/etcd, serving clients
// on EmbeddedEtcdAddr (https with EmbeddedTLSCert and EmbeddedTLSKey,
// client certificates from EmbeddedClientCA required) and logging its
// errors to DataDir/etcd.log, and waits until it is ready. The returned
// function stops it and closes the log.
func startEmbedded(cfg Config) (stop func(), err error) {
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("coordinator: data dir: %w", err)
	}
	ec := embed.NewConfig()
	ec.Dir = cfg.DataDir + "/etcd"
	ec.Logger = "zap"
	ec.LogLevel = "error"
	// Every password of the embedded etcd's users is drawn at random (256
	// bits), so bcrypt's work factor protects nothing and only slows each
	// sign-in, by tens of milliseconds per client at the default cost.
	ec.BcryptCost = uint(bcrypt.MinCost)
	scheme := "http"
	if cfg.EmbeddedTLSCert != "" {
		scheme = "https"
		ec.ClientTLSInfo = transport.TLSInfo{CertFile: cfg.EmbeddedTLSCert, KeyFile: cfg.EmbeddedTLSKey,
			TrustedCAFile: cfg.EmbeddedClientCA, ClientCertAuth: cfg.EmbeddedClientCA != ""}
	}
	cu, err := url.Parse(scheme + "://" + cfg.EmbeddedEtcdAddrOrDefault())
	if err != nil {
		return nil, fmt.Errorf("%w: embedded etcd address: %w", ErrConfig, err)
	}
	peer := cfg.EmbeddedPeerAddr
	if peer == "" {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("coordinator: pick a peer port: %w", err)
		}
		peer = l.Addr().String()
		_ = l.Close()
	}
	pu, err := url.Parse("http://" + peer)
	if err != nil {
		return nil, fmt.Errorf("%w: embedded peer address: %w", ErrConfig, err)
	}
	ec.ListenClientUrls = []url.URL{*cu}
	ec.AdvertiseClientUrls = []url.URL{*cu}
	ec.ListenPeerUrls = []url.URL{*pu}
	ec.AdvertisePeerUrls = []url.URL{*pu}
	ec.InitialCluster = ec.Name + "=" + pu.String()
	embeddedLimits(ec)
	logw, err := openEtcdLog(embeddedLogFile(cfg), maxEtcdLogBytes)
	if err != nil {
		return nil, err
	}
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(etcdLogger(logw))
	e, err := embed.StartEtcd(ec)
	if err != nil {
		_ = logw.Close()
		return nil, fmt.Errorf("coordinator: start embedded etcd: %w", err)
	}
	stop = func() {
		e.Close()
		<-e.Server.StopNotify()
		_ = logw.Close()
	}
	select {
	case <-e.Server.ReadyNotify():
		return stop, nil
	case <-time.After(60 * time.Second):
		stop()
		return nil, fmt.Errorf("coordinator: embedded etcd not ready after 60s (see %s)", embeddedLogFile(cfg))
	}
}

// serverTLS is the operator listener's TLS configuration: TLSCert and
// TLSKey, and with ClientCA optional client certificates verified against
// it (a verified certificate is a credential; no certificate means a token
// is needed). The files are reloaded when they change (internal/tlsconfig):
// a rotated certificate or CA is used by the next connection without a
// restart.
func serverTLS(cfg Config) (*tls.Config, error) {
	r, err := tlsconfig.New(tlsconfig.Config{CertFile: cfg.TLSCert, KeyFile: cfg.TLSKey, CAFile: cfg.ClientCA,
		Logger: cfg.Logger.Named("operator-tls")})
	switch {
	case errors.Is(err, tlsconfig.ErrConfig):
		return nil, fmt.Errorf("%w: operator TLS: %w", ErrConfig, err)
	case err != nil:
		return nil, fmt.Errorf("coordinator: operator TLS: %w", err)
	}
	base := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}}
	if cfg.ClientCA != "" {
		base.ClientAuth = tls.VerifyClientCertIfGiven
	}
	tc, err := r.ServerConfig(base)
	if err != nil {
		return nil, fmt.Errorf("coordinator: operator TLS: %w", err)
	}
	return tc, nil
}

// checkOperatorTransport refuses bearer tokens in plaintext off loopback:
// the operator API always accepts tokens, so without TLS it may listen on
// a loopback address only, unless InsecureOperatorPlaintext says the
// operator knows (a mesh that encrypts, a test network).
func checkOperatorTransport(cfg Config) error {
	if cfg.TLSCert != "" || cfg.InsecureOperatorPlaintext || operatortoken.LoopbackAddr(cfg.GRPCAddr) {
		return nil
	}
	return fmt.Errorf("%w: the operator API on %q would carry bearer tokens in plaintext on a non-loopback address: "+
		"give TLSCert and TLSKey (-tls-cert, -tls-key), listen on loopback, or set InsecureOperatorPlaintext (-insecure-operator-plaintext)",
		ErrConfig, cfg.GRPCAddr)
}
