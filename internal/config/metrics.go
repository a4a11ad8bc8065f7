package config

// DefaultMetrics is where `sluice up` serves /metrics unless
// server.metrics (--metrics, SLUICE_METRICS) says otherwise: loopback
// only, apart from the API listener, since the metrics name every tenant
// and its traffic. Prometheus on another host needs an address it can
// reach, set explicitly.
const DefaultMetrics = "127.0.0.1:9464"

// listenCAClient is what is wrong with a listen_tls.ca the node cannot
// itself satisfy ("" when nothing is): with a ca, the embedded server asks
// every client for a certificate it signed, the node's own connections
// that dial the listener included (the operator's that ensures the
// streams, a cluster node's services, the CLI's queue, submit and dlq).
func listenCAClient(n NATS) string {
	if n.ListenTLS.CA == "" || n.TLS.Cert != "" {
		return ""
	}
	return "ca makes every client present a certificate it signed, this node's own connections too: set server.nats.tls.cert and key to such a certificate"
}
