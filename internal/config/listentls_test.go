package config

import (
	"strings"
	"testing"
)

// With listen_tls.ca the embedded server asks every client for a
// certificate, the node's own dialling connections too: a configuration
// that gives the node none is refused, naming what to set.
func TestListenCANeedsTheNodesClientCertificate(t *testing.T) {
	t.Parallel()
	_, err := Parse([]byte("server:\n  nats:\n    listen_tls: {cert: s.pem, key: s-key.pem, ca: ca.pem}\n"))
	if err == nil || !strings.Contains(err.Error(), "server.nats.tls.cert") {
		t.Errorf("listen_tls.ca without a client certificate: %v, want an error naming server.nats.tls.cert", err)
	}
	if _, err := Parse([]byte("server:\n  nats:\n    listen_tls: {cert: s.pem, key: s-key.pem, ca: ca.pem}\n    tls: {cert: c.pem, key: c-key.pem}\n")); err != nil {
		t.Errorf("listen_tls.ca with server.nats.tls.cert: %v, want it accepted", err)
	}
}
