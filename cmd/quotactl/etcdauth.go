package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/quotacoord/quota/internal/etcdauth"
	"github.com/quotacoord/quota/internal/etcdlayout"
	"github.com/quotacoord/quota/internal/tlsconfig"
)

// etcdOptions are the flags of "etcd-auth": how to reach etcd as its
// administrator (root once authentication is on).
type etcdOptions struct {
	endpoints, user, passwordFile, prefix string
	tls                                   tlsconfig.Etcd
}

// newEtcdAuthCmd is "etcd-auth enable|coordinator|node|region": the etcd users
// and roles of a deployment (see internal/etcdauth), created directly in
// etcd, not through the coordinator.
func newEtcdAuthCmd(o *options) *cobra.Command {
	var e etcdOptions
	cmd := &cobra.Command{Use: "etcd-auth", Short: "Create the etcd users and roles of the coordinator and the nodes, and turn authentication on"}
	f := cmd.PersistentFlags()
	f.StringVar(&e.endpoints, "etcd", "127.0.0.1:2379", "comma-separated etcd endpoints")
	f.StringVar(&e.user, "etcd-user", "", "etcd user to act as (root once authentication is on); empty = none")
	f.StringVar(&e.passwordFile, "etcd-password-file", "", "file holding the password of --etcd-user")
	f.StringVar(&e.prefix, "prefix", etcdlayout.DefaultPrefix, "the deployment's etcd key prefix")
	f.StringVar(&e.tls.CAFile, "etcd-tls-ca", "", "PEM CA bundle: connect to etcd over TLS and verify its certificates")
	f.StringVar(&e.tls.CertFile, "etcd-tls-cert", "", "PEM client certificate for etcd (with --etcd-tls-key)")
	f.StringVar(&e.tls.KeyFile, "etcd-tls-key", "", "PEM private key of --etcd-tls-cert")
	var passwordFile string
	withPassword := func(c *cobra.Command, what string) *cobra.Command {
		c.Flags().StringVar(&passwordFile, "password-file", "", "file holding the password of "+what+" (required)")
		return c
	}
	run := func(fn func(ctx context.Context, cli *clientv3.Client, l etcdlayout.Layout, password string, args []string) error) func(*cobra.Command, []string) error {
		return func(c *cobra.Command, args []string) error {
			password, err := readSecret(passwordFile, "--password-file")
			if err != nil {
				return err
			}
			cli, err := e.dial()
			if err != nil {
				return err
			}
			defer cli.Close()
			ctx, cancel := context.WithTimeout(c.Context(), o.timeout)
			defer cancel()
			if err := fn(ctx, cli, etcdlayout.Layout{Prefix: e.prefix}, password, args); err != nil {
				return err
			}
			fmt.Fprintln(o.stdout, "ok")
			return nil
		}
	}
	cmd.AddCommand(
		withPassword(&cobra.Command{Use: "enable", Short: "Create the root user and turn etcd authentication on", Args: cobra.NoArgs,
			RunE: run(func(ctx context.Context, cli *clientv3.Client, _ etcdlayout.Layout, pw string, _ []string) error {
				return etcdauth.EnableAuth(ctx, cli, pw)
			})}, "root"),
		withPassword(&cobra.Command{Use: "coordinator USER", Short: "Create the coordinator's role and user (read and write the prefix)", Args: cobra.ExactArgs(1),
			RunE: run(func(ctx context.Context, cli *clientv3.Client, l etcdlayout.Layout, pw string, a []string) error {
				return etcdauth.Ensure(ctx, cli, etcdauth.CoordinatorRole(l), a[0], pw)
			})}, "USER"),
		withPassword(&cobra.Command{Use: "node REGION NODE", Short: "Create one node's role and user (its own registration, demand and ack keys; reads allocations, policies, settings)", Args: cobra.ExactArgs(2),
			RunE: run(func(ctx context.Context, cli *clientv3.Client, l etcdlayout.Layout, pw string, a []string) error {
				role, err := etcdauth.NodeRole(l, a[0], a[1])
				if err != nil {
					return err
				}
				if err := etcdauth.Ensure(ctx, cli, role, etcdauth.NodeUser(a[0], a[1]), pw); err != nil {
					return err
				}
				fmt.Fprintf(o.stdout, "user %s\n", etcdauth.NodeUser(a[0], a[1]))
				return nil
			})}, "the node's user"),
		withPassword(&cobra.Command{Use: "region REGION", Short: "Create the role and user shared by one region's nodes (any node's registration, demand and ack keys of that region; reads allocations, policies, settings)", Args: cobra.ExactArgs(1),
			RunE: run(func(ctx context.Context, cli *clientv3.Client, l etcdlayout.Layout, pw string, a []string) error {
				role, err := etcdauth.RegionRole(l, a[0])
				if err != nil {
					return err
				}
				if err := etcdauth.Ensure(ctx, cli, role, etcdauth.RegionUser(a[0]), pw); err != nil {
					return err
				}
				fmt.Fprintf(o.stdout, "user %s\n", etcdauth.RegionUser(a[0]))
				return nil
			})}, "the region's user"),
	)
	return cmd
}

// dial connects to etcd as e says.
func (e *etcdOptions) dial() (*clientv3.Client, error) {
	cfg := clientv3.Config{Endpoints: strings.Split(e.endpoints, ","), DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
	if e.user != "" {
		pw, err := readSecret(e.passwordFile, "--etcd-password-file")
		if err != nil {
			return nil, err
		}
		cfg.Username, cfg.Password = e.user, pw
	}
	if e.tls != (tlsconfig.Etcd{}) {
		if err := e.tls.Apply(&cfg); err != nil {
			return nil, err
		}
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcd %s: %w", e.endpoints, err)
	}
	return cli, nil
}

// maxSecret bounds a password file.
const maxSecret = 4096

// readSecret reads a password from path (flag names it in errors), trimmed
// of surrounding white space; it must not be empty.
func readSecret(path, flag string) (string, error) {
	if path == "" {
		return "", fmt.Errorf("%s is required", flag)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", flag, err)
	}
	if len(b) > maxSecret {
		return "", fmt.Errorf("%s: %s is longer than %d bytes", flag, path, maxSecret)
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "", fmt.Errorf("%s: %s is empty", flag, path)
	}
	return s, nil
}
