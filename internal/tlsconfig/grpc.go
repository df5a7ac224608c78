package tlsconfig

import (
	"context"
	"crypto/tls"
	"errors"
	"net"

	"google.golang.org/grpc/credentials"
)

// TransportCredentials returns gRPC client credentials that build a
// ClientConfig for every handshake, so each new connection presents the
// current certificate and verifies the server against the current CA pool.
//
// The server name verified (and sent as SNI when it is a host name) is
// serverName when not empty, else the host of the address the connection
// dials (the gRPC authority, an IP address included). Unlike a single
// tls.Config, whose verification cannot see which address was dialed,
// this verifies each member of a cluster dialed by IP address against its
// own address. base is as for ClientConfig; its ServerName is ignored.
func (r *Reloader) TransportCredentials(base *tls.Config, serverName string) credentials.TransportCredentials {
	b := &tls.Config{}
	if base != nil {
		b = base.Clone()
	}
	b.ServerName = ""
	return &reloadingCreds{r: r, base: b, serverName: serverName}
}

// reloadingCreds implements credentials.TransportCredentials for clients.
type reloadingCreds struct {
	r          *Reloader
	base       *tls.Config // never modified after construction
	serverName string
}

// ClientHandshake handshakes on raw with the Reloader's current files,
// verifying the server against c.serverName or the authority's host.
func (c *reloadingCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	name := c.serverName
	if name == "" {
		host, _, err := net.SplitHostPort(authority)
		if err != nil {
			host = authority // no port
		}
		name = host
	}
	b := c.base.Clone()
	b.ServerName = name
	return credentials.NewTLS(c.r.ClientConfig(b)).ClientHandshake(ctx, name, raw)
}

// ServerHandshake refuses: these credentials are for clients only.
func (c *reloadingCreds) ServerHandshake(net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("tlsconfig: client transport credentials cannot serve")
}

// Info reports TLS. (The server name is applied per handshake, not through
// the deprecated ProtocolInfo.ServerName.)
func (c *reloadingCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "tls"}
}

// Clone returns an independent copy.
func (c *reloadingCreds) Clone() credentials.TransportCredentials {
	return &reloadingCreds{r: c.r, base: c.base.Clone(), serverName: c.serverName}
}

// OverrideServerName fixes the server name to verify (deprecated in gRPC,
// kept for the interface).
func (c *reloadingCreds) OverrideServerName(name string) error {
	c.serverName = name
	return nil
}
