package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/schollz/progressbar/v3"

	"github.com/sluice-dev/sluice/internal/dlq"
)

const dlqUsage = `Usage: sluice dlq <command> [flags]

Commands:
  list     list dead-lettered jobs, newest last
  show     print one dead-lettered job as JSON
  replay   submit dead-lettered jobs again, as new jobs, and remove them from the DLQ

Run 'sluice dlq <command> -h' for a command's flags.
`

// dlqReplayBarMin is the number of jobs above which replay shows a progress bar.
const dlqReplayBarMin = 20

func runDLQ(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	return dispatch(ctx, "dlq", dlqUsage, map[string]command{
		"list":   runDLQList,
		"show":   runDLQShow,
		"replay": runDLQReplay,
	}, args, getenv, stdout, stderr)
}

func runDLQList(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("dlq list", stderr)
	conn := addCLINATS(fs, getenv, nil)
	tenant := fs.String("tenant", "", "only this tenant's jobs")
	limit := fs.Int("limit", 100, "show the newest N jobs (0: all)")
	asJSON := fs.Bool("json", false, "print JSON (request bodies left out)")
	if help, err := parseFlags(fs, args); help || err != nil {
		return err
	}
	if *limit < 0 {
		return fmt.Errorf("--limit: want 0 (all) or more, got %d", *limit)
	}
	js, closeConn, err := dlqConnect(conn)
	if err != nil {
		return err
	}
	defer closeConn()
	ls, err := dlq.List(ctx, js, dlq.Filter{Tenant: *tenant, Limit: *limit})
	if err != nil {
		return err
	}
	if *asJSON {
		views := make([]dlqEntryView, 0, len(ls))
		for _, l := range ls {
			views = append(views, dlqView(l, false))
		}
		return dlqWriteJSON(stdout, views)
	}
	if len(ls) == 0 {
		fmt.Fprintln(stdout, "no dead-lettered jobs")
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "JOB ID\tTENANT\tREASON\tLAST ERROR\tATTEMPTS\tDEAD-LETTERED AT")
	for _, l := range ls {
		code := "-"
		if l.LastError != nil && l.LastError.Code != "" {
			code = l.LastError.Code
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", l.Job.ID, l.Job.Tenant, l.Reason, code,
			len(l.Job.Attempts), l.DeadAt.UTC().Format(time.RFC3339))
	}
	return tw.Flush()
}

func runDLQShow(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("dlq show", stderr)
	conn := addCLINATS(fs, getenv, nil)
	withRequest := fs.Bool("with-request", false, "include the request body (prompts); by default only its size is shown")
	tenant := fs.String("tenant", "", "the job's tenant (needed when several tenants dead-lettered the same id)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "Usage: sluice dlq show [flags] JOB_ID")
		fs.PrintDefaults()
	}
	ids, help, err := dlqParseArgs(fs, args)
	if help || err != nil {
		return err
	}
	if len(ids) != 1 {
		return fmt.Errorf("dlq show: want one job id, got %d", len(ids))
	}
	js, closeConn, err := dlqConnect(conn)
	if err != nil {
		return err
	}
	defer closeConn()
	l, err := dlq.Get(ctx, js, *tenant, ids[0])
	if err != nil {
		return err
	}
	return dlqWriteJSON(stdout, dlqView(*l, *withRequest))
}

