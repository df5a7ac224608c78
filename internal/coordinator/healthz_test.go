package coordinator

import (
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/quotacoord/quota/internal/etcdtest"
	"github.com/quotacoord/quota/internal/logbuf"
)

// TestHealthzHidesErrors: /healthz, which anyone who reaches the HTTP
// port may call, answers 503 "etcd unreachable" when etcd is down, with
// no error text (endpoints, TLS details); the error goes to the log.
func TestHealthzHidesErrors(t *testing.T) {
	srv := etcdtest.Start(t)
	var logs logbuf.Buffer
	c, _ := startCoordinator(t, Config{EtcdEndpoints: srv.Endpoints, TokenFile: filepath.Join(t.TempDir(), "tokens"),
		Logger: hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Warn})})
	waitLeader(t, c)
	srv.Stop()
	resp, err := http.Get("http://" + c.HTTPAddr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || string(body) != "etcd unreachable\n" {
		t.Fatalf("/healthz with etcd down: %d %q, want 503 and no error text", resp.StatusCode, body)
	}
	if !strings.Contains(logs.String(), "/healthz: etcd unreachable") || !strings.Contains(logs.String(), "error=") {
		t.Fatalf("the error is not logged:\n%s", logs.String())
	}
}
