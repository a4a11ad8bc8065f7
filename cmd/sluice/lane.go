package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/sluice-dev/sluice/services/lane"
)

// printBatches shows the batch lanes' open batches (`sluice queue`).
func printBatches(w io.Writer, rows []lane.Open) {
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(w, "\nOPEN BATCHES (the batch lane; docs/OPERATIONS.md, \"The batch lane\")")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "LANE\tBATCH\tSTATE\tLINES\tMAPPED BACK\tRESERVED\tAGE\tEARLIEST DEADLINE")
	for _, r := range rows {
		earliest := "-"
		if r.Earliest != nil {
			earliest = r.Earliest.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\n", r.Lane, orDash(r.BatchID), r.State, r.Lines, r.Done, r.Reserved, r.Age.Round(time.Second), earliest)
	}
	_ = tw.Flush()
}
