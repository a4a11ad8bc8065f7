package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/cache"
)

const cacheUsage = `Usage: sluice cache <command> [flags]

Commands:
  stats    entries, bytes and the bucket's bound, the oldest entry's age; entries per
           tenant (or shared scope) and model
  purge    remove entries: all, or --tenant T and/or --model M
`

func runCache(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	return dispatch(ctx, "cache", cacheUsage, map[string]command{
		"stats": runCacheStats,
		"purge": runCachePurge,
	}, args, getenv, stdout, stderr)
}

func cacheBucket(ctx context.Context, conn *cliNATS, who string) (jetstream.KeyValue, func(), error) {
	nc, _, err := conn.connect(who)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	kv, err := cache.Open(ctx, js)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return kv, nc.Close, nil
}

func runCacheStats(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("cache stats", stderr)
	conn := addCLINATS(fs, getenv, nil)
	asJSON := fs.Bool("json", false, "print JSON")
	if help, err := parseFlags(fs, args); help || err != nil {
		return err
	}
	kv, closeConn, err := cacheBucket(ctx, conn, "sluice cache stats")
	if err != nil {
		return err
	}
	defer closeConn()
	st, err := cache.ReadStats(ctx, kv)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	fmt.Fprint(stdout, statsLine(st, time.Now()))
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	for _, group := range []struct {
		head string
		m    map[string]int
	}{{"SCOPE\tENTRIES", st.ByScope}, {"MODEL\tENTRIES", st.ByModel}} {
		if len(group.m) == 0 {
			continue
		}
		fmt.Fprintln(tw, group.head)
		names := make([]string, 0, len(group.m))
		for n := range group.m {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			fmt.Fprintf(tw, "%s\t%d\n", n, group.m[n])
		}
	}
	return tw.Flush()
}

func runCachePurge(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("cache purge", stderr)
	conn := addCLINATS(fs, getenv, nil)
	tenant := fs.String("tenant", "", "only this tenant's entries (shared scopes are left alone)")
	model := fs.String("model", "", "only entries for this model")
	if help, err := parseFlags(fs, args); help || err != nil {
		return err
	}
	kv, closeConn, err := cacheBucket(ctx, conn, "sluice cache purge")
	if err != nil {
		return err
	}
	defer closeConn()
	n, err := cache.Purge(ctx, kv, *tenant, *model)
	fmt.Fprintf(stdout, "purged %d entries\n", n)
	return err
}

// statsLine is the head of `sluice cache stats`: how full the bucket is,
// what a full one does, and how far back its entries reach.
func statsLine(st *cache.Stats, now time.Time) string {
	line := fmt.Sprintf("entries %d, %d bytes of %d", st.Entries, st.Bytes, st.MaxBytes)
	if st.MaxBytes > 0 {
		line += fmt.Sprintf(" (%.0f%%", 100*float64(st.Bytes)/float64(st.MaxBytes))
		if st.Evicts {
			line += "; when full, the oldest entries give way)"
		} else {
			line += "; when full, new answers are not stored: start a node of this Sluice to make it evict)"
		}
	}
	if !st.Oldest.IsZero() {
		line += fmt.Sprintf(", oldest stored %s ago", now.Sub(st.Oldest).Round(time.Second))
	}
	return line + "\n"
}
