package bucket

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// ErrRedisSpec reports a Redis address DialRedis cannot use.
var ErrRedisSpec = errors.New("bucket: invalid redis address")

// RedisConn is a Redis client opened by DialRedis: pass it as
// RedisConfig.Client, and Close it after the store that uses it. It is safe
// for concurrent use.
type RedisConn interface {
	RedisClient
	// Ping sends PING (PingRedis reads its reply).
	Ping(ctx context.Context) *redis.StatusCmd
	// Close closes every connection of the client.
	Close() error
}

// ErrRedisAuth reports Redis refusing the client's credentials: a wrong
// password or user name, a disabled user, a password Redis does not
// expect, or none where Redis requires one.
var ErrRedisAuth = errors.New("bucket: redis refused the credentials")

// PingRedis sends PING on c and reports how Redis took the client's
// credentials: nil when it answers, an error wrapping ErrRedisAuth when it
// refuses them (a configuration error: every later call would fail the
// same way), and the connection's own error otherwise (Redis unreachable
// or busy, which the failure modes handle).
func PingRedis(ctx context.Context, c RedisConn) error {
	err := c.Ping(ctx).Err()
	switch {
	case err == nil:
		return nil
	case redis.IsAuthError(err), redis.IsPermissionError(err), redis.HasErrorPrefix(err, "ERR AUTH"):
		return fmt.Errorf("%w: %w", ErrRedisAuth, err)
	}
	return fmt.Errorf("bucket: ping redis: %w", err)
}

// DialOptions configure DialRedis. The zero value keeps go-redis's defaults
// (or what a URL sets) for everything but retries.
type DialOptions struct {
	// TLS, when set, secures every connection, whatever the address form.
	// A rediss:// URL without it uses a config with the URL's host as the
	// server name.
	TLS *tls.Config
	// PoolSize is the most connections per Redis node; 0 keeps go-redis's
	// default (10 per CPU).
	PoolSize int
	// DialTimeout, ReadTimeout and WriteTimeout bound one dial, one read
	// and one write; 0 keeps the URL's value or go-redis's default (5 s,
	// 3 s, 3 s). Context deadlines are honoured as well.
	DialTimeout, ReadTimeout, WriteTimeout time.Duration
	// Username and Password authenticate every form of address (an ACL
	// user, or the default user when Username is empty). A URL may carry
	// them instead; a URL's user name or password given here as well is
	// ErrRedisSpec, so that a credential is never silently dropped.
	Username, Password string
	// SentinelMaster, when set, makes the address the comma-separated
	// host:port list of Redis Sentinels that monitor the primary of this
	// name (see DialRedis). TLS applies to the Sentinels and the data
	// nodes alike.
	SentinelMaster string
	// SentinelUsername and SentinelPassword authenticate to the Sentinels
	// (requirepass or an ACL user of sentinel.conf); Username and Password
	// authenticate to the data nodes. They need SentinelMaster.
	SentinelUsername, SentinelPassword string
}

// DialRedis returns a client for spec, which is one of:
//
//   - "host:port": one Redis server;
//   - "redis://[user:password@]host:port[/db][?options]" or "rediss://..."
//     (TLS): one Redis server, in go-redis's URL syntax;
//   - "host1:port1,host2:port2,...": seed nodes of a Redis Cluster (a
//     single seed is written with a trailing comma, "host:port,");
//   - with DialOptions.SentinelMaster, "host1:port1,host2:port2,...":
//     Redis Sentinels that monitor that primary.
//
// A Sentinel client asks a Sentinel for the primary's address at every
// dial and listens for its +switch-master announcements, closing the
// connections to the old primary when one arrives. A pooled connection
// that meets a READONLY reply (the primary was demoted to a replica and
// the announcement has not arrived, or a managed service's endpoint moved)
// is closed too, not reused; the command that met it fails like any other
// store failure (the policy's failure mode decides), and the next dial
// reaches the primary the Sentinels name.
//
// The client speaks RESP2 (unless a URL names a protocol): the scripts'
// integer replies read the same, and RESP2 spares a check for push
// notifications on every reply. It honours context deadlines (ContextTimeoutEnabled), never
// retries a command (a failure mode answers faster than a retry: the
// caller decides) and tries a dial once. DialRedis does not connect: the
// first command does, so an unreachable server shows as that command's
// error.
func DialRedis(spec string, opt DialOptions) (RedisConn, error) {
	if opt.PoolSize < 0 || opt.DialTimeout < 0 || opt.ReadTimeout < 0 || opt.WriteTimeout < 0 {
		return nil, fmt.Errorf("bucket: dial redis: negative PoolSize %d or timeout (%v, %v, %v)", opt.PoolSize, opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout)
	}
	spec = strings.TrimSpace(spec)
	switch {
	case spec == "":
		return nil, fmt.Errorf("%w: empty", ErrRedisSpec)
	case opt.SentinelMaster != "":
		return dialSentinel(spec, opt)
	case opt.SentinelUsername != "" || opt.SentinelPassword != "":
		return nil, fmt.Errorf("%w: Sentinel credentials without DialOptions.SentinelMaster", ErrRedisSpec)
	case strings.Contains(spec, "://"):
		if !strings.HasPrefix(spec, "redis://") && !strings.HasPrefix(spec, "rediss://") {
			return nil, fmt.Errorf("%w: %s: want a redis:// or rediss:// URL", ErrRedisSpec, redactSpec(spec))
		}
		o, err := redis.ParseURL(spec)
		if err != nil {
			var ue *url.Error
			if errors.As(err, &ue) {
				err = ue.Err // its text repeats the URL, password included
			}
			return nil, fmt.Errorf("%w: %s: %w", ErrRedisSpec, redactSpec(spec), err)
		}
		if err := mergeCredentials(o, opt); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrRedisSpec, redactSpec(spec), err)
		}
		o.ContextTimeoutEnabled, o.MaxRetries = true, -1
		if o.Protocol == 0 { // the URL names none
			o.Protocol = 2
		}
		o.MaintNotificationsConfig = noMaint()
		o.DialerRetries, o.DialerRetryTimeout = 1, time.Millisecond
		if opt.TLS != nil {
			o.TLSConfig = opt.TLS
		}
		setIf(&o.PoolSize, opt.PoolSize)
		setIf(&o.DialTimeout, opt.DialTimeout)
		setIf(&o.ReadTimeout, opt.ReadTimeout)
		setIf(&o.WriteTimeout, opt.WriteTimeout)
		return redis.NewClient(o), nil
	case strings.Contains(spec, ","):
		addrs, err := hostPorts(spec, "cluster")
		if err != nil {
			return nil, err
		}
		return redis.NewClusterClient(&redis.ClusterOptions{
			Addrs: addrs, Username: opt.Username, Password: opt.Password, TLSConfig: opt.TLS,
			ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1, DialerRetryTimeout: time.Millisecond,
			PoolSize: opt.PoolSize, DialTimeout: opt.DialTimeout, ReadTimeout: opt.ReadTimeout, WriteTimeout: opt.WriteTimeout,
			Protocol: 2, MaintNotificationsConfig: noMaint(),
		}), nil
	default:
		if err := checkHostPort(spec); err != nil {
			return nil, err
		}
		return redis.NewClient(&redis.Options{
			Addr: spec, Username: opt.Username, Password: opt.Password, TLSConfig: opt.TLS,
			ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1, DialerRetryTimeout: time.Millisecond,
			PoolSize: opt.PoolSize, DialTimeout: opt.DialTimeout, ReadTimeout: opt.ReadTimeout, WriteTimeout: opt.WriteTimeout,
			Protocol: 2, MaintNotificationsConfig: noMaint(),
		}), nil
	}
}

