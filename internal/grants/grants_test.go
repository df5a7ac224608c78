package grants

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

const sample = `
callers:
  - identities: ["spiffe://cluster.local/ns/edge/sa/envoy", "dns:envoy.edge.svc"]
    grants:
      - actions: [check, refund, override]
        policies: ["*"]
  - identities: ["token:billing"]
    grants:
      - actions: [peek]
        policies: [exports]
`

func TestParseAndFor(t *testing.T) {
	g, err := Parse("g.yaml", []byte(sample))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		ids    []string
		a      Action
		policy string
		want   bool
	}{
		{"anonymous checks", nil, Check, "api", true},
		{"anonymous may not peek", nil, Peek, "exports", false},
		{"anonymous may not refund", nil, Refund, "api", false},
		{"anonymous may not override", nil, Override, "api", false},
		{"envoy refunds", []string{"spiffe://cluster.local/ns/edge/sa/envoy"}, Refund, "api", true},
		{"envoy by dns overrides", []string{"dns:envoy.edge.svc"}, Override, "x", true},
		{"envoy may not peek", []string{"dns:envoy.edge.svc"}, Peek, "exports", false},
		{"billing peeks exports", []string{"token:billing"}, Peek, "exports", true},
		{"billing may not peek api", []string{"token:billing"}, Peek, "api", false},
		{"billing still checks", []string{"token:billing"}, Check, "api", true},
		{"union of identities", []string{"token:billing", "dns:envoy.edge.svc"}, Peek | Refund, "exports", true},
		{"unlisted identity is anonymous", []string{"dns:other"}, Refund, "api", false},
	}
	for _, tt := range tests {
		if got := g.For(tt.ids).Allows(tt.a, tt.policy); got != tt.want {
			t.Errorf("%s: Allows(%v, %q) = %v, want %v", tt.name, tt.a, tt.policy, got, tt.want)
		}
	}
	if !g.Identified() || Default().Identified() {
		t.Error("Identified")
	}
	if d := Default().For([]string{"dns:x"}); !d.AllowsEverywhere(Check) || d.Allows(Peek, "p") || d.Allows(Refund, "p") || d.Allows(Override, "p") {
		t.Errorf("Default grants %+v, want check only", d)
	}
	if (Perms{}).Allows(Check, "p") {
		t.Error("zero Perms allows")
	}
}

func TestParseDefaultAndJSON(t *testing.T) {
	g, err := Parse("g.json", []byte(`{"default": [], "callers": [{"identities": ["dns:a"], "grants": [{"actions": ["check"], "policies": ["p"]}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if g.For(nil).Allows(Check, "p") {
		t.Error("empty default still grants check")
	}
	if !g.For([]string{"dns:a"}).Allows(Check, "p") || g.For([]string{"dns:a"}).Allows(Check, "q") {
		t.Error("dns:a grants")
	}
}

func TestParseErrors(t *testing.T) {
	for _, tt := range []struct{ name, doc, want string }{
		{"unknown field", "caller: []", "field caller not found"},
		{"unknown action", "default: [{actions: [admin], policies: ['*']}]", `unknown action "admin"`},
		{"no actions", "default: [{policies: ['*']}]", "no actions"},
		{"no policies", "default: [{actions: [check]}]", "0 policies"},
		{"bad identity", "callers: [{identities: [envoy], grants: [{actions: [check], policies: ['*']}]}]", "want dns:NAME"},
		{"no identities", "callers: [{grants: [{actions: [check], policies: ['*']}]}]", "0 identities"},
		{"dns as URI", "callers: [{identities: ['dns://x'], grants: [{actions: [check], policies: ['*']}]}]", "want dns:NAME"},
	} {
		_, err := Parse("g.yaml", []byte(tt.doc))
		if !errors.Is(err, ErrGrants) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err %v, want %q", tt.name, err, tt.want)
		}
	}
}

func TestTokensAndIdentify(t *testing.T) {
	toks, err := ParseTokens("t", []byte("# callers\nbilling 0123456789abcdef0123\n\nedge fedcba9876543210fedc\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"billing short", "one-field-only", "a 0123456789abcdef\nb 0123456789abcdef"} {
		if _, err := ParseTokens("t", []byte(bad)); !errors.Is(err, ErrGrants) {
			t.Errorf("ParseTokens(%q) = %v, want ErrGrants", bad, err)
		}
	}
	addr := &net.TCPAddr{IP: net.IPv4(10, 0, 0, 7), Port: 4711}
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: addr})
	c, err := Identify(ctx, toks)
	if err != nil || len(c.IDs) != 0 || c.Addr != addr {
		t.Fatalf("anonymous: %+v, %v", c, err)
	}
	c, err = Identify(metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", "Bearer 0123456789abcdef0123")), toks)
	if err != nil || len(c.IDs) != 1 || c.IDs[0] != "token:billing" {
		t.Fatalf("token: %+v, %v", c, err)
	}
	c, err = Identify(metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", "Bearer not-a-known-token-at-all")), toks)
	if !errors.Is(err, ErrUnknownToken) || len(c.IDs) != 0 {
		t.Fatalf("unknown token: %+v, %v", c, err)
	}
	// Without a tokens file a token is not even looked at.
	if c, err := Identify(metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", "Bearer x")), nil); err != nil || len(c.IDs) != 0 {
		t.Fatalf("no tokens file: %+v, %v", c, err)
	}
}
