package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/adapt"
	"github.com/sluice-dev/sluice/internal/budget"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/streams"
)

// deploymentRow is one deployment of a model several providers serve:
// where it stands in its group and how full its trailing minute is.
type deploymentRow struct {
	Model    string `json:"model"`
	Provider string `json:"provider"`
	Tier     int    `json:"tier"`
	Weight   int    `json:"weight"`
	Upstream string `json:"upstream,omitempty"`
	// Requests and tokens in the trailing minute (planned sends included),
	// and the limits in effect.
	UsedRequests int `json:"used_requests"`
	UsedTokens   int `json:"used_tokens"`
	RPM          int `json:"rpm_in_effect"`
	TPM          int `json:"tpm_in_effect"`
}

// deploymentRows reads, for every model several providers serve, each
// deployment's window and learned limits.
func deploymentRows(ctx context.Context, js jetstream.JetStream, cfg *config.Config) ([]deploymentRow, error) {
	if cfg == nil {
		return nil, nil
	}
	kv, err := js.KeyValue(ctx, streams.BucketBudgets)
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", streams.BucketBudgets, err)
	}
	store := budget.NewStore(kv, cfg.Admission.Params(), nil)
	learn := adapt.NewStore(kv, nil)
	now := time.Now()
	var out []deploymentRow
	seen := map[string]bool{}
	for _, p := range cfg.Providers {
		for _, m := range p.Models {
			if seen[m.Name] || !cfg.Grouped(m.Name) {
				continue
			}
			seen[m.Name] = true
			for _, d := range cfg.Group(m.Name) {
				tok := job.ModelToken(m.Name)
				r := deploymentRow{Model: m.Name, Provider: d.Provider.Name, Tier: d.Model.Tier, Weight: d.Model.Weight, Upstream: d.Model.Upstream,
					RPM: d.Model.RPM, TPM: d.Model.TPM}
				if rec, _, err := learn.Get(ctx, adapt.Key(d.Provider.Name, tok)); err == nil {
					e := adapt.Compute(adapt.For(cfg.Admission, *d.Model), rec, now)
					r.RPM, r.TPM = e.PerMinute[adapt.Requests], e.PerMinute[adapt.Tokens]
				}
				if used, err := store.Used(ctx, budget.ModelKey(d.Provider.Name, tok)); err == nil {
					r.UsedRequests, r.UsedTokens = used.Requests, used.Tokens
				}
				out = append(out, r)
			}
		}
	}
	return out, nil
}

func printDeployments(w io.Writer, rows []deploymentRow) {
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(w, "\nDEPLOYMENTS (a model several providers serve; used: the trailing minute, planned sends included)")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MODEL\tPROVIDER\tTIER\tWEIGHT\tUPSTREAM\tREQUESTS\tRPM\tFILL\tTOKENS\tTPM")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%d\t%d\t%s\t%d\t%d\n", r.Model, r.Provider, r.Tier, r.Weight, orDash(r.Upstream),
			r.UsedRequests, r.RPM, fill(r.UsedRequests, r.RPM), r.UsedTokens, r.TPM)
	}
	_ = tw.Flush()
}

// fill is used over limit as a percentage ("-" without a limit).
func fill(used, limit int) string {
	if limit <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f%%", 100*float64(used)/float64(limit))
}

// pace is the requests and tokens per minute provider's deployment of
// model sends at: its limits in effect, or the slower pace of a per-second
// cap learned from the provider.
func pace(ctx context.Context, kv jetstream.KeyValue, cfg *config.Config, provider string, model *config.Model, now time.Time) (rpm, tpm int) {
	rpm, tpm = model.RPM, model.TPM
	if kv == nil {
		return rpm, tpm
	}
	rec, _, err := adapt.NewStore(kv, nil).Get(ctx, adapt.Key(provider, job.ModelToken(model.Name)))
	if err != nil {
		return rpm, tpm
	}
	e := adapt.Compute(adapt.For(cfg.Admission, *model), rec, now)
	rpm, tpm = e.PerMinute[adapt.Requests], e.PerMinute[adapt.Tokens]
	if ps := 60 * e.PerSecond[adapt.Requests]; ps > 0 && (rpm == 0 || ps < rpm) {
		rpm = ps
	}
	if ps := 60 * e.PerSecond[adapt.Tokens]; ps > 0 && (tpm == 0 || ps < tpm) {
		tpm = ps
	}
	return rpm, tpm
}

// groupPace is pace for a queued job: its pinned deployment's, else its
// group's deployments' together (0, no limit, when any has none).
func groupPace(ctx context.Context, js jetstream.JetStream, cfg *config.Config, j *task.Task, now time.Time) (rpm, tpm int) {
	kv, _ := js.KeyValue(ctx, streams.BucketBudgets)
	if j.Pinned || !cfg.Grouped(j.Model) {
		p, m, ok := cfg.Deployment(j.Provider, j.Model)
		if !ok {
			p, m, _ = cfg.ModelRef(j.Model)
		}
		return pace(ctx, kv, cfg, p.Name, m, now)
	}
	unlimited := [2]bool{}
	for _, d := range cfg.Group(j.Model) {
		r, t := pace(ctx, kv, cfg, d.Provider.Name, d.Model, now)
		unlimited[0], unlimited[1] = unlimited[0] || r == 0, unlimited[1] || t == 0
		rpm, tpm = rpm+r, tpm+t
	}
	if unlimited[0] {
		rpm = 0
	}
	if unlimited[1] {
		tpm = 0
	}
	return rpm, tpm
}