// dialSentinel returns a client of the primary that the Sentinels listed
// in spec name opt.SentinelMaster, with DialRedis's settings.
func dialSentinel(spec string, opt DialOptions) (RedisConn, error) {
	if strings.Contains(spec, "://") {
		return nil, fmt.Errorf("%w: %s: with a Sentinel master name, give the Sentinels as host:port,host:port", ErrRedisSpec, redactSpec(spec))
	}
	addrs, err := hostPorts(spec, "Sentinel")
	if err != nil {
		return nil, err
	}
	return redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName: opt.SentinelMaster, SentinelAddrs: addrs,
		SentinelUsername: opt.SentinelUsername, SentinelPassword: opt.SentinelPassword,
		Username: opt.Username, Password: opt.Password, TLSConfig: opt.TLS,
		ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1, DialerRetryTimeout: time.Millisecond,
		PoolSize: opt.PoolSize, DialTimeout: opt.DialTimeout, ReadTimeout: opt.ReadTimeout, WriteTimeout: opt.WriteTimeout,
		Protocol: 2,
	}), nil
}

// hostPorts splits a comma-separated list of host:port addresses (of
// what kind: "cluster", "Sentinel"), skipping empty entries.
func hostPorts(spec, kind string) ([]string, error) {
	var addrs []string
	for a := range strings.SplitSeq(spec, ",") {
		if a = strings.TrimSpace(a); a == "" {
			continue
		}
		if err := checkHostPort(a); err != nil {
			return nil, err
		}
		addrs = append(addrs, a)
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("%w: %q names no %s address", ErrRedisSpec, spec, kind)
	}
	return addrs, nil
}

// mergeCredentials fills the user name and password a URL left out from
// opt, and refuses one given twice.
func mergeCredentials(o *redis.Options, opt DialOptions) error {
	if opt.Username != "" {
		if o.Username != "" {
			return errors.New("the URL names a user and DialOptions.Username another")
		}
		o.Username = opt.Username
	}
	if opt.Password != "" {
		if o.Password != "" {
			return errors.New("the URL carries a password and DialOptions.Password another")
		}
		o.Password = opt.Password
	}
	return nil
}

// noMaint turns go-redis's maintenance notifications off: they need RESP3
// push messages, and peeking for a push before every reply costs about a
// tenth of the CPU of a script call.
func noMaint() *maintnotifications.Config {
	return &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
}

func setIf[T comparable](dst *T, v T) {
	var zero T
	if v != zero {
		*dst = v
	}
}

// checkHostPort accepts "host:port" and "[v6]:port" with a port 1-65535.
func checkHostPort(a string) error {
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return fmt.Errorf("%w: %q: %w", ErrRedisSpec, a, err)
	}
	if host == "" {
		return fmt.Errorf("%w: %q has no host", ErrRedisSpec, a)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return fmt.Errorf("%w: %q: bad port %q", ErrRedisSpec, a, port)
	}
	return nil
}

// redactSpec hides the credentials of a URL for error messages.
func redactSpec(s string) string {
	if i := strings.LastIndex(s, "@"); i >= 0 {
		if j := strings.Index(s, "://"); j >= 0 && j < i {
			return s[:j+3] + "***" + s[i:]
		}
	}
	return s
}
