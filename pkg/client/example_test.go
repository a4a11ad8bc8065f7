package client_test

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluice-dev/sluice/pkg/client"
	"github.com/sluice-dev/sluice/pkg/job"
)

// Submit a chat completion over NATS and wait for its one result.
func Example() {
	nc, err := nats.Connect("nats://127.0.0.1:4222") // a running `sluice up`
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
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := c.Do(ctx, &job.Job{
		Tenant:   "acme",
		Priority: job.Interactive,
		Request:  []byte(`{"model":"gpt-4o-mini","max_tokens":64,"messages":[{"role":"user","content":"hello"}]}`),
	})
	if err != nil {
		fmt.Println(err) // errors.Is(err, client.ErrQueueFull): back off and retry
		return
	}
	fmt.Println(res.Status, string(res.Response))
}

// A tenant connects as its own NATS user: its name, its Sluice API key as
// the password, and its own reply inbox prefix.
func ExampleTenantUser() {
	nc, err := nats.Connect("nats://127.0.0.1:4222", client.TenantUser("acme", "the-acme-api-key"))
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
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := c.Start(ctx, &job.Job{Tenant: "acme", Request: []byte(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`)})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer p.Stop()
	res, err := p.Wait(ctx)
	fmt.Println(res, err)
}
