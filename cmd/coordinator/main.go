// Command coordinator runs a quota coordinator: with -etcd it joins an
// etcd cluster, without it starts an embedded etcd in -data-dir that
// regional nodes can join on -embedded-etcd-addr (https with
// -embedded-etcd-tls-cert and -embedded-etcd-tls-key, client certificates
// required with -embedded-etcd-client-ca; its log goes to
// DATA_DIR/etcd.log). The embedded etcd requires authentication unless
// -embedded-etcd-no-auth: the coordinator makes the users, and the users
// of the regions named by -embedded-etcd-auth, with passwords in
// DATA_DIR/etcd-auth. The -etcd-tls-* flags configure the coordinator's
// own etcd client. It serves the operator API on -grpc-addr and /metrics
// and /healthz on -http-addr.
//
// Settings, logging and shutdown follow internal/daemon, as for
// cmd/regional: QUOTA_<FLAG> environment variables set flag defaults (a
// flag wins), logs go to stderr (-log-level, -json-logs), SIGINT or SIGTERM
// stop it gracefully within -shutdown-timeout.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/quotacoord/quota/allocator"
	"github.com/quotacoord/quota/internal/coordinator"
	"github.com/quotacoord/quota/internal/daemon"
	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/rebalance"
)

func main() { daemon.Main("coordinator", run) }

// run parses args and env into a coordinator.Config and runs it until ctx
// ends, logging to stderr.
func run(ctx context.Context, args, env []string, stderr io.Writer) error {
	cfg, err := parse(args, env, stderr)
	if err != nil {
		return err
	}
	return coordinator.Run(ctx, cfg)
}

