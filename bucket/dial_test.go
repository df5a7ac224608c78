package bucket_test

import (
	"context"
	"crypto/tls"
	"errors"
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
			if tc.opt == (bucket.DialOptions{}) && !errors.Is(err, bucket.ErrRedisSpec) {
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
