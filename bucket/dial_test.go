package bucket_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotacoord/quota/bucket"
	"github.com/quotacoord/quota/internal/redistest"
)

func TestDialRedisRejects(t *testing.T) {
	for _, tc := range []struct {
		spec string
		opt  bucket.DialOptions
	}{
		{"", bucket.DialOptions{}},
		{"   ", bucket.DialOptions{}},
		{"localhost", bucket.DialOptions{}},
		{":6379", bucket.DialOptions{}},
		{"localhost:0", bucket.DialOptions{}},
		{"localhost:99999", bucket.DialOptions{}},
		{"localhost:port", bucket.DialOptions{}},
		{"http://localhost:6379", bucket.DialOptions{}},
		{"redis://user:s3cret@localhost:notaport/0", bucket.DialOptions{}},
		{"redis://localhost:6379/notadb", bucket.DialOptions{}},
		{",,", bucket.DialOptions{}},
		{"a:1,b", bucket.DialOptions{}},
		{"localhost:6379", bucket.DialOptions{PoolSize: -1}},
		{"localhost:6379", bucket.DialOptions{ReadTimeout: -time.Second}},
		{"redis://localhost:26379", bucket.DialOptions{SentinelMaster: "primary"}},
		{",", bucket.DialOptions{SentinelMaster: "primary"}},
		{"localhost:26379,sentinel", bucket.DialOptions{SentinelMaster: "primary"}},
		{"localhost:6379", bucket.DialOptions{SentinelPassword: "s3cret"}},
	} {
		t.Run(tc.spec, func(t *testing.T) {
			c, err := bucket.DialRedis(tc.spec, tc.opt)
			if err == nil {
				_ = c.Close()
				t.Fatalf("DialRedis(%q) accepted it", tc.spec)
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Fatalf("error shows the password: %v", err)
			}
			if (tc.opt.PoolSize >= 0 && tc.opt.ReadTimeout >= 0) && !errors.Is(err, bucket.ErrRedisSpec) {
				t.Fatalf("error %v, want ErrRedisSpec", err)
			}
		})
	}
}

