package regional

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/tlsconfig"
	quotav1 "github.com/quotacoord/quota/proto/quota/v1"
)

// Register adds the node's services to s: the own Admission API and
// Envoy's RateLimitService.
func (n *Node) Register(s grpc.ServiceRegistrar) {
	quotav1.RegisterAdmissionServer(s, &admission{n: n})
	rlsv3.RegisterRateLimitServiceServer(s, &rls{n: n})
}

// openRedis dials the store's Redis (redisClient) with c's TLS and
// credentials and PINGs it: Redis refusing the credentials is an error,
// Redis not answering is logged (the failure modes decide until it does).
func openRedis(ctx context.Context, c DaemonConfig, tc *tls.Config, log hclog.Logger) (bucket.RedisConn, error) {
	password, err := secret(c.RedisPassword, c.RedisPasswordFile, "-redis-password-file")
	if err != nil {
		return nil, err
	}
	sentinelPassword, err := secret(c.RedisSentinelPassword, c.RedisSentinelPasswordFile, "-redis-sentinel-password-file")
	if err != nil {
		return nil, err
	}
	rc, err := redisClient(c.Redis, c.StoreTimeout, bucket.DialOptions{TLS: tc, Username: c.RedisUsername, Password: password,
		SentinelMaster: c.RedisSentinelMaster, SentinelUsername: c.RedisSentinelUsername, SentinelPassword: sentinelPassword})
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, max(10*c.StoreTimeout, time.Second))
	defer cancel()
	switch err := bucket.PingRedis(pctx, rc); {
	case errors.Is(err, bucket.ErrRedisAuth):
		_ = rc.Close()
		hint := "-redis-username, -redis-password-file, QUOTA_REDIS_PASSWORD"
		if c.RedisSentinelMaster != "" {
			hint += "; for the Sentinels -redis-sentinel-username, -redis-sentinel-password-file, QUOTA_REDIS_SENTINEL_PASSWORD"
		}
		return nil, fmt.Errorf("regional: -redis %s: %w (see %s)", redactURL(c.Redis), err, hint)
	case err != nil:
		log.Warn("redis does not answer yet; the policies' failure modes decide", "error", err)
	}
	return rc, nil
}

// secret is value, or the first line of file (named by flag in errors)
// when file is set; an empty file is an error.
func secret(value, file, flag string) (string, error) {
	if file == "" {
		return value, nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("regional: %s: %w", flag, err)
	}
	if value = strings.TrimRight(string(b), "\r\n"); value == "" {
		return "", fmt.Errorf("regional: %s %s is empty", flag, file)
	}
	return value, nil
}

// redisClient dials spec with opt's TLS and credentials. The client
// honours context deadlines (the store time budget) and never retries:
// the failure mode is faster than a retry. Its own timeouts are a
// backstop at ten times the budget, at least 100 ms.
func redisClient(spec string, budget time.Duration, opt bucket.DialOptions) (bucket.RedisConn, error) {
	timeout := max(10*budget, 100*time.Millisecond)
	opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout = timeout, timeout, timeout
	rc, err := bucket.DialRedis(spec, opt)
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

// serverTLS is the gRPC listener's TLS configuration: TLSCert and TLSKey,
// and with TLSClientCA mutual TLS. The files are reloaded when
// they change (internal/tlsconfig), so a rotated certificate or CA is used
// by the next connection without a restart.
func serverTLS(c DaemonConfig, log hclog.Logger) (*tls.Config, error) {
	r, err := tlsconfig.New(tlsconfig.Config{CertFile: c.TLSCert, KeyFile: c.TLSKey, CAFile: c.TLSClientCA,
		Logger: log.Named("grpc-tls")})
	if err != nil {
		return nil, fmt.Errorf("regional: gRPC TLS: %w", err)
	}
	base := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}}
	if c.TLSClientCA != "" {
		base.ClientAuth = tls.RequireAndVerifyClientCert
	}
	tc, err := r.ServerConfig(base)
	if err != nil {
		return nil, fmt.Errorf("regional: gRPC TLS: %w", err)
	}
	return tc, nil
}

// redisTLS is the Redis client's TLS configuration from c.RedisTLS (nil
// without it: a rediss:// URL then uses the system roots). The CA and the
// client certificate are reloaded when their files change. The server
// name defaults to the host of c.Redis (the first cluster seed).
func redisTLS(c DaemonConfig, log hclog.Logger) (*tls.Config, error) {
	t := c.RedisTLS
	if t.CAFile == "" && t.CertFile == "" {
		if t.ServerName != "" {
			return &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}, nil
		}
		return nil, nil
	}
	r, err := tlsconfig.New(tlsconfig.Config{CertFile: t.CertFile, KeyFile: t.KeyFile, CAFile: t.CAFile,
		Logger: log.Named("redis-tls")})
	if err != nil {
		return nil, fmt.Errorf("regional: Redis TLS: %w", err)
	}
	name := t.ServerName
	if name == "" {
		name = redisHost(c.Redis)
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
