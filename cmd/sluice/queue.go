package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/adapt"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/services/admission"
	"github.com/sluice-dev/sluice/services/lane"
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
	Waiting   string        `json:"waiting,omitempty"` // why the oldest job waits, from admission or its executor
	// Stage is "dispatched" for jobs handed to the executors (DISPATCH),
	// "" for jobs in QUEUE.
	Stage string `json:"stage,omitempty"`
	// Taken is how many of the tenant's jobs (all priorities) admission
	// has taken from QUEUE and not finished with, of its Window
	// (admission.tenant_window): at the window, no more are delivered.
	Taken  int `json:"taken_by_admission"`
	Window int `json:"tenant_window,omitempty"`
}

func runQueue(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("queue", stderr)
	cfgPath := fs.String("config", getenv("SLUICE_CONFIG"), "configuration, for estimated waits from the limits, and server.nats (SLUICE_CONFIG); without it, the limits the fleet published")
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
	fromFleet := false
	if cfg == nil {
		cfg, fromFleet = fleetConfig(ctx, js), true
	}
	lrows, lerr := limitRows(ctx, js, cfg)
	drows, _ := deploymentRows(ctx, js, cfg) // deployments.go
	var crows []correctionRow
	var brows []lane.Open
	if kv, err := js.KeyValue(ctx, streams.BucketBudgets); err == nil {
		crows, _ = correctionRows(ctx, kv)
		brows, _ = lane.OpenBatches(ctx, kv, time.Now())
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
	defer printBatches(stdout, brows)
	defer printDeployments(stdout, drows)
	defer printCorrections(stdout, crows)
	defer printLimits(stdout, lrows, lerr)
	if len(rows) == 0 {
		fmt.Fprintln(stdout, "no jobs waiting")
		return nil
	}
	if fromFleet && cfg != nil {
		fmt.Fprintln(stdout, "(limits as the fleet published them; give --config to use a file's)")
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PRIORITY\tTENANT\tDEPTH\tOLDEST\tMODEL\tEST. WAIT\tWAITING FOR\tTAKEN/WINDOW")
	for _, r := range rows {
		est := "-"
		if cfg != nil && r.EstWait > 0 {
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

// queueScanMax bounds the messages `sluice queue` reads per QUEUE subject
// and from DISPATCH: the rows count what it read.
const queueScanMax = 2000

// queuedJob is what a row needs of one message.
type queuedJob struct {
	j  task.Task
	at time.Time
}

// scanJobs reads up to queueScanMax jobs on filter in stream, oldest
// first, by direct gets (a work queue's consumers may not overlap, so no
// consumer of its own).
func scanJobs(ctx context.Context, js jetstream.JetStream, stream, filter string) ([]queuedJob, error) {
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return nil, err
	}
	var out []queuedJob
	for seq := info.State.FirstSeq; len(out) < queueScanMax && seq <= info.State.LastSeq && info.State.Msgs > 0; {
		m, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(filter))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return out, err
		}
		seq = m.Sequence + 1
		qj := queuedJob{at: m.Time}
		if json.Unmarshal(m.Data, &qj.j) == nil && qj.j.ID != "" {
			out = append(out, qj)
		}
	}
	return out, nil
}

// rowKey groups jobs into rows: priority, tenant, model and stage.
type rowKey struct {
	p             job.Priority
	tenant, model string
	dispatched    bool
}

// queueRows reads QUEUE and DISPATCH: a row per priority, tenant and model
// (a tenant counts under every model it has jobs for), with depth, the
// oldest job's age and why it waits (from admission or the executor
// holding it), and, with a config, an estimated wait.
func queueRows(ctx context.Context, js jetstream.JetStream, nc *nats.Conn, cfg *config.Config) ([]queueRow, error) {
	var all []queuedJob
	for _, s := range []struct{ stream, filter string }{{streams.Queue, job.QueuePrefix + ">"}, {streams.Dispatch, job.DispatchPrefix + ">"}} {
		jobs, err := scanJobs(ctx, js, s.stream, s.filter)
		if err != nil {
			return nil, fmt.Errorf("stream %s: %w", s.stream, err)
		}
		if s.stream == streams.Dispatch {
			for i := range jobs {
				jobs[i].j.Reservation = &task.Reservation{} // marks the stage below
			}
		}
		all = append(all, jobs...)
	}
	now := time.Now()
	groups := map[rowKey][]queuedJob{}
	var order []rowKey
	for _, qj := range all {
		k := rowKey{p: qj.j.Priority, tenant: qj.j.Tenant, model: qj.j.Model, dispatched: qj.j.Reservation != nil}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], qj)
	}
	rows := make([]queueRow, 0, len(order))
	for _, k := range order {
		rows = append(rows, queueRowOf(ctx, js, nc, cfg, k, groups[k], now))
	}
	takenBy(ctx, js, rows)
	rank := map[job.Priority]int{job.Interactive: 0, job.Standard: 1, job.Batch: 2}
	sort.Slice(rows, func(i, k int) bool {
		if rank[rows[i].Priority] != rank[rows[k].Priority] {
			return rank[rows[i].Priority] < rank[rows[k].Priority]
		}
		if rows[i].Tenant != rows[k].Tenant {
			return rows[i].Tenant < rows[k].Tenant
		}
		return rows[i].Model < rows[k].Model
	})
	if cfg != nil {
		addAhead(rows)
	}
	return rows, nil
}

