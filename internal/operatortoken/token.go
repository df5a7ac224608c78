package operatortoken

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
)

// Role is what a credential may do.
type Role int

const (
	// RoleNone may do nothing.
	RoleNone Role = iota
	// RoleRead may call the read methods.
	RoleRead
	// RoleWrite may call every method.
	RoleWrite
)

// String is the role's name in the token file: "read", "write" or "none".
func (r Role) String() string {
	switch r {
	case RoleRead:
		return "read"
	case RoleWrite:
		return "write"
	default:
		return "none"
	}
}

// ErrFile reports a token file that cannot be used.
var ErrFile = errors.New("operatortoken: bad token file")

// MaxTokens bounds the tokens of one file.
const MaxTokens = 1000

// MinLen is the shortest token LoadFile accepts.
const MinLen = 16

// LoadFile reads path, creating it with one random write token (mode
// 0600) when it does not exist. It returns the tokens with their roles.
func LoadFile(path string) (map[string]Role, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		data, err = create(path)
	}
	if err != nil {
		return nil, err
	}
	out := map[string]Role{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if len(out) >= MaxTokens {
			return nil, fmt.Errorf("%w: %s: more than %d tokens", ErrFile, path, MaxTokens)
		}
		role, tok, ok := strings.Cut(line, ":")
		if !ok || len(tok) < MinLen || strings.ContainsAny(tok, " \t") {
			return nil, fmt.Errorf("%w: %s line %d: want read:TOKEN or write:TOKEN with a token of at least %d characters", ErrFile, path, n, MinLen)
		}
		switch role {
		case "read":
			out[tok] = RoleRead
		case "write":
			out[tok] = RoleWrite
		default:
			return nil, fmt.Errorf("%w: %s line %d: role %q is not read or write", ErrFile, path, n, role)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrFile, path, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: %s holds no token", ErrFile, path)
	}
	return out, nil
}

// create writes a new token file at path holding one random write token,
// failing if the file appeared meanwhile, and returns its content.
func create(path string) ([]byte, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return nil, fmt.Errorf("operatortoken: generate token: %w", err)
	}
	data := []byte("# operator tokens: one ROLE:TOKEN per line, ROLE read or write\nwrite:" + hex.EncodeToString(b) + "\n")
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("operatortoken: create token file: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return nil, fmt.Errorf("operatortoken: write token file: %w", err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("operatortoken: write token file: %w", err)
	}
	return data, nil
}

// ForClient picks the token a client sends from a token file's content:
// the first write token, else the first read token, else the first
// non-comment line as a bare token.
func ForClient(data []byte) (string, error) {
	var read, bare string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		role, tok, ok := strings.Cut(line, ":")
		switch {
		case ok && role == "write":
			return tok, nil
		case ok && role == "read" && read == "":
			read = tok
		case !ok && bare == "":
			bare = line
		}
	}
	if read != "" {
		return read, nil
	}
	if bare != "" {
		return bare, nil
	}
	return "", fmt.Errorf("%w: no token", ErrFile)
}

// LoopbackAddr reports whether host:port names this machine only: a
// loopback IP or "localhost". A plaintext bearer token sent to or served
// on such an address never crosses a network. An empty or unspecified
// host (every interface), any other name and anything that is not
// host:port are not loopback.
func LoopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
