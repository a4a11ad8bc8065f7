package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluice-dev/sluice/internal/mesh"
	"github.com/sluice-dev/sluice/pkg/job"
)

// runReload asks every process of the fleet to re-read its configuration
// file and apply it, and prints what each reports.
func runReload(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("reload", stderr)
	cn := addCLINATS(fs, getenv, nil)
	expect := fs.Int("expect", 0, "return once this many processes have answered (0: wait --wait)")
	wait := fs.Duration("wait", 3*time.Second, "how long to wait for the processes' answers")
	if help, err := parseFlags(fs, args); help || err != nil {
		return err
	}
	nc, _, err := cn.connect("sluice reload")
	if err != nil {
		return err
	}
	defer nc.Close()
	id := job.NewID()
	reports := make(chan mesh.ReloadReport, 64)
	sub, err := nc.Subscribe(mesh.ReloadedSubject, func(m *nats.Msg) {
		var r mesh.ReloadReport
		if json.Unmarshal(m.Data, &r) == nil && r.ID == id {
			select {
			case reports <- r:
			default:
			}
		}
	})
	if err != nil {
		return fmt.Errorf("subscribe %s: %w", mesh.ReloadedSubject, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	data, _ := json.Marshal(mesh.ReloadNotice{ID: id})
	if err := nc.Publish(mesh.ReloadSubject, data); err != nil {
		return fmt.Errorf("publish %s: %w", mesh.ReloadSubject, err)
	}
	if err := nc.Flush(); err != nil {
		return err
	}
	got := collectReports(ctx, reports, *expect, *wait)
	return printReports(stdout, got)
}

// collectReports gathers reports until expect have come (expect > 0) or
// wait has passed.
func collectReports(ctx context.Context, reports <-chan mesh.ReloadReport, expect int, wait time.Duration) []mesh.ReloadReport {
	var got []mesh.ReloadReport
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for expect <= 0 || len(got) < expect {
		select {
		case r := <-reports:
			got = append(got, r)
		case <-timer.C:
			return got
		case <-ctx.Done():
			return got
		}
	}
	return got
}

// printReports prints one line per process; an error when none answered
// or one kept its old configuration.
func printReports(w io.Writer, got []mesh.ReloadReport) error {
	if len(got) == 0 {
		return errors.New("reload: no process answered (is the fleet running, and is this its NATS?)")
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PROCESS\tSERVICES\tHASH\tRESULT")
	refused := 0
	for _, r := range got {
		res := "applied: " + strings.Join(r.Changed, ", ")
		switch {
		case r.Unchanged:
			res = "unchanged"
		case !r.Applied:
			res = "refused: " + r.Error
			refused++
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Process, r.Services, r.Hash, res)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if refused > 0 {
		return fmt.Errorf("reload: %d of %d processes kept their old configuration (see above)", refused, len(got))
	}
	return nil
}
