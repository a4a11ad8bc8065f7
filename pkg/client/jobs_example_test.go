package client_test

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/sluice-dev/sluice/pkg/client"
	"github.com/sluice-dev/sluice/pkg/job"
)

// List a tenant's queued jobs, page by page, and cancel them.
func ExampleJobs() {
	jobs := client.NewJobs("http://127.0.0.1:8080", os.Getenv("ACME_SLUICE_KEY")) // a running `sluice up`
	ctx := context.Background()
	opts := client.ListOptions{Status: job.StatusQueued, Limit: 100}
	for {
		page, err := jobs.List(ctx, opts)
		if err != nil {
			fmt.Println(err)
			return
		}
		for _, j := range page.Data {
			_, _, err := jobs.Cancel(ctx, j.ID)
			var apiErr *client.APIError
			if errors.As(err, &apiErr) && apiErr.Code == "job_running" {
				continue // its call has left and cannot be stopped
			}
		}
		if !page.HasMore {
			return
		}
		opts.After = page.LastID
	}
}
