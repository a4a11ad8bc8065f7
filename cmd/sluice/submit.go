package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/sluice-dev/sluice/pkg/client"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/services/ingest"
)

func runSubmit(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("submit", stderr)
	conn := addCLINATS(fs, getenv, nil)
	tenant := fs.String("tenant", getenv("SLUICE_TENANT"), "tenant (SLUICE_TENANT; default: the only tenant of --config)")
	model := fs.String("model", "gpt-4o-mini", "model")
	prompt := fs.String("prompt", "", "user message (or use --request)")
	reqFile := fs.String("request", "", "file holding a whole chat-completions JSON body ('-' for stdin)")
	maxTokens := fs.Int("max-tokens", 256, "max output tokens")
	priority := fs.String("priority", "standard", "interactive, standard or batch")
	idem := fs.String("idempotency-key", "", "idempotency key")
	wait := fs.Duration("wait", 2*time.Minute, "how long to wait for the result (0: submit only)")
	cost := fs.String("cost", "", "the job's cost in its model's units, as X-Sluice-Cost: images=2,audio_seconds=30")
	stream := fs.Bool("stream", false, "stream the answer: print its text to stdout as it comes, then the job's id, status and usage to stderr")
	if help, err := parseFlags(fs, args); help || err != nil {
		return err
	}
	if *stream && *wait == 0 {
		return errors.New("--stream follows the answer as it comes: it cannot be used with --wait 0")
	}
	var body []byte
	switch {
	case *reqFile == "-":
		b, err := io.ReadAll(os.Stdin)
		if err != nil {
			return err
		}
		body = b
	case *reqFile != "":
		b, err := os.ReadFile(*reqFile)
		if err != nil {
			return err
		}
		body = b
	case *prompt != "":
		b := map[string]any{"model": *model, "max_tokens": *maxTokens,
			"messages": []map[string]string{{"role": "user", "content": *prompt}}}
		if *stream {
			b["stream_options"] = map[string]any{"include_usage": true} // for the usage line
		}
		body, _ = json.Marshal(b)
	default:
		return errors.New("give --prompt or --request")
	}
	nc, cfg, err := conn.connect("sluice submit")
	if err != nil {
		return err
	}
	defer nc.Close()
	if *tenant == "" && cfg != nil && len(cfg.Tenants) == 1 {
		*tenant = cfg.Tenants[0].Name
	}
	if *tenant == "" {
		return errors.New("--tenant is required (the configuration given has not exactly one tenant)")
	}
	c, err := client.New(nc)
	if err != nil {
		return err
	}
	j := &job.Job{Tenant: *tenant, Priority: job.Priority(*priority), IdempotencyKey: *idem, Request: body}
	if *cost != "" {
		c, err := ingest.ParseCost(*cost)
		if err != nil {
			return fmt.Errorf("--cost: %w", err)
		}
		j.Cost = c
	}
	if *wait == 0 {
		id, err := c.Submit(ctx, j)
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, id)
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, *wait)
	defer cancel()
	if *stream {
		return submitStream(wctx, c, j, stdout, stderr)
	}
	res, err := c.Do(wctx, j)
	if err != nil {
		return fmt.Errorf("job %s: %w", j.ID, err)
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(res); err != nil {
		return err
	}
	if res.Status != job.StatusSucceeded {
		return fmt.Errorf("job %s %s", res.JobID, res.Status)
	}
	return nil
}

// submitStream streams j's answer: its text to stdout as it comes, then a
// line on stderr with the job's id, status and usage (when the request
// asked for it), so stdout holds the answer alone.
func submitStream(ctx context.Context, c *client.Client, j *job.Job, stdout, stderr io.Writer) error {
	var usage *job.Usage
	printed := false
	for ch, err := range c.Stream(ctx, j) {
		if err != nil {
			if printed {
				fmt.Fprintln(stdout)
			}
			if se := (*client.StreamError)(nil); errors.As(err, &se) {
				return err // it names the job, its status and why
			}
			return fmt.Errorf("job %s: %w", j.ID, err)
		}
		if ch.Usage != nil {
			u := ch.Usage.Usage()
			usage = &u
		}
		if t := ch.Text(); t != "" {
			if _, err := io.WriteString(stdout, t); err != nil {
				return err
			}
			printed = true
		}
	}
	if printed {
		fmt.Fprintln(stdout)
	}
	line := fmt.Sprintf("job %s %s", j.ID, job.StatusSucceeded)
	if usage != nil {
		line += fmt.Sprintf(" (%d prompt + %d completion tokens)", usage.PromptTokens, usage.CompletionTokens)
	}
	fmt.Fprintln(stderr, line)
	return nil
}

func envOr(getenv func(string) string, k, def string) string {
	if v := getenv(k); v != "" {
		return v
	}
	return def
}
