package bench

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Describe writes one line about w: its limits and what it offers.
func Describe(out io.Writer, w *Workload) {
	reqs, toks := w.Offered()
	bind := w.Binding()
	load := ratio(reqs, w.RPM)
	if bind == Tokens {
		load = ratio(toks, w.TPM)
	}
	fmt.Fprintf(out, "workload %-3s %s\n", w.Name, w.Description)
	fmt.Fprintf(out, "             limits %s RPM / %s TPM (binding: %s); offered at once: %s jobs, %s tokens (prompt + max_tokens) = %.2fx the binding limit\n",
		Comma(int64(w.RPM)), Comma(int64(w.TPM)), strings.ToUpper(string(bind)), Comma(int64(reqs)), Comma(int64(toks)), load)
}

// WriteTable writes one row per strategy per workload.
func WriteTable(out io.Writer, results []*WorkloadResult) error {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "workload\tstrategy\tgoodput\tprovider 429s\tattempts/success\tp50 latency\tp95 latency\tjobs failed\telapsed\t")
	short := false
	for _, w := range results {
		for _, r := range w.Results {
			mark := ""
			if r.ShortRun {
				mark, short = "*", true
			}
			aps := "-"
			if r.Successes > 0 {
				aps = fmt.Sprintf("%.2f", r.AttemptsPerSuccess)
			}
			failed := fmt.Sprintf("%d/%d", r.Failed, w.Jobs)
			if r.Unfinished > 0 {
				failed += fmt.Sprintf(" (%d cut)", r.Unfinished)
			}
			fmt.Fprintf(tw, "%s\t%s\t%.1f%%%s of %s\t%s\t%s\t%s\t%s\t%s\t%.0fs\t\n", w.Name, r.Strategy,
				100*r.Goodput, mark, strings.ToUpper(string(w.Binding)), Comma(r.Provider429s), aps,
				latency(r.P50MS, r.Successes), latency(r.P95MS, r.Successes), failed, r.ElapsedS)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out, "goodput: steady-state fill of the binding limit by successful calls (mean over trailing 60-s windows after the first minute, provider's ledger).")
	fmt.Fprintln(out, "latency: submission to result, successful jobs; attempts/success: provider requests (429s included) per success; cut: unfinished at --run-timeout.")
	if short {
		fmt.Fprintln(out, "*: run shorter than 61 s; goodput is successful charges / (limit × elapsed minutes).")
	}
	return nil
}

func latency(ms float64, n int64) string {
	if n == 0 {
		return "-"
	}
	if ms >= 10_000 {
		return fmt.Sprintf("%.1fs", ms/1000)
	}
	return fmt.Sprintf("%.0fms", ms)
}

// Comma formats n with thousands separators.
func Comma(n int64) string {
	s := fmt.Sprint(n)
	if n < 0 {
		return s
	}
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}
