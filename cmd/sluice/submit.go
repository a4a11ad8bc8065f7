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
	tenant := fs.String("tenant", getenv("SLUICE_TENANT"), "tenant (SLUICE_TENANT)")
	model := fs.String("model", "gpt-4o-mini", "model")
	prompt := fs.String("prompt", "", "user message (or use --request)")
	reqFile := fs.String("request", "", "file holding a whole chat-completions JSON body ('-' for stdin)")
	maxTokens := fs.Int("max-tokens", 256, "max output tokens")
	priority := fs.String("priority", "standard", "interactive, standard or batch")
	idem := fs.String("idempotency-key", "", "idempotency key")
	wait := fs.Duration("wait", 2*time.Minute, "how long to wait for the result (0: submit only)")
	cost := fs.String("cost", "", "the job's cost in its model's units, as X-Sluice-Cost: images=2,audio_seconds=30")
	if help, err := parseFlags(fs, args); help || err != nil {
		return err
	}
	if *tenant == "" {
		return errors.New("--tenant is required")
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
		body, _ = json.Marshal(map[string]any{"model": *model, "max_tokens": *maxTokens,
			"messages": []map[string]string{{"role": "user", "content": *prompt}}})
	default:
		return errors.New("give --prompt or --request")
	}
	nc, _, err := conn.connect("sluice submit")
	if err != nil {
		return err
	}
	defer nc.Close()
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

func envOr(getenv func(string) string, k, def string) string {
	if v := getenv(k); v != "" {
		return v
	}
	return def
}
