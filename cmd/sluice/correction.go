package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/calib"
)

// correctionRow is one provider/model's (or request shape class's) token
// correction: the factor admission applies to Sluice's prompt estimate
// when it places a job, learned from the providers' reported counts.
type correctionRow struct {
	Model      string  `json:"model"` // provider/model token
	Dimension  string  `json:"dimension"`
	Class      string  `json:"class,omitempty"` // "": the whole model
	Correction float64 `json:"correction"`
	Samples    int64   `json:"samples"`
	Updated    string  `json:"updated_ago,omitempty"`
}

// correctionRows reads the fleet's corrections (calib.* in the budgets
// bucket).
func correctionRows(ctx context.Context, kv jetstream.KeyValue) ([]correctionRow, error) {
	lister, err := kv.ListKeysFiltered(ctx, "calib.>")
	if err != nil {
		return nil, err
	}
	models := map[string][2]string{}
	for k := range lister.Keys() {
		if f := strings.Split(k, "."); len(f) == 3 {
			models[f[1]+"."+f[2]] = [2]string{f[1], f[2]}
		}
	}
	tb := calib.New(kv, nil)
	now := time.Now()
	var out []correctionRow
	row := func(name, class string, st calib.State) correctionRow {
		r := correctionRow{Model: name, Dimension: "prompt_correction", Class: class, Correction: st.Correction, Samples: st.Samples}
		if !st.At.IsZero() {
			r.Updated = now.Sub(st.At).Round(time.Second).String()
		}
		return r
	}
	for name, pm := range models {
		st, classes := tb.Lookup(ctx, pm[0], pm[1])
		out = append(out, row(name, "", st))
		for class, cs := range classes {
			out = append(out, row(name, class, cs))
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Model != out[j].Model {
			return out[i].Model < out[j].Model
		}
		return out[i].Class < out[j].Class
	})
	return out, nil
}

func printCorrections(w io.Writer, rows []correctionRow) {
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "\nTOKEN CORRECTION (provider's prompt count / Sluice's estimate, %g quantile of the last %d answers; applied when a job is placed; %g before the first answer)\n",
		calib.Quantile, calib.Window, calib.Prior)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MODEL\tCLASS\tCORRECTION\tANSWERS\tUPDATED")
	for _, r := range rows {
		class := r.Class
		if class == "" {
			class = "(all)"
		}
		updated := "-"
		if r.Updated != "" {
			updated = r.Updated + " ago"
		}
		fmt.Fprintf(tw, "%s\t%s\t%.3f\t%d\t%s\n", r.Model, class, r.Correction, r.Samples, updated)
	}
	_ = tw.Flush()
}
