package regional

import (
	"io"
	"strings"
	"testing"

	"github.com/quotacoord/quota/internal/etcdlayout"
)

func TestNodeIDFlag(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		env  []string
		want string // "" = a generated default
		err  string
	}{
		{"default", []string{"-etcd", "127.0.0.1:1"}, nil, "", ""},
		{"flag", []string{"-etcd", "127.0.0.1:1", "-node-id", "eu-1.pod_7"}, nil, "eu-1.pod_7", ""},
		{"env", []string{"-etcd", "127.0.0.1:1"}, []string{"QUOTA_NODE_ID=from-env"}, "from-env", ""},
		{"slash", []string{"-etcd", "127.0.0.1:1", "-node-id", "a/b"}, nil, "", "-node-id"},
		{"too long", []string{"-etcd", "127.0.0.1:1", "-node-id", strings.Repeat("n", 65)}, nil, "", "-node-id"},
	} {
		t.Run(c.name, func(t *testing.T) {
			o, err := parseFlags(c.args, c.env, io.Discard)
			if err == nil {
				o, err = o.withDefaults()
			}
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err = %v, want one about %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.want != "" && o.NodeID != c.want {
				t.Fatalf("node id %q, want %q", o.NodeID, c.want)
			}
			if !etcdlayout.ValidName(o.NodeID) {
				t.Fatalf("node id %q is not valid", o.NodeID)
			}
		})
	}
}
