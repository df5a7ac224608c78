// Command coordinator runs a quota coordinator: with -etcd it joins an
// etcd cluster, without it starts an embedded etcd in -data-dir that
// regional nodes can join on -embedded-etcd-addr (https with
// -embedded-etcd-tls-cert and -embedded-etcd-tls-key, client certificates
// required with -embedded-etcd-client-ca; its log goes to
// DATA_DIR/etcd.log). The -etcd-tls-* flags configure the coordinator's
// own etcd client. It serves the operator API on -grpc-addr and /metrics
// and /healthz on -http-addr.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/quotacoord/quota/allocator"
	"github.com/quotacoord/quota/internal/coordinator"
	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/rebalance"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stderr)
	stop()
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "coordinator:", err)
		os.Exit(1)
	}
}

// run parses args into a coordinator.Config and runs it until ctx ends.
func run(ctx context.Context, args []string, stderr io.Writer) error {
	cfg, err := parse(args, stderr)
	if err != nil {
		return err
	}
	return coordinator.Run(ctx, cfg)
}

func parse(args []string, stderr io.Writer) (coordinator.Config, error) {
	fs := flag.NewFlagSet("coordinator", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		cfg                      coordinator.Config
		etcd, writeNames, prefix string
		algorithm, protocol      string
		logLevel, name           string
		interval, report, skew   time.Duration
		leaseTTL, sessionTTL     time.Duration
		maxStep, deadBand, alpha float64
		maxOverrides             int
	)
	fs.StringVar(&etcd, "etcd", "", "comma-separated etcd endpoints; empty starts an embedded etcd")
	fs.StringVar(&cfg.DataDir, "data-dir", "coordinator-data", "embedded etcd data and default token file")
	fs.StringVar(&cfg.EmbeddedEtcdAddr, "embedded-etcd-addr", "127.0.0.1:2379", "client address of the embedded etcd")
	fs.StringVar(&cfg.GRPCAddr, "grpc-addr", "127.0.0.1:8091", "operator gRPC API address (off loopback it needs -tls-cert/-tls-key or -insecure-operator-plaintext)")
	fs.StringVar(&cfg.HTTPAddr, "http-addr", ":8090", "/metrics and /healthz address")
	fs.StringVar(&cfg.TokenFile, "operator-token-file", "", "operator tokens, one read:TOKEN or write:TOKEN per line; created with a random write token when absent (default DATA_DIR/operator-tokens)")
	fs.StringVar(&cfg.TLSCert, "tls-cert", "", "operator API TLS certificate")
	fs.StringVar(&cfg.TLSKey, "tls-key", "", "operator API TLS key")
	fs.StringVar(&cfg.ClientCA, "tls-client-ca", "", "CA of operator client certificates (mTLS); a verified certificate may read")
	fs.BoolVar(&cfg.InsecureOperatorPlaintext, "insecure-operator-plaintext", false, "allow the operator API without TLS on a non-loopback -grpc-addr (bearer tokens in plaintext)")
	fs.StringVar(&writeNames, "tls-write-names", "", "comma-separated client certificate common names that may write (* for all)")
	fs.StringVar(&cfg.EtcdTLS.CAFile, "etcd-tls-ca", "", "PEM CA bundle etcd's certificates are verified against (https; reloaded on change); with the embedded etcd default -embedded-etcd-tls-cert itself")
	fs.StringVar(&cfg.EtcdTLS.CertFile, "etcd-tls-cert", "", "PEM client certificate presented to etcd (with -etcd-tls-key; mutual TLS, reloaded on change)")
	fs.StringVar(&cfg.EtcdTLS.KeyFile, "etcd-tls-key", "", "PEM private key of -etcd-tls-cert")
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
	fs.DurationVar(&sessionTTL, "election-ttl", 5*time.Second, "TTL of the leader's election session")
	fs.StringVar(&algorithm, "algorithm", string(allocator.MaxMinFair), "static, proportional or maxmin")
	fs.Float64Var(&maxStep, "max-step", 0.3, "largest change of a share per round")
	fs.Float64Var(&deadBand, "dead-band", 0.01, "ignore share moves smaller than this")
	fs.Float64Var(&alpha, "smoothing", 0.5, "demand smoothing factor in (0, 1]")
	fs.IntVar(&maxOverrides, "max-overrides", 64, "subject overrides per policy")
	fs.StringVar(&protocol, "protocol", string(rebalance.ProtocolTwoStep), "two-step or naive (unsafe, for comparison)")
	fs.StringVar(&logLevel, "log-level", "info", "trace, debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %v", fs.Args())
	}
	if etcd != "" {
		for _, e := range strings.Split(etcd, ",") {
			if e = strings.TrimSpace(e); e != "" {
				cfg.EtcdEndpoints = append(cfg.EtcdEndpoints, e)
			}
		}
	}
	if writeNames != "" {
		cfg.WriteNames = strings.Split(writeNames, ",")
	}
	lvl := hclog.LevelFromString(logLevel)
	if lvl == hclog.NoLevel {
		return cfg, fmt.Errorf("-log-level %q: want trace, debug, info, warn or error", logLevel)
	}
	cfg.Logger = hclog.New(&hclog.LoggerOptions{Name: "coordinator", Level: lvl, Output: stderr})
	cfg.EtcdTLS.Logger = cfg.Logger.Named("etcd-tls")
	cfg.Rebalance = rebalance.Config{
		Prefix: prefix, Name: name,
		Interval: interval, ReportInterval: report, RegionLeaseTTL: leaseTTL, SkewMargin: skew, SessionTTL: sessionTTL,
		Algorithm: allocator.Algorithm(algorithm), MaxStep: maxStep, DeadBand: deadBand, Alpha: alpha,
		Protocol: rebalance.Protocol(protocol), MaxOverrides: maxOverrides,
	}
	return cfg, nil
}
