// Package meshtest gives a test a mesh on an embedded server: a fresh
// JetStream server (natstest), Sluice's streams and buckets, and a
// mesh.Mesh over them. It lives apart from natstest because the mesh and
// streams packages' own tests use natstest.
package meshtest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/natstest"
	"github.com/sluice-dev/sluice/streams"
)

// JetStream starts a fresh embedded server, connects to it and ensures
// Sluice's streams and buckets with opts; all of it ends with the test.
func JetStream(t testing.TB, opts streams.Options) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(natstest.Conn(t, natstest.Server(t)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := streams.Ensure(ctx, js, opts); err != nil {
		t.Fatal(err)
	}
	return js
}

// New is JetStream with a mesh opened on it. The connection is
// m.JS.Conn().
func New(t testing.TB, opts streams.Options) *mesh.Mesh {
	t.Helper()
	return Open(t, JetStream(t, opts))
}

// Open opens another mesh on js, as a second process on the same server
// would.
func Open(t testing.TB, js jetstream.JetStream) *mesh.Mesh {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := mesh.Open(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	return m
}
