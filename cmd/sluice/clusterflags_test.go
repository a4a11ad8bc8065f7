package main

import (
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/internal/config"
)

func TestClusterRoutes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		s        config.Server
		routes   int
		wantName string
		wantErr  string
	}{
		{name: "standalone", s: config.Server{}},
		{name: "routes without cluster", s: config.Server{NATSRoutes: "nats://a:6222"}, wantErr: "need --nats-cluster"},
		{name: "cluster and nats-url", s: config.Server{NATSCluster: "127.0.0.1:6222", NATSRoutes: "nats://a:6222", NATSURL: "nats://x:4222"}, wantErr: "no embedded server"},
		{name: "cluster without routes", s: config.Server{NATSCluster: "127.0.0.1:6222"}, wantErr: "needs --nats-routes"},
		{name: "bad route", s: config.Server{NATSCluster: "127.0.0.1:6222", NATSRoutes: "http://a:6222"}, wantErr: "want nats://HOST:PORT"},
		{name: "default name", s: config.Server{NATSCluster: "10.0.0.1:6222", NATSRoutes: "nats://10.0.0.1:6222, nats://10.0.0.2:6222,"}, routes: 2, wantName: "sluice-10.0.0.1-6222"},
		{name: "given name", s: config.Server{NATSCluster: "10.0.0.1:6222", NATSRoutes: "nats://10.0.0.2:6222", NATSName: "n1"}, routes: 1, wantName: "n1"},
	} {
		s := tc.s
		routes, err := clusterRoutes(&s)
		switch {
		case tc.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%s: got error %v, want one containing %q", tc.name, err, tc.wantErr)
			}
		case err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case len(routes) != tc.routes || s.NATSName != tc.wantName:
			t.Errorf("%s: got %d routes, name %q; want %d, %q", tc.name, len(routes), s.NATSName, tc.routes, tc.wantName)
		}
	}
}
