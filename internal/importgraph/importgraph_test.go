package importgraph

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/quotacoord/quota"

var (
	etcd       = "go.etcd.io/etcd"
	etcdServer = "go.etcd.io/etcd/server"
	grpc       = "google.golang.org/grpc"
	prometheus = "github.com/prometheus/"
	hclog      = "github.com/hashicorp/go-hclog"
	redis      = "github.com/redis/go-redis"
)

// deps lists every package pkg depends on (not its tests).
func deps(t *testing.T, pkg string) []string {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", pkg)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", pkg, err, stderr.String())
	}
	return strings.Fields(string(out))
}

func TestForbiddenImports(t *testing.T) {
	cases := []struct {
		pkg       string
		forbidden []string
	}{
		{module + "/bucket", []string{etcd, grpc, prometheus, hclog}},
		// sim links package bucket, whose Redis store pulls the client in;
		// sim itself never imports it (TestOnlyBucketSpeaksRedis).
		{module + "/sim/...", []string{etcd, grpc, prometheus, hclog}},
		{module + "/allocator", []string{etcd, grpc, prometheus, hclog, redis}},
		// The operator CLI talks gRPC to the coordinator; it reads the
		// token file through internal/operatortoken, never linking the
		// coordinator's embedded etcd.
		{module + "/cmd/quotactl", []string{etcdServer}},
	}
	for _, c := range cases {
		t.Run(c.pkg, func(t *testing.T) {
			for _, d := range deps(t, c.pkg) {
				for _, f := range c.forbidden {
					if strings.HasPrefix(d, f) {
						t.Errorf("%s depends on %s", c.pkg, d)
					}
				}
			}
		})
	}
}

// TestAllocatorIsStandardLibraryOnly: the allocator is pure.
func TestAllocatorIsStandardLibraryOnly(t *testing.T) {
	for _, d := range deps(t, module+"/allocator") {
		if d == module+"/allocator" {
			continue
		}
		if first := strings.SplitN(d, "/", 2)[0]; strings.Contains(first, ".") {
			t.Errorf("allocator depends on non-standard package %s", d)
		}
	}
}

// TestOnlyBucketSpeaksRedis: no product package imports the Redis client
// directly except bucket (test helpers aside).
func TestOnlyBucketSpeaksRedis(t *testing.T) {
	cmd := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", module+"/...")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	allowed := map[string]bool{
		module + "/bucket":             true,
		module + "/internal/redistest": true,
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || allowed[f[0]] {
			continue
		}
		for _, imp := range f[1:] {
			if strings.HasPrefix(imp, redis) {
				t.Errorf("%s imports %s; only bucket speaks Redis", f[0], imp)
			}
		}
	}
}
