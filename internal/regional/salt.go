package regional

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/quotacoord/quota/internal/etcdlayout"
)

// saltBytes is the entropy of a generated subject salt: 256 bits, the
// HMAC-SHA256 key size, so a hashed subject cannot be reversed by
// guessing the salt either.
const saltBytes = 32

// MaxSubjectSaltLen bounds a subject salt read from etcd.
const MaxSubjectSaltLen = 1024

// saltTimeout bounds the etcd round trips that read or create the
// deployment's subject salt at start.
const saltTimeout = 10 * time.Second

// newSubjectSalt returns a random salt of saltBytes, URL-safe base64.
func newSubjectSalt() string {
	b := make([]byte, saltBytes)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24)
	return base64.RawURLEncoding.EncodeToString(b)
}

// sharedSubjectSalt returns the deployment's subject salt stored in etcd
// under l.SubjectSalt(), creating it with a random value when absent. The
// creation is a create-only transaction (the key's create revision must
// be 0), so nodes that start together agree on the first value written
// and a stored salt is never replaced: replacing it would rename every
// hashed bucket, refilling them all.
func sharedSubjectSalt(ctx context.Context, cli *clientv3.Client, l etcdlayout.Layout) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, saltTimeout)
	defer cancel()
	key, fresh := l.SubjectSalt(), newSubjectSalt()
	resp, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, fresh)).
		Else(clientv3.OpGet(key)).
		Commit()
	if err != nil {
		return "", fmt.Errorf("regional: subject salt %s: %w", key, err)
	}
	if resp.Succeeded {
		return fresh, nil
	}
	kvs := resp.Responses[0].GetResponseRange().GetKvs()
	if len(kvs) != 1 || len(kvs[0].Value) == 0 || len(kvs[0].Value) > MaxSubjectSaltLen {
		return "", fmt.Errorf("regional: subject salt %s: want one value of 1 to %d bytes", key, MaxSubjectSaltLen)
	}
	return string(kvs[0].Value), nil
}
