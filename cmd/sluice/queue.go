package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/adapt"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/services/admission"
	"github.com/sluice-dev/sluice/streams"
)

// queueRow is one tenant and priority's backlog.
type queueRow struct {
	Priority  job.Priority  `json:"priority"`
	Tenant    string        `json:"tenant"`
	Depth     uint64        `json:"depth"`
	OldestAge time.Duration `json:"oldest_age_ns"`
	Model     string        `json:"model,omitempty"`
	EstWait   time.Duration `json:"estimated_wait_ns,omitempty"`
	Waiting   string        `json:"waiting,omitempty"` // why the oldest job waits, from admission
	// Taken is how many of the tenant's jobs (all priorities) admission
	// has taken from QUEUE and not finished with, of its Window
	// (admission.tenant_window): at the window, no more are delivered.
	Taken  int `json:"taken_by_admission"`
	Window int `json:"tenant_window,omitempty"`
}

func runQueue(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("queue", stderr)
	cfgPath := fs.String("config", getenv("SLUICE_CONFIG"), "configuration, for estimated waits from the models' limits, and server.nats (SLUICE_CONFIG)")
	conn := addCLINATS(fs, getenv, cfgPath)
	asJSON := fs.Bool("json", false, "print JSON: the queue rows, or with --limits the limit rows")
	limits := fs.Bool("limits", false, "with --json, print the limits in effect, the token corrections and the deployments instead of the queue")
	if help, err := parseFlags(fs, args); help || err != nil {
		return err
	}
	nc, cfg, err := conn.connect("sluice queue")
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	lrows, lerr := limitRows(ctx, js, cfg)
	drows, _ := deploymentRows(ctx, js, cfg) // deployments.go
	var crows []correctionRow
	if kv, err := js.KeyValue(ctx, streams.BucketBudgets); err == nil {
		crows, _ = correctionRows(ctx, kv)
	}
	if *asJSON && *limits {
		if lerr != nil {
			return lerr
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		all := []any{}
		for _, r := range lrows {
			all = append(all, r)
		}
		for _, r := range crows {
			all = append(all, r)
		}
		for _, r := range drows {
			all = append(all, r)
		}
		return enc.Encode(all)
	}
	rows, err := queueRows(ctx, js, nc, cfg)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	}
	defer printDeployments(stdout, drows)
	defer printCorrections(stdout, crows)
	defer printLimits(stdout, lrows, lerr)
	if len(rows) == 0 {
		fmt.Fprintln(stdout, "no jobs waiting")
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PRIORITY\tTENANT\tDEPTH\tOLDEST\tMODEL\tEST. WAIT\tWAITING FOR\tTAKEN/WINDOW")
	for _, r := range rows {
		est := "-"
		if cfg != nil {
			est = r.EstWait.Round(time.Second).String()
		}
		taken := "-"
		if r.Window > 0 {
			taken = fmt.Sprintf("%d/%d", r.Taken, r.Window)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", r.Priority, r.Tenant, r.Depth, r.OldestAge.Round(time.Second), r.Model, est, orDash(r.Waiting), taken)
	}
	return tw.Flush()
}

// limitRow is one provider/model dimension's limits: configured, stated by
// the provider, learned from its 429s, and in effect.
type limitRow struct {
	Model      string `json:"model"` // provider/model token
	Dimension  string `json:"dimension"`
	Configured int    `json:"configured"`
	Stated     int    `json:"stated"`
	Learned    int    `json:"learned"`
	PerMinute  int    `json:"per_minute"`
	PerSecond  int    `json:"per_second"`
	Cuts       int64  `json:"cuts"`
	LastCut    string `json:"last_cut,omitempty"`
	LastCutAgo string `json:"last_cut_ago,omitempty"`
}

// limitRows reads the fleet's learned records (learn.* in the budgets
// bucket) and, with a config, what it configures.
func limitRows(ctx context.Context, js jetstream.JetStream, cfg *config.Config) ([]limitRow, error) {
	kv, err := js.KeyValue(ctx, streams.BucketBudgets)
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", streams.BucketBudgets, err)
	}
	lister, err := kv.ListKeysFiltered(ctx, "learn.>")
	if err != nil {
		return nil, err
	}
	st := adapt.NewStore(kv, nil)
	now := time.Now()
	var out []limitRow
	for k := range lister.Keys() {
		rec, _, err := st.Get(ctx, k)
		if err != nil {
			return nil, err
		}
		name := strings.TrimPrefix(k, "learn.")
		ac := adapt.Config{Adapts: true, BurstFraction: config.DefaultBurstFraction}
		var model *config.Model
		if cfg != nil {
			for _, p := range cfg.Providers {
				for i, m := range p.Models {
					if p.Name+"."+job.ModelToken(m.Name) == name {
						ac, model = adapt.For(cfg.Admission, m), &p.Models[i]
					}
				}
			}
		}
		e := adapt.Compute(ac, rec, now)
		dims := []string{"requests", "tokens"}
		if ac.SplitOutput || rec.Stated[adapt.Output] > 0 {
			dims = []string{"requests", "input_tokens", "output_tokens"} // Anthropic's ITPM and OTPM
		}
		for d, dim := range dims {
			r := limitRow{Model: name, Dimension: dim, Configured: e.Configured[d], Stated: e.Stated[d], Learned: e.Learned[d],
				PerMinute: e.PerMinute[d], PerSecond: e.PerSecond[d], Cuts: rec.Cuts, LastCut: rec.LastReason}
			if rec.Epoch > 0 {
				r.LastCutAgo = now.Sub(time.UnixMilli(rec.Epoch)).Round(time.Second).String()
			}
			out = append(out, r)
		}
		if model != nil {
			// Units: configured only (not adapted), paced alike.
			for _, unit := range model.UnitNames() {
				limit := model.Units[unit]
				out = append(out, limitRow{Model: name, Dimension: unit, Configured: limit, PerMinute: limit,
					PerSecond: admission.UnitQuantum(limit, cfg.Admission.BurstFraction)})
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Model < out[j].Model })
	return out, nil
}

func printLimits(w io.Writer, rows []limitRow, err error) {
	if err != nil {
		fmt.Fprintf(w, "\nlimits: %v\n", err)
		return
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(w, "\nLIMITS PER MINUTE (0: none; configured, stated by the provider, learned from 429s, in effect)")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MODEL\tDIMENSION\tCONFIGURED\tSTATED\tLEARNED\tIN EFFECT\tPER SECOND\tCUTS\tLAST CUT")
	for _, r := range rows {
		last := "-"
		if r.LastCut != "" {
			last = r.LastCut + " " + r.LastCutAgo + " ago"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\n", r.Model, r.Dimension, r.Configured, r.Stated, r.Learned, r.PerMinute, r.PerSecond, r.Cuts, last)
	}
	_ = tw.Flush()
}

// takenBy fills each row's Taken and Window from its tenant's QUEUE
// consumer (keys.AdmissionConsumer); a tenant without one keeps zeros.
func takenBy(ctx context.Context, js jetstream.JetStream, rows []queueRow) {
	seen := map[string]*jetstream.ConsumerInfo{}
	for i := range rows {
		t := rows[i].Tenant
		ci, ok := seen[t]
		if !ok {
			if cons, err := js.Consumer(ctx, streams.Queue, keys.AdmissionConsumer(t)); err == nil {
				ci = cons.CachedInfo()
			}
			seen[t] = ci
		}
		if ci != nil {
			rows[i].Taken, rows[i].Window = ci.NumAckPending, ci.Config.MaxAckPending
		}
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// queueRows reads QUEUE's subjects: depth per priority and tenant, the
// oldest job's age and model, and (with a config) an estimated wait: the
// tokens queued at this and higher priorities for the model, at its limit.
func queueRows(ctx context.Context, js jetstream.JetStream, nc *nats.Conn, cfg *config.Config) ([]queueRow, error) {
	st, err := js.Stream(ctx, streams.Queue)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", streams.Queue, err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(job.QueuePrefix+">"))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	var rows []queueRow
	for subj, n := range info.State.Subjects {
		parts := strings.Split(subj, ".")
		if len(parts) != 4 {
			continue
		}
		r := queueRow{Priority: job.Priority(parts[2]), Tenant: parts[3], Depth: n}
		if m, err := st.GetMsg(ctx, info.State.FirstSeq, jetstream.WithGetMsgSubject(subj)); err == nil {
			r.OldestAge = now.Sub(m.Time)
			var j job.Job
			if json.Unmarshal(m.Data, &j) == nil {
				r.Model = j.Model
				if reply, err := nc.Request(mesh.WhySubject(j.Tenant, j.ID), nil, 200*time.Millisecond); err == nil {
					var w admission.Waiting
					if json.Unmarshal(reply.Data, &w) == nil {
						r.Waiting = w.Reason
					}
				}
				if cfg != nil && j.Estimate != nil {
					if _, _, ok := cfg.ModelRef(j.Model); ok {
						// At the limits in effect (learned from the provider
						// when lower than configured), not the configured
						// ones; a group's together (deployments.go).
						rpm, tpm := groupPace(ctx, js, cfg, &j, now)
						if tpm > 0 {
							r.EstWait = time.Duration(float64(n) * float64(j.Estimate.Cost()) / (float64(tpm) / 60) * float64(time.Second))
						}
						if rpm > 0 {
							r.EstWait = max(r.EstWait, time.Duration(float64(n)/(float64(rpm)/60)*float64(time.Second)))
						}
					}
				}
			}
		}
		rows = append(rows, r)
	}
	takenBy(ctx, js, rows)
	rank := map[job.Priority]int{job.Interactive: 0, job.Standard: 1, job.Batch: 2}
	sort.Slice(rows, func(i, k int) bool {
		if rank[rows[i].Priority] != rank[rows[k].Priority] {
			return rank[rows[i].Priority] < rank[rows[k].Priority]
		}
		return rows[i].Tenant < rows[k].Tenant
	})
	// Jobs of higher priorities for the same model go first: add their wait.
	if cfg != nil {
		ahead := map[string]time.Duration{}
		for _, p := range job.Priorities {
			var add = map[string]time.Duration{}
			for i := range rows {
				if rows[i].Priority != p {
					continue
				}
				add[rows[i].Model] += rows[i].EstWait
			}
			for i := range rows {
				if rows[i].Priority == p {
					rows[i].EstWait += ahead[rows[i].Model]
				}
			}
			for m, d := range add {
				ahead[m] += d
			}
		}
	}
	return rows, nil
}
