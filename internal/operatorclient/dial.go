// Package operatorclient opens quotactl's connection to the coordinator's
// operator API: TLS or plaintext, and the operator's bearer token on every
// call. A token never leaves the machine in plaintext unless asked: Dial
// refuses a plaintext connection carrying a token to any target that is
// not loopback or a Unix socket, before anything is resolved or dialed.
package operatorclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quotacoord/quota/internal/operatortoken"
)

// Config is how to reach the coordinator: quotactl's connection flags.
type Config struct {
	// Addr is the gRPC target (--coordinator).
	Addr string
	// TokenFile holds the bearer token sent with every call
	// (--token-file, see operatortoken.ForClient); empty sends none.
	TokenFile string
	// TLS turns TLS on (--tls); TLSCA, TLSCert and TLSKey imply it.
	TLS                    bool
	TLSCA, TLSCert, TLSKey string
	// InsecurePlaintext lets a token travel without TLS to a target that
	// is not loopback (--insecure-plaintext).
	InsecurePlaintext bool
	// Dialer, when set, opens the connections in place of the default
	// TCP dialer (tests route a remote address to a loopback listener).
	Dialer func(ctx context.Context, addr string) (net.Conn, error)
}

// Dial returns a client connection to c.Addr. A token file without TLS
// and without InsecurePlaintext to a target that PlaintextSafe refuses is
// an error naming --tls and --insecure-plaintext, returned before the
// target is resolved or dialed.
func Dial(c Config) (*grpc.ClientConn, error) {
	var creds credentials.TransportCredentials = insecure.NewCredentials()
	if c.TLS || c.TLSCA != "" || c.TLSCert != "" {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if c.TLSCA != "" {
			pem, err := os.ReadFile(c.TLSCA)
			if err != nil {
				return nil, err
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("--tls-ca %s holds no PEM certificate", c.TLSCA)
			}
			tc.RootCAs = pool
		}
		if c.TLSCert != "" {
			cert, err := tls.LoadX509KeyPair(c.TLSCert, c.TLSKey)
			if err != nil {
				return nil, err
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		creds = credentials.NewTLS(tc)
	}
	secure := creds.Info().SecurityProtocol == "tls"
	if c.TokenFile != "" && !secure && !c.InsecurePlaintext && !PlaintextSafe(c.Addr) {
		return nil, fmt.Errorf("refusing to send the bearer token of --token-file in plaintext to %q, which is not a loopback address: "+
			"use --tls (with --tls-ca for a private CA), or --insecure-plaintext if the path is encrypted otherwise", c.Addr)
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	if c.Dialer != nil {
		opts = append(opts, grpc.WithContextDialer(c.Dialer))
	}
	if c.TokenFile != "" {
		data, err := os.ReadFile(c.TokenFile)
		if err != nil {
			return nil, err
		}
		tok, err := operatortoken.ForClient(data)
		if err != nil {
			return nil, err
		}
		opts = append(opts, grpc.WithPerRPCCredentials(bearer{token: tok}))
	}
	return grpc.NewClient(c.Addr, opts...)
}

// PlaintextSafe reports whether a gRPC target keeps what is sent to it on
// this machine: a Unix socket, or a host:port (bare or after dns:/// or
// passthrough:///) that operatortoken.LoopbackAddr accepts. Any other
// name or resolver may lead off the machine.
func PlaintextSafe(target string) bool {
	scheme, rest, ok := strings.Cut(target, ":")
	switch {
	case ok && (scheme == "unix" || scheme == "unix-abstract"):
		return true
	case ok && (scheme == "dns" || scheme == "passthrough") && strings.HasPrefix(rest, "//"):
		// scheme://[authority]/endpoint: the authority names a DNS
		// server, the endpoint is where the call goes.
		_, endpoint, found := strings.Cut(strings.TrimPrefix(rest, "//"), "/")
		return found && operatortoken.LoopbackAddr(endpoint)
	}
	return operatortoken.LoopbackAddr(target)
}

// bearer sends the operator token with every call.
type bearer struct{ token string }

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

// RequireTransportSecurity is false so that tokens work on loopback
// without TLS; Dial refuses plaintext elsewhere unless InsecurePlaintext.
func (b bearer) RequireTransportSecurity() bool { return false }
