package node

import "github.com/nats-io/nats.go"

// Conns are the node's own connection and each service's, by name.
func (i Info) Conns() (*nats.Conn, map[string]*nats.Conn) { return i.conn, i.svc }