// TestDialRedisOptions checks the settings DialRedis gives each form
// (MaxRetries -1, "never retry", may read 0 once go-redis built the client).
func TestDialRedisOptions(t *testing.T) {
	own := &tls.Config{ServerName: "redis.internal", MinVersion: tls.VersionTLS12}
	opt := bucket.DialOptions{PoolSize: 3, DialTimeout: time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 3 * time.Second}
	for _, tc := range []struct {
		spec      string
		opt       bucket.DialOptions
		addr      string
		tlsServer string // "" means no TLS
		user      string
	}{
		{"127.0.0.1:6379", opt, "127.0.0.1:6379", "", ""},
		{"[::1]:6380", bucket.DialOptions{Password: "p"}, "[::1]:6380", "", ""},
		{"redis://alice:pw@10.0.0.1:6379/2", opt, "10.0.0.1:6379", "", "alice"},
		{"rediss://cache.example:6380", opt, "cache.example:6380", "cache.example", ""},
		{"redis://10.0.0.1:6379", bucket.DialOptions{TLS: own, Username: "bob"}, "10.0.0.1:6379", "redis.internal", "bob"},
	} {
		t.Run(tc.spec, func(t *testing.T) {
			c, err := bucket.DialRedis(tc.spec, tc.opt)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			rc, ok := c.(*redis.Client)
			if !ok {
				t.Fatalf("DialRedis(%q) gave %T, want one server's client", tc.spec, c)
			}
			o := rc.Options()
			if o.Addr != tc.addr || !o.ContextTimeoutEnabled || o.MaxRetries > 0 || o.DialerRetries != 1 || o.Username != tc.user {
				t.Fatalf("options: addr %q, context timeouts %v, retries %d, dial retries %d, user %q",
					o.Addr, o.ContextTimeoutEnabled, o.MaxRetries, o.DialerRetries, o.Username)
			}
			if tc.opt.PoolSize != 0 && (o.PoolSize != tc.opt.PoolSize || o.DialTimeout != tc.opt.DialTimeout ||
				o.ReadTimeout != tc.opt.ReadTimeout || o.WriteTimeout != tc.opt.WriteTimeout) {
				t.Fatalf("pool %d, timeouts %v %v %v; want %+v", o.PoolSize, o.DialTimeout, o.ReadTimeout, o.WriteTimeout, tc.opt)
			}
			switch {
			case tc.tlsServer == "" && o.TLSConfig != nil:
				t.Fatal("TLS set for a plain address")
			case tc.tlsServer != "" && (o.TLSConfig == nil || o.TLSConfig.ServerName != tc.tlsServer):
				t.Fatalf("TLS config %+v, want server name %q", o.TLSConfig, tc.tlsServer)
			}
		})
	}
	c, err := bucket.DialRedis("10.0.0.1:7000, 10.0.0.2:7000,", bucket.DialOptions{TLS: own, PoolSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cc, ok := c.(*redis.ClusterClient)
	if !ok {
		t.Fatalf("cluster addresses gave %T", c)
	}
	o := cc.Options()
	if len(o.Addrs) != 2 || o.Addrs[1] != "10.0.0.2:7000" || o.TLSConfig != own || o.PoolSize != 4 || o.MaxRetries > 0 || !o.ContextTimeoutEnabled {
		t.Fatalf("cluster options %+v", o)
	}
}

// TestDialRedisTakes runs a store on clients dialed by address and by URL.
func TestDialRedisTakes(t *testing.T) {
	addr := redistest.Addr(t)
	for _, spec := range []string{addr, "redis://" + addr + "/0"} {
		t.Run(spec, func(t *testing.T) {
			c, err := bucket.DialRedis(spec, bucket.DialOptions{PoolSize: 2, ReadTimeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			r := newRedis(t, c)
			k, _ := bucket.NewKey("dial", 1, redistest.Unique(t))
			req := bucket.Request{Key: k, Limits: bucket.Limits{Capacity: 2, IdleTTL: time.Minute}, Share: 1, Cost: 1}
			for i, want := range []bool{true, true, false} {
				d, err := r.Take(context.Background(), req)
				if err != nil || d.Allowed != want {
					t.Fatalf("take %d: %+v, %v; want allowed=%v", i, d, err, want)
				}
			}
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestDialRedisAuth: every address form authenticates with the default
// user's password or an ACL user, given in DialOptions (or, for a URL, in
// the URL), against real redis-servers that require a password; a store
// runs on the client. A wrong or missing password or user is ErrRedisAuth
// at PingRedis, and a credential given both in a URL and in DialOptions is
// ErrRedisSpec.
func TestDialRedisAuth(t *testing.T) {
	const userPW, defaultPW = "user-s3cret", "default-s3cret"
	one := redistest.Start(t)
	redistest.RequireAuth(t, one.Addr, "limiter", userPW, defaultPW)
	cluster := redistest.StartCluster(t)
	for _, a := range cluster.Addrs {
		redistest.RequireAuth(t, a, "limiter", userPW, defaultPW)
	}
	seeds := strings.Join(cluster.Addrs, ",")
	acl := bucket.DialOptions{Username: "limiter", Password: userPW}
	for _, tc := range []struct {
		name string
		spec string
		opt  bucket.DialOptions
		auth bool // false: ErrRedisAuth
	}{
		{"host:port default user", one.Addr, bucket.DialOptions{Password: defaultPW}, true},
		{"host:port ACL user", one.Addr, acl, true},
		{"URL with options' ACL user", "redis://" + one.Addr + "/0", acl, true},
		{"URL with its own ACL user", "redis://limiter:" + userPW + "@" + one.Addr, bucket.DialOptions{}, true},
		{"URL with its user, options' password", "redis://limiter@" + one.Addr, bucket.DialOptions{Password: userPW}, true},
		{"cluster seeds default user", seeds, bucket.DialOptions{Password: defaultPW}, true},
		{"cluster seeds ACL user", seeds, acl, true},
		{"host:port no password", one.Addr, bucket.DialOptions{}, false},
		{"host:port wrong password", one.Addr, bucket.DialOptions{Password: "wrong"}, false},
		{"host:port ACL user, default's password", one.Addr, bucket.DialOptions{Username: "limiter", Password: defaultPW}, false},
		{"host:port unknown user", one.Addr, bucket.DialOptions{Username: "nobody", Password: userPW}, false},
		{"URL wrong password", "redis://" + one.Addr, bucket.DialOptions{Username: "limiter", Password: "wrong"}, false},
		{"cluster seeds wrong password", seeds, bucket.DialOptions{Username: "limiter", Password: "wrong"}, false},
		{"cluster seeds no password", seeds, bucket.DialOptions{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := bucket.DialRedis(tc.spec, tc.opt)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			err = bucket.PingRedis(context.Background(), c)
			if !tc.auth {
				if !errors.Is(err, bucket.ErrRedisAuth) {
					t.Fatalf("PingRedis: %v, want ErrRedisAuth", err)
				}
				if strings.Contains(err.Error(), "s3cret") {
					t.Fatalf("error shows a password: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("PingRedis: %v", err)
			}
			r := newRedis(t, c)
			k, _ := bucket.NewKey("auth", 1, redistest.Unique(t))
			d, err := r.Take(context.Background(), bucket.Request{Key: k, Limits: bucket.Limits{Capacity: 1, IdleTTL: time.Minute}, Share: 1, Cost: 1})
			if err != nil || !d.Allowed {
				t.Fatalf("take: %+v, %v", d, err)
			}
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
	for _, opt := range []bucket.DialOptions{{Username: "other"}, {Password: "other"}} {
		c, err := bucket.DialRedis("redis://limiter:"+userPW+"@"+one.Addr, opt)
		if err == nil {
			_ = c.Close()
			t.Fatalf("%+v beside a URL's credentials accepted", opt)
		}
		if !errors.Is(err, bucket.ErrRedisSpec) || strings.Contains(err.Error(), "s3cret") {
			t.Fatalf("%+v beside a URL's credentials: %v, want ErrRedisSpec without the password", opt, err)
		}
	}
	// An unreachable server is not an authentication error.
	c, err := bucket.DialRedis(freeAddr(t), bucket.DialOptions{Password: defaultPW})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := bucket.PingRedis(context.Background(), c); err == nil || errors.Is(err, bucket.ErrRedisAuth) {
		t.Fatalf("PingRedis of nothing: %v, want a connection error", err)
	}
}

// freeAddr is a loopback address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}
