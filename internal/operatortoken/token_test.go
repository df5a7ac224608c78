package operatortoken

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadFile(t *testing.T) {
	dir := t.TempDir()
	created := filepath.Join(dir, "new")
	toks, err := LoadFile(created)
	if err != nil || len(toks) != 1 {
		t.Fatalf("create: %v %v", toks, err)
	}
	info, err := os.Stat(created)
	if err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v (%v), want 0600", info.Mode().Perm(), err)
	}
	data, err := os.ReadFile(created)
	if err != nil {
		t.Fatal(err)
	}
	if tok, err := ForClient(data); err != nil || toks[tok] != RoleWrite {
		t.Fatalf("client token %q: %v", tok, err)
	}
	again, err := LoadFile(created)
	if err != nil || len(again) != 1 {
		t.Fatalf("reload: %v %v", again, err)
	}
	cases := []struct {
		name, content, wantErr string
	}{
		{"roles", "write:aaaaaaaaaaaaaaaaaaaa\nread:bbbbbbbbbbbbbbbbbbbb\n# c\n", ""},
		{"bad role", "admin:aaaaaaaaaaaaaaaaaaaa\n", "not read or write"},
		{"short", "write:abc\n", "at least 16"},
		{"blank inside", "write:aaaaaaaa aaaaaaaaaaaa\n", "at least 16"},
		{"bare", "aaaaaaaaaaaaaaaaaaaa\n", "want read:TOKEN"},
		{"empty", "# nothing\n", "no token"},
		{"too many", manyTokens(MaxTokens + 1), "more than"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "-"))
			if err := os.WriteFile(p, []byte(c.content), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := LoadFile(p)
			if c.wantErr == "" && err != nil || c.wantErr != "" && (!errors.Is(err, ErrFile) || !strings.Contains(err.Error(), c.wantErr)) {
				t.Fatalf("err %v, want %q", err, c.wantErr)
			}
		})
	}
}

// manyTokens is a token file of n distinct read tokens.
func manyTokens(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "read:token-%016d\n", i)
	}
	return b.String()
}

func TestForClient(t *testing.T) {
	cases := []struct{ name, content, want string }{
		{"write first", "# c\nread:rrrrrrrrrrrrrrrr\nwrite:wwwwwwwwwwwwwwww\n", "wwwwwwwwwwwwwwww"},
		{"read only", "read:rrrrrrrrrrrrrrrr\nread:ssssssssssssssss\n", "rrrrrrrrrrrrrrrr"},
		{"bare", "  tttttttttttttttt  \n", "tttttttttttttttt"},
		{"read over bare", "tttttttttttttttt\nread:rrrrrrrrrrrrrrrr\n", "rrrrrrrrrrrrrrrr"},
		{"none", "# only a comment\n\n", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ForClient([]byte(c.content))
			if c.want == "" {
				if !errors.Is(err, ErrFile) {
					t.Fatalf("got %q, %v; want ErrFile", got, err)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("got %q, %v; want %q", got, err, c.want)
			}
		})
	}
}

func TestLoopbackAddr(t *testing.T) {
	cases := []struct {
		addr string
		want bool
	}{
		{"127.0.0.1:8091", true},
		{"127.9.9.9:8091", true},
		{"[::1]:8091", true},
		{"localhost:8091", true},
		{":8091", false},
		{"0.0.0.0:8091", false},
		{"[::]:8091", false},
		{"coordinator.internal:8091", false},
		{"192.0.2.10:8091", false},
		{"8091", false},
		{"", false},
	}
	for _, c := range cases {
		if got := LoopbackAddr(c.addr); got != c.want {
			t.Errorf("LoopbackAddr(%q) = %v, want %v", c.addr, got, c.want)
		}
	}
}

func TestRoleString(t *testing.T) {
	for r, want := range map[Role]string{RoleNone: "none", RoleRead: "read", RoleWrite: "write"} {
		if r.String() != want {
			t.Errorf("%d: %q, want %q", r, r.String(), want)
		}
	}
}
