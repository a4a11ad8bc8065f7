package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/pkg/client"
	"github.com/sluice-dev/sluice/pkg/job"
)

const jobsUsage = `Usage: sluice jobs <command> [flags]

A tenant's jobs over the HTTP API, as the tenant whose API key is given
(--api-key or SLUICE_API_KEY; the key decides the tenant).

Commands:
  list     the tenant's jobs, newest first: --status, --limit, --after, --all
  cancel   cancel a job by id: a queued one ends cancelled; a running one
           only when its call can be stopped (a streamed call), else 409
`

func runJobs(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	return dispatch(ctx, "jobs", jobsUsage, map[string]command{
		"list":   runJobsList,
		"cancel": runJobsCancel,
	}, args, getenv, stdout, stderr)
}

// jobsAPI is the flags every jobs command takes.
type jobsAPI struct {
	url, key, config *string
	getenv           func(string) string
}

func addJobsAPI(fs interface {
	String(name, value, usage string) *string
}, getenv func(string) string) *jobsAPI {
	return &jobsAPI{getenv: getenv,
		url:    fs.String("url", getenv("SLUICE_URL"), "the HTTP API's base URL (SLUICE_URL; else server.http of --config, else http://127.0.0.1:8080)"),
		key:    fs.String("api-key", getenv("SLUICE_API_KEY"), "the tenant's API key (SLUICE_API_KEY)"),
		config: fs.String("config", getenv("SLUICE_CONFIG"), "configuration, for server.http (SLUICE_CONFIG)")}
}

func (a *jobsAPI) client() (*client.Jobs, error) {
	if *a.key == "" {
		return nil, errors.New("--api-key (or SLUICE_API_KEY) is required: it names the tenant")
	}
	base := *a.url
	if base == "" {
		base = "http://127.0.0.1:8080"
		if *a.config != "" {
			cfg, err := config.Load(*a.config)
			if err != nil {
				return nil, err
			}
			if cfg.Server.HTTP != "" {
				base = "http://" + cfg.Server.HTTP
			}
		}
	}
	return client.NewJobs(base, *a.key), nil
}

func runJobsList(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("jobs list", stderr)
	api := addJobsAPI(fs, getenv)
	status := fs.String("status", "", "only jobs of this status: queued, running, succeeded, failed, cancelled, expired, ...")
	limit := fs.Int("limit", 20, "jobs per page (1-100)")
	after := fs.String("after", "", "start after this job id (a page's last id)")
	all := fs.Bool("all", false, "every page, not only the first")
	asJSON := fs.Bool("json", false, "print the pages as JSON")
	if help, err := parseFlags(fs, args); help || err != nil {
		return err
	}
	c, err := api.client()
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	if !*asJSON {
		fmt.Fprintln(tw, "ID\tSTATUS\tSUBMITTED\tMODEL\tERROR")
	}
	opts := client.ListOptions{Status: job.Status(*status), Limit: *limit, After: *after}
	for {
		page, err := c.List(ctx, opts)
		if err != nil {
			return err
		}
		if *asJSON {
			if err := json.NewEncoder(stdout).Encode(page); err != nil {
				return err
			}
		}
		for _, j := range page.Data {
			if *asJSON {
				break
			}
			code := "-"
			if j.Error != nil {
				code = j.Error.Code
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", j.ID, j.Status, j.SubmittedAt.UTC().Format(time.RFC3339), orDash(j.Model), code)
		}
		if !*all || !page.HasMore {
			if page.HasMore && !*asJSON {
				fmt.Fprintf(tw, "(more: --after %s, or --all)\n", page.LastID)
			}
			return tw.Flush()
		}
		opts.After = page.LastID
	}
}

func runJobsCancel(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("jobs cancel", stderr)
	api := addJobsAPI(fs, getenv)
	var id string
	if len(args) > 0 && args[0] != "" && args[0][0] != '-' {
		id, args = args[0], args[1:]
	}
	if help, err := parseFlags(fs, args); help || err != nil {
		return err
	}
	if id == "" {
		return errors.New("usage: sluice jobs cancel ID [flags]")
	}
	c, err := api.client()
	if err != nil {
		return err
	}
	s, accepted, err := c.Cancel(ctx, id)
	if err != nil {
		return err
	}
	if accepted {
		fmt.Fprintf(stdout, "%s: stop asked for; its call is being stopped\n", id)
		return nil
	}
	fmt.Fprintf(stdout, "%s: %s\n", id, s.Status)
	return nil
}