func runDLQReplay(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("dlq replay", stderr)
	conn := addCLINATS(fs, getenv, nil)
	tenant := fs.String("tenant", "", "replay this tenant's jobs (with ids: the ids are this tenant's)")
	all := fs.Bool("all", false, "replay every dead-lettered job of every tenant")
	asJSON := fs.Bool("json", false, "print the original and new id of every job as JSON")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "Usage: sluice dlq replay [flags] [JOB_ID...]")
		fmt.Fprintln(fs.Output(), "Each job is submitted again as a new job (new id, no deadline, no idempotency key) and removed from the DLQ.")
		fs.PrintDefaults()
	}
	ids, help, err := dlqParseArgs(fs, args)
	if help || err != nil {
		return err
	}
	switch {
	case *all && (len(ids) > 0 || *tenant != ""):
		return errors.New("dlq replay: --all replays everything; give it without job ids or --tenant")
	case !*all && len(ids) == 0 && *tenant == "":
		return errors.New("dlq replay: give job ids, --tenant T, or --all to replay every dead-lettered job")
	}
	js, closeConn, err := dlqConnect(conn)
	if err != nil {
		return err
	}
	defer closeConn()

	var bar *progressbar.ProgressBar
	progress := func(done, total int) {
		if total <= dlqReplayBarMin {
			return
		}
		if bar == nil {
			bar = progressbar.NewOptions(total,
				progressbar.OptionSetWriter(stderr),
				progressbar.OptionSetDescription("replaying"),
				progressbar.OptionSetWidth(30),
				progressbar.OptionShowCount(),
				progressbar.OptionThrottle(100*time.Millisecond))
		}
		_ = bar.Set(done)
	}
	rep, err := dlq.Replay(ctx, js, ids, *tenant, progress)
	if bar != nil {
		fmt.Fprintln(stderr) // end the bar's line
	}
	if err != nil && len(rep.Replayed)+len(rep.Failed) == 0 {
		return err // nothing was tried: an unknown id, a bad tenant, no DLQ
	}
	if *asJSON {
		if jerr := dlqWriteJSON(stdout, rep); jerr != nil {
			return jerr
		}
	} else {
		fmt.Fprintln(stdout, dlqReplaySummary(rep))
		for _, p := range rep.Failed {
			fmt.Fprintf(stderr, "not replayed: %s\n", p.Error)
		}
	}
	if err != nil {
		return fmt.Errorf("dlq replay: %w", err)
	}
	return nil
}

// dlqSummaryIDs bounds the new ids the summary line names; --json lists all.
const dlqSummaryIDs = 20

func dlqReplaySummary(rep dlq.ReplayReport) string {
	var fresh, dup []string
	for _, p := range rep.Replayed {
		if p.Duplicate {
			dup = append(dup, p.Original)
		} else {
			fresh = append(fresh, p.New)
		}
	}
	if len(rep.Replayed) == 0 {
		if len(rep.Failed) == 0 {
			return "replayed 0 jobs: no dead-lettered jobs match"
		}
		return "replayed 0 jobs"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "replayed %d %s", len(rep.Replayed), dlqPlural(len(rep.Replayed), "job", "jobs"))
	if len(fresh) > 0 {
		fmt.Fprintf(&b, " (new ids: %s)", dlqClipIDs(fresh))
	}
	if len(dup) > 0 {
		fmt.Fprintf(&b, "; %d already submitted by an earlier replay, new id unknown: %s", len(dup), dlqClipIDs(dup))
	}
	return b.String()
}

func dlqClipIDs(ids []string) string {
	if len(ids) <= dlqSummaryIDs {
		return strings.Join(ids, ", ")
	}
	return fmt.Sprintf("%s, and %d more; --json lists all", strings.Join(ids[:dlqSummaryIDs], ", "), len(ids)-dlqSummaryIDs)
}

func dlqPlural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// dlqEntryView is an entry as the dlq commands print it: the request body (the
// prompt) only when asked for, its size always.
type dlqEntryView struct {
	Seq uint64 `json:"seq"`
	dlq.Entry
	RequestBytes int `json:"request_bytes"`
}

func dlqView(l dlq.Listed, withRequest bool) dlqEntryView {
	v := dlqEntryView{Seq: l.Seq, Entry: l.Entry, RequestBytes: len(l.Job.Request)}
	if !withRequest {
		v.Job.Request = nil
	}
	return v
}

func dlqWriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// dlqParseArgs parses flags that may come before or after positional
// arguments (`show ID --with-request`) and returns the positional ones.
func dlqParseArgs(fs *flag.FlagSet, args []string) (pos []string, help bool, err error) {
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, true, nil
			}
			return nil, false, err
		}
		if fs.NArg() == 0 {
			return pos, false, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

func dlqConnect(conn *cliNATS) (jetstream.JetStream, func(), error) {
	nc, _, err := conn.connect("sluice dlq")
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return js, nc.Close, nil
}