// parse reads the coordinator's flags from args, their defaults from the
// QUOTA_* variables of env (daemon.Parse).
func parse(args, env []string, stderr io.Writer) (coordinator.Config, error) {
	fs := flag.NewFlagSet("coordinator", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		cfg                      coordinator.Config
		etcd, writeNames, prefix string
		embeddedAuth             string
		embeddedNoAuth           bool
		algorithm, protocol      string
		name                     string
		logs                     daemon.LogFlags
		interval, report, skew   time.Duration
		ackDeadline              time.Duration
		leaseTTL, sessionTTL     time.Duration
		maxStep, deadBand, alpha float64
		maxOverrides             int
	)
	fs.StringVar(&etcd, "etcd", "", "comma-separated etcd endpoints; empty starts an embedded etcd")
	fs.StringVar(&cfg.DataDir, "data-dir", "coordinator-data", "embedded etcd data and default token file")
	fs.StringVar(&cfg.EmbeddedEtcdAddr, "embedded-etcd-addr", "127.0.0.1:2379", "client address of the embedded etcd")
	fs.StringVar(&cfg.GRPCAddr, "grpc-addr", "127.0.0.1:8091", "operator gRPC API address (off loopback it needs -tls-cert/-tls-key or -insecure-operator-plaintext)")
	fs.StringVar(&cfg.HTTPAddr, "http-addr", coordinator.DefaultHTTPAddr, "/metrics and /healthz address; loopback unless given, e.g. :8090")
	fs.BoolVar(&cfg.GRPCReflection, "grpc-reflection", false, "serve gRPC reflection on -grpc-addr (lists every service to anyone who reaches it)")
	fs.StringVar(&cfg.TokenFile, "operator-token-file", "", "operator tokens, one read:TOKEN or write:TOKEN per line; created with a random write token when absent (default DATA_DIR/operator-tokens)")
	fs.StringVar(&cfg.TLSCert, "tls-cert", "", "operator API TLS certificate")
	fs.StringVar(&cfg.TLSKey, "tls-key", "", "operator API TLS key")
	fs.StringVar(&cfg.ClientCA, "tls-client-ca", "", "CA of operator client certificates (mTLS); a verified certificate may read")
	fs.BoolVar(&cfg.InsecureOperatorPlaintext, "insecure-operator-plaintext", false, "allow the operator API without TLS on a non-loopback -grpc-addr (bearer tokens in plaintext)")
	fs.StringVar(&writeNames, "tls-write-names", "", "comma-separated client certificate common names that may write (* for all)")
	fs.StringVar(&cfg.EtcdTLS.CAFile, "etcd-tls-ca", "", "PEM CA bundle etcd's certificates are verified against (https; reloaded on change); with the embedded etcd default -embedded-etcd-tls-cert itself")
	fs.StringVar(&cfg.EtcdTLS.CertFile, "etcd-tls-cert", "", "PEM client certificate presented to etcd (with -etcd-tls-key; mutual TLS, reloaded on change)")
	fs.StringVar(&cfg.EtcdTLS.KeyFile, "etcd-tls-key", "", "PEM private key of -etcd-tls-cert")
	fs.StringVar(&cfg.EtcdAuth.Username, "etcd-username", "", "etcd user to authenticate as with -etcd (with -etcd-password-file or QUOTA_ETCD_PASSWORD); empty = none, or the -etcd-tls-cert common name")
	fs.StringVar(&cfg.EtcdAuth.PasswordFile, "etcd-password-file", "", "file holding the etcd password (one line); or set QUOTA_ETCD_PASSWORD, never a flag")
	fs.StringVar(&embeddedAuth, "embedded-etcd-auth", "", "comma-separated regions whose nodes get an embedded etcd user, shared by the region's nodes (quota-region/REGION, password in DATA_DIR/etcd-auth/region-REGION.password)")
	fs.BoolVar(&embeddedNoAuth, "embedded-etcd-no-auth", false, "run the embedded etcd without authentication (anyone who reaches it can rewrite allocations, policies and controls); by default it requires the users the coordinator makes, with passwords in DATA_DIR/etcd-auth")
	fs.StringVar(&cfg.EtcdTLS.ServerName, "etcd-tls-server-name", "", "name every etcd certificate must carry; default each endpoint's host")
	fs.StringVar(&cfg.EmbeddedTLSCert, "embedded-etcd-tls-cert", "", "PEM certificate: the embedded etcd serves its clients over TLS (https)")
	fs.StringVar(&cfg.EmbeddedTLSKey, "embedded-etcd-tls-key", "", "PEM private key of -embedded-etcd-tls-cert")
	fs.StringVar(&cfg.EmbeddedClientCA, "embedded-etcd-client-ca", "", "PEM CA bundle: the embedded etcd requires client certificates from it (the coordinator's own client then needs -etcd-tls-cert/-etcd-tls-key)")
	fs.StringVar(&prefix, "etcd-prefix", etcdlayout.DefaultPrefix, "prefix of every etcd key")
	fs.StringVar(&name, "name", "", "identity in the leader election (default the gRPC address)")
	fs.DurationVar(&interval, "rebalance-interval", 5*time.Second, "time between rebalance rounds")
	fs.DurationVar(&report, "report-interval", 0, "demand report interval published to regions (default the rebalance interval)")
	fs.DurationVar(&leaseTTL, "region-lease-ttl", 10*time.Second, "lease TTL published to regions")
	fs.DurationVar(&skew, "lease-skew-margin", 2*time.Second, "wait after a region's lease expired before giving its share away")
	fs.DurationVar(&ackDeadline, "ack-deadline", 0, "longest wait for a node's acknowledgement of a shrink before counting it at its safe share (a node whose allocation watch is silent that long falls back by itself); 0 = 3 region lease TTLs")
	fs.DurationVar(&sessionTTL, "election-ttl", 5*time.Second, "TTL of the leader's election session")
	fs.StringVar(&algorithm, "algorithm", string(allocator.MaxMinFair), "static, proportional or maxmin")
	fs.Float64Var(&maxStep, "max-step", 0.3, "largest change of a share per round (0 = unlimited)")
	fs.Float64Var(&deadBand, "dead-band", 0.01, "ignore share moves smaller than this")
	fs.Float64Var(&alpha, "smoothing", 0.5, "demand smoothing factor in (0, 1]")
	fs.IntVar(&maxOverrides, "max-overrides", 64, "subject overrides per policy")
	fs.StringVar(&protocol, "protocol", string(rebalance.ProtocolTwoStep), "two-step or naive (unsafe, for comparison)")
	fs.DurationVar(&cfg.Drain, "drain", 0, "on SIGTERM, how long to keep serving with gRPC health NOT_SERVING before the graceful stop")
	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", daemon.DefaultShutdownTimeout, "how long a graceful shutdown may take")
	logs.Register(fs)
	if err := daemon.Parse(fs, args, env); err != nil {
		return cfg, err
	}
	cfg.EtcdEndpoints = daemon.SplitList(etcd)
	cfg.EmbeddedAuthRegions = daemon.SplitList(embeddedAuth)
	if embeddedNoAuth && len(cfg.EmbeddedAuthRegions) > 0 {
		return cfg, fmt.Errorf("-embedded-etcd-no-auth with -embedded-etcd-auth: region users need authentication on")
	}
	cfg.EmbeddedAuth = len(cfg.EtcdEndpoints) == 0 && !embeddedNoAuth
	cfg.EtcdAuth.Password = daemon.Secret(env, "etcd-password")
	cfg.WriteNames = daemon.SplitList(writeNames)
	var err error
	if cfg.Logger, err = logs.Logger("coordinator", stderr); err != nil {
		return cfg, err
	}
	cfg.Announce = stderr
	cfg.EtcdTLS.Logger = cfg.Logger.Named("etcd-tls")
	cfg.Rebalance = rebalance.Config{
		Prefix: prefix, Name: name,
		Interval: interval, ReportInterval: report, RegionLeaseTTL: leaseTTL, SkewMargin: skew, SessionTTL: sessionTTL, AckDeadline: ackDeadline,
		Algorithm: allocator.Algorithm(algorithm), MaxStep: maxStep, DeadBand: deadBand, Alpha: alpha,
		Protocol: rebalance.Protocol(protocol), MaxOverrides: maxOverrides,
	}
	return cfg, nil
}
