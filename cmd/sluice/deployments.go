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
