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

// WriteTable writes one row per strategy per run (workload or scenario),
// with, on Sluice's row of a scenario, the scenario's target and whether
// Sluice met it; then a line per run on its provider and Sluice's
// configuration, and a line on what Sluice's metrics said where it drew
// 429s or missed its target.
func WriteTable(out io.Writer, results []*WorkloadResult) error {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "run\tstrategy\tgoodput\tprovider 429s\t429s/attempts\tafter 60 s\tattempts/success\tp50 latency\tp95 latency\tjobs lost\tdup\telapsed\t  sluice's target: verdict")
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
			lost := fmt.Sprintf("%d/%d", r.Lost, w.Jobs)
			if r.Unfinished > 0 {
				lost += fmt.Sprintf(" (%d cut)", r.Unfinished)
			}
			after := "-"
			if r.AttemptsAfter60 > 0 {
				after = fmt.Sprintf("%.2f%%", r.Pct429After60)
			}
			// The target is the line's trailing text, outside the
			// right-aligned columns.
			target := ""
			if w.Target != nil && r.Verdict != nil {
				target = fmt.Sprintf("  %s: %s", w.Target, r.Verdict)
			}
			fmt.Fprintf(tw, "%s\t%s\t%.1f%%%s of %s\t%s\t%.2f%%\t%s\t%s\t%s\t%s\t%s\t%d\t%.0fs\t%s\n", w.Label(), r.Strategy,
				100*r.Goodput, mark, strings.ToUpper(string(w.Binding)), Comma(r.Provider429s), r.Pct429, after, aps,
				latency(r.P50MS, r.Successes), latency(r.P95MS, r.Successes), lost, r.Duplicates, r.ElapsedS, target)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out, "goodput: steady-state fill of the REAL binding limit by successful calls (mean over trailing 60-s windows after the first minute, provider's ledger).")
	fmt.Fprintln(out, "429s/attempts: provider 429s over arrivals at its limiter, whole run and seconds after the first 60; latency: submission to result, successful jobs;")
	fmt.Fprintln(out, "attempts/success: provider requests (429s included) per success; jobs lost: failed or unfinished (cut: unfinished at --run-timeout); dup: duplicate completions.")
	if short {
		fmt.Fprintln(out, "*: run shorter than 61 s; goodput is successful charges / (limit × elapsed minutes).")
	}
	fmt.Fprintln(out)
	for _, w := range results {
		fmt.Fprintf(out, "%-18s %s; real limits %s RPM / %s TPM; sluice configured %s\n", w.Label()+":", w.Setup.Describe(),
			Comma(int64(w.RPM)), Comma(int64(w.TPM)), w.sluiceConfig())
		for _, r := range w.Results {
			if r.Strategy != Sluice || (r.Provider429s == 0 && (r.Verdict == nil || r.Verdict.Pass)) {
				continue
			}
			fmt.Fprintf(out, "%-18s sluice: %s\n", "", r.diagnosis())
		}
	}
	return nil
}

// sluiceConfig is what Sluice was told, e.g. "1,200 RPM / 2,000,000 TPM".
func (w *WorkloadResult) sluiceConfig() string {
	if w.SluiceDiscovers {
		return "rpm: 0, tpm: 0, adaptive: true"
	}
	return fmt.Sprintf("%s RPM / %s TPM", Comma(int64(w.SluiceRPM)), Comma(int64(w.SluiceTPM)))
}

// diagnosis says what refused the sluice lane's calls and what it made of
// them: the simulator's reasons, Sluice's classification, its cuts and the
// limits in effect at the end.
func (r Result) diagnosis() string {
	var parts []string
	if len(r.RateLimitedBy) > 0 {
		parts = append(parts, "429s by sim limit "+kv(r.RateLimitedBy))
	}
	if m := r.Sluice; m != nil {
		if len(m.RateLimitHits) > 0 {
			parts = append(parts, "classified "+kv(m.RateLimitHits))
		}
		if len(m.Cuts) > 0 {
			parts = append(parts, "cuts "+kv(m.Cuts))
		}
		if len(m.Requeues) > 0 {
			parts = append(parts, "requeues "+kv(m.Requeues))
		}
		if len(m.Deferrals) > 0 {
			parts = append(parts, "admission deferrals "+kv(m.Deferrals))
		}
		if m.ReservationsExpired > 0 {
			parts = append(parts, fmt.Sprintf("reservations expired %.0f", m.ReservationsExpired))
		}
		if e := m.Effective; e != nil {
			parts = append(parts, fmt.Sprintf("effective at end %.0f RPM / %.0f TPM, %.0f req/s / %.0f tok/s",
				e["requests_per_minute"], e["tokens_per_minute"], e["requests_per_second"], e["tokens_per_second"]))
		}
	}
	if len(parts) == 0 {
		return "no figures"
	}
	return strings.Join(parts, "; ")
}

// kv formats a count map in key order: "a=1 b=2".
func kv[V int64 | float64](m map[string]V) string {
	var parts []string
	for _, k := range sortedKeys(m) {
		name := k
		if name == "" {
			name = "-"
		}
		parts = append(parts, fmt.Sprintf("%s=%v", name, m[k]))
	}
	return strings.Join(parts, " ")
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
