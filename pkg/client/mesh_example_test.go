package client_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/node"
	"github.com/sluice-dev/sluice/pkg/client"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/sim"
)

// The whole way on loopback: the provider simulator, a Sluice node with an
// embedded NATS server (what `sluice up` runs), and one job submitted with
// the client, which gets its one result.
func Example_loopback() {
	s, err := sim.New(sim.Config{Models: []sim.ModelLimits{{Name: "gpt-4o-mini", RPM: 600, TPM: 100000}}})
	if err != nil {
		fmt.Println(err)
		return
	}
	provider := httptest.NewServer(s)
	defer provider.Close()
	cfg, err := config.Parse([]byte(`
server: {metrics: "off"}
providers:
  - name: sim
    base_url: ` + provider.URL + `/v1
    models: [{name: gpt-4o-mini, rpm: 600, tpm: 100000}]
tenants: [{name: acme}]
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	data, err := os.MkdirTemp("", "sluice-example-")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(data)

	ctx, stop := context.WithTimeout(context.Background(), time.Minute)
	defer stop()
	ready, done := make(chan node.Info, 1), make(chan error, 1)
	go func() {
		done <- node.Run(ctx, node.Options{Config: cfg, NATSListen: "127.0.0.1:0", Data: data,
			Getenv: func(string) string { return "" }, Log: slog.New(slog.DiscardHandler),
			OnReady: func(i node.Info) { ready <- i }})
	}()
	defer func() { stop(); <-done }()
	var info node.Info
	select {
	case info = <-ready:
	case err := <-done:
		done <- err
		fmt.Println(err)
		return
	}

	nc, err := nats.Connect(info.NATSURL, info.NATSOptions...) // as the operator
	if err != nil {
		fmt.Println(err)
		return
	}
	defer nc.Close()
	c, err := client.New(nc)
	if err != nil {
		fmt.Println(err)
		return
	}
	res, err := c.Do(ctx, &job.Job{
		Tenant:  "acme",
		Request: []byte(`{"model":"gpt-4o-mini","max_tokens":64,"messages":[{"role":"user","content":"hello"}]}`),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(res.Status, res.Provider, res.Model, "attempts:", res.Attempts)
	// Output: succeeded sim gpt-4o-mini attempts: 1
}
