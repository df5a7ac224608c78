package etcdauth

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/quotacoord/quota/internal/etcdlayout"
)

// ErrInvalid reports a role or user that cannot be created: a bad region
// or node name, an empty user name or password.
var ErrInvalid = errors.New("etcdauth: invalid")

// Permission grants Type on the key range [Key, RangeEnd); an empty
// RangeEnd is the single key Key.
type Permission struct {
	Key, RangeEnd string
	Type          clientv3.PermissionType
}

// Role is an etcd role: a name and its permissions.
type Role struct {
	Name        string
	Permissions []Permission
}

// The permission types, as clientv3's Auth methods take them.
const (
	read      = clientv3.PermissionType(clientv3.PermRead)
	readWrite = clientv3.PermissionType(clientv3.PermReadWrite)
)

// RootUser is the etcd user that administers users and roles.
const RootUser = "root"

// CoordinatorRoleName is the name of the coordinator's role.
const CoordinatorRoleName = "quota-coordinator"

// prefixRange is the range of every key starting with prefix.
func prefixRange(prefix string, t clientv3.PermissionType) Permission {
	return Permission{Key: prefix, RangeEnd: clientv3.GetPrefixRangeEnd(prefix), Type: t}
}

// CoordinatorRole reads and writes every key of the layout.
func CoordinatorRole(l etcdlayout.Layout) Role {
	return Role{Name: CoordinatorRoleName, Permissions: []Permission{
		prefixRange(l.Root(), readWrite),
	}}
}

// NodeUser is the etcd user (and role) name of one node.
func NodeUser(region, node string) string { return "quota-node/" + region + "/" + node }

// NodeRole writes the node's own registration, demand shards and
// acknowledgement shards; reads its region's registrations and demand
// reports (a node counts its region's nodes and takes its demand part of
// the region's share for leases, regionsync.DemandPart); and reads
// allocations, policies and settings.
func NodeRole(l etcdlayout.Layout, region, node string) (Role, error) {
	if !etcdlayout.ValidName(region) || !etcdlayout.ValidName(node) {
		return Role{}, fmt.Errorf("%w: region %q, node %q: want [A-Za-z0-9_.-]{1,%d}", ErrInvalid, region, node, etcdlayout.MaxNameLen)
	}
	return Role{Name: NodeUser(region, node), Permissions: append([]Permission{
		{Key: l.Node(region, node), Type: readWrite},
		prefixRange(l.NodeDemands(region, node), readWrite),
		prefixRange(l.NodeAcks(region, node), readWrite),
		prefixRange(l.RegionNodes(region), read),
		prefixRange(l.DemandPrefix()+region+"/", read),
	}, follower(l)...)}, nil
}

// RegionUser is the etcd user (and role) name shared by every node of a
// region (RegionRole).
func RegionUser(region string) string { return "quota-region/" + region }

// RegionRole is the role of one region's nodes under a shared credential:
// it writes the registrations, demand reports and acknowledgements of
// any node of that region (regions/{region}/, demand/{region}/,
// acks/{region}/), nothing of another region, and reads what a node
// follows. Fewer credentials than a role per node, at the price that a
// stolen credential can pose as any node of its region.
func RegionRole(l etcdlayout.Layout, region string) (Role, error) {
	if !etcdlayout.ValidName(region) {
		return Role{}, fmt.Errorf("%w: region %q: want [A-Za-z0-9_.-]{1,%d}", ErrInvalid, region, etcdlayout.MaxNameLen)
	}
	return Role{Name: RegionUser(region), Permissions: append([]Permission{
		prefixRange(l.RegionNodes(region), readWrite),
		prefixRange(l.DemandPrefix()+region+"/", readWrite),
		prefixRange(l.AcksPrefix()+region+"/", readWrite),
	}, follower(l)...)}, nil
}

// follower is what every node reads: allocations, policies, the published
// settings, and the deployment's subject salt, which the first node to
// start creates in a create-only transaction (etcd checks the permissions
// of both branches of a transaction, so creating needs write access; the
// transaction itself never replaces a stored salt).
func follower(l etcdlayout.Layout) []Permission {
	return []Permission{
		prefixRange(l.AllocPrefix(), read),
		prefixRange(l.PoliciesPrefix(), read),
		{Key: l.Settings(), Type: read},
		{Key: l.SubjectSalt(), Type: readWrite},
	}
}

// Ensure creates role (if missing) with its permissions, and user (if
// missing) with password, and grants user the role. An existing user's
// password is changed to password.
func Ensure(ctx context.Context, cli *clientv3.Client, role Role, user, password string) error {
	if role.Name == "" || user == "" || password == "" {
		return fmt.Errorf("%w: role %q, user %q: names and password must not be empty", ErrInvalid, role.Name, user)
	}
	if _, err := cli.RoleAdd(ctx, role.Name); err != nil && !errors.Is(err, rpctypes.ErrRoleAlreadyExist) {
		return fmt.Errorf("etcdauth: add role %s: %w", role.Name, err)
	}
	for _, p := range role.Permissions {
		if _, err := cli.RoleGrantPermission(ctx, role.Name, p.Key, p.RangeEnd, p.Type); err != nil {
			return fmt.Errorf("etcdauth: grant %s %v on %q: %w", role.Name, p.Type, p.Key, err)
		}
	}
	return ensureUser(ctx, cli, user, password, role.Name)
}

// ensureUser creates user with password (or sets the password of an
// existing one) and grants it role.
func ensureUser(ctx context.Context, cli *clientv3.Client, user, password, role string) error {
	_, err := cli.UserAdd(ctx, user, password)
	switch {
	case errors.Is(err, rpctypes.ErrUserAlreadyExist):
		if _, err := cli.UserChangePassword(ctx, user, password); err != nil {
			return fmt.Errorf("etcdauth: set the password of %s: %w", user, err)
		}
	case err != nil:
		return fmt.Errorf("etcdauth: add user %s: %w", user, err)
	}
	if _, err := cli.UserGrantRole(ctx, user, role); err != nil {
		return fmt.Errorf("etcdauth: grant %s to %s: %w", role, user, err)
	}
	return nil
}

// EnableAuth creates the root user with rootPassword (the root role is
// etcd's own) and turns authentication on. From then on every client
// must authenticate; cli itself must reconnect as root to go on.
func EnableAuth(ctx context.Context, cli *clientv3.Client, rootPassword string) error {
	if rootPassword == "" {
		return fmt.Errorf("%w: empty root password", ErrInvalid)
	}
	if err := ensureUser(ctx, cli, RootUser, rootPassword, "root"); err != nil {
		return err
	}
	if _, err := cli.AuthEnable(ctx); err != nil {
		return fmt.Errorf("etcdauth: enable authentication: %w", err)
	}
	return nil
}