// queueRowOf is one row: its jobs' count and age, why the oldest waits,
// and (with cfg) how long the row's jobs take at the model's pace, the
// tenant's own rate, or what the oldest job waits for, whichever is last.
func queueRowOf(ctx context.Context, js jetstream.JetStream, nc *nats.Conn, cfg *config.Config, k rowKey, jobs []queuedJob, now time.Time) queueRow {
	oldest := jobs[0]
	r := queueRow{Priority: k.p, Tenant: k.tenant, Model: k.model, Depth: uint64(len(jobs)), OldestAge: now.Sub(oldest.at)}
	if k.dispatched {
		r.Stage, r.Waiting = "dispatched", "dispatched"
	}
	var until time.Time
	if w := rowWhy(nc, jobs); w != nil {
		r.Waiting, until = w.Reason, w.Until
		if w.Limit != "" {
			r.Waiting += "(" + w.Limit + ")"
		}
	}
	if cfg == nil {
		return r
	}
	if until.After(now) {
		r.EstWait = until.Sub(now)
	}
	tokens := 0
	for _, qj := range jobs {
		if qj.j.Estimate != nil {
			tokens += qj.j.Estimate.Cost()
		}
	}
	n := float64(len(jobs))
	if _, _, ok := cfg.ModelRef(oldest.j.Model); ok && !k.dispatched {
		// At the limits in effect (learned from the provider when lower
		// than configured), a group's together (deployments.go).
		rpm, tpm := groupPace(ctx, js, cfg, &oldest.j, now)
		r.EstWait = max(r.EstWait, perMinute(float64(tokens), tpm), perMinute(n, rpm))
	}
	if t, ok := cfg.Tenant(k.tenant); ok && !k.dispatched {
		r.EstWait = max(r.EstWait, perMinute(n, t.RPM), perMinute(float64(tokens), t.TPM))
	}
	return r
}

// whyAsked is how many of a row's oldest jobs are asked why they wait: the
// oldest may be running (its message stays until it ends), or on its way.
const whyAsked = 5

// rowWhy asks why a row's oldest jobs wait, at once, and returns the
// answer for the oldest that has one.
func rowWhy(nc *nats.Conn, jobs []queuedJob) *mesh.Waiting {
	answers := make([]*mesh.Waiting, min(len(jobs), whyAsked))
	var wg sync.WaitGroup
	for i := range answers {
		wg.Go(func() { answers[i], _ = mesh.AskWhy(nc, jobs[i].j.Tenant, jobs[i].j.ID, 200*time.Millisecond) })
	}
	wg.Wait()
	for _, w := range answers {
		if w != nil {
			return w
		}
	}
	return nil
}

// perMinute is how long amount takes at limit per minute (0: no limit).
func perMinute(amount float64, limit int) time.Duration {
	if limit <= 0 {
		return 0
	}
	return time.Duration(amount / (float64(limit) / 60) * float64(time.Second))
}

// addAhead adds to each queued row the wait of the rows of higher
// priorities for the same model: their jobs go first.
func addAhead(rows []queueRow) {
	ahead := map[string]time.Duration{}
	for _, p := range job.Priorities {
		add := map[string]time.Duration{}
		for i := range rows {
			if rows[i].Priority == p && rows[i].Stage == "" {
				add[rows[i].Model] += rows[i].EstWait
			}
		}
		for i := range rows {
			if rows[i].Priority == p && rows[i].Stage == "" {
				rows[i].EstWait += ahead[rows[i].Model]
			}
		}
		for m, d := range add {
			ahead[m] += d
		}
	}
}

// fleetConfig reads the limits a node published (config.FleetKey); nil
// when there are none.
func fleetConfig(ctx context.Context, js jetstream.JetStream) *config.Config {
	kv, err := js.KeyValue(ctx, streams.BucketFleet)
	if err != nil {
		return nil
	}
	e, err := kv.Get(ctx, config.FleetKey)
	if err != nil {
		return nil
	}
	cfg, err := config.Parse(e.Value())
	if err != nil {
		return nil
	}
	return cfg
}
