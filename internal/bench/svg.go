package bench

import (
	"bufio"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"strings"
)

// Panel is one workload's chart: one line per strategy of what successful
// calls were charged in each trailing 60 s, against the binding limit.
type Panel struct {
	Title     string
	Subtitle  string  // a smaller line under the title (optional)
	Unit      string  // what the y axis counts, e.g. "tokens"
	Limit     float64 // drawn as a dashed line
	LimitName string  // e.g. "TPM"
	Series    []Series
}

// Series is one strategy's values, one per second from the run's start.
type Series struct {
	Name   string
	Values []int64
}

// PanelOf makes the chart panel of a workload's or a scenario's results.
func PanelOf(w *WorkloadResult) Panel {
	title := fmt.Sprintf("workload %s: %s — limit %s %s", w.Name, w.Description, Comma(int64(w.Limit)), strings.ToUpper(string(w.Binding)))
	subtitle := w.Setup.Describe()
	if w.Scenario != "" {
		title = fmt.Sprintf("scenario %s on workload %s — limit %s %s", w.Scenario, w.Name,
			Comma(int64(w.Limit)), strings.ToUpper(string(w.Binding)))
		if w.Target != nil {
			for _, r := range w.Results {
				if r.Verdict != nil {
					subtitle += fmt.Sprintf("; sluice target %s: %s", w.Target, r.Verdict)
				}
			}
		}
	}
	p := Panel{
		Title:     title,
		Subtitle:  subtitle,
		Unit:      "successful " + w.Binding.Unit() + " per trailing 60 s",
		Limit:     float64(w.Limit),
		LimitName: strings.ToUpper(string(w.Binding)),
	}
	for _, r := range w.Results {
		p.Series = append(p.Series, Series{Name: r.Strategy, Values: r.Trailing60})
	}
	return p
}

// Chart geometry.
const (
	svgWidth    = 980
	panelHeight = 320
	marginLeft  = 90
	marginRight = 170
	marginTop   = 52
	marginBot   = 46
)

var palette = map[string]string{
	RetryOnly:    "#d62728",
	RPMLimiter:   "#ff7f0e",
	TokenShaping: "#1f77b4",
	Sluice:       "#2ca02c",
}

var fallback = []string{"#9467bd", "#8c564b", "#e377c2", "#7f7f7f"}

func color(name string, i int) string {
	if c, ok := palette[name]; ok {
		return c
	}
	return fallback[i%len(fallback)]
}

// WriteSVG draws the panels stacked vertically, with axes, a legend and a
// dashed line at each panel's limit.
func WriteSVG(out io.Writer, panels []Panel) error {
	w := bufio.NewWriter(out)
	height := max(len(panels), 1) * panelHeight
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		svgWidth, height, svgWidth, height)
	fmt.Fprintf(w, `<rect x="0" y="0" width="%d" height="%d" fill="white"/>`+"\n", svgWidth, height)
	for i, p := range panels {
		writePanel(w, p, float64(i*panelHeight))
	}
	fmt.Fprintln(w, "</svg>")
	return w.Flush()
}

func writePanel(w *bufio.Writer, p Panel, top float64) {
	x0, x1 := float64(marginLeft), float64(svgWidth-marginRight)
	y0, y1 := top+marginTop, top+panelHeight-marginBot // y0 top edge, y1 bottom edge
	n := 0
	var peak int64
	for _, s := range p.Series {
		n = max(n, len(s.Values))
		for _, v := range s.Values {
			peak = max(peak, v)
		}
	}
	xMax := math.Max(60, math.Ceil(float64(max(n-1, 1))/15)*15)
	ceiling := math.Max(math.Max(p.Limit*1.12, float64(peak)*1.05), 1)
	yStep := niceStep(ceiling / 5)
	yMax := math.Ceil(ceiling/yStep) * yStep
	px := func(t float64) float64 { return x0 + (x1-x0)*t/xMax }
	py := func(v float64) float64 { return y1 - (y1-y0)*v/yMax }

	fmt.Fprintf(w, `<g>`+"\n")
	fmt.Fprintf(w, `<text x="%.0f" y="%.0f" font-size="14" font-weight="bold">%s</text>`+"\n", x0, top+22, esc(p.Title))
	if p.Subtitle != "" {
		fmt.Fprintf(w, `<text x="%.0f" y="%.0f" font-size="11" fill="#444">%s</text>`+"\n", x0, top+38, esc(p.Subtitle))
	}
	// Grid and y ticks.
	for v := 0.0; v <= yMax+yStep/2; v += yStep {
		y := py(v)
		fmt.Fprintf(w, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#e5e5e5"/>`+"\n", x0, y, x1, y)
		fmt.Fprintf(w, `<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n", x0-6, y+4, esc(short(v)))
	}
	// X ticks.
	step := 15.0
	if xMax > 180 {
		step = 30
	}
	for t := 0.0; t <= xMax+1e-9; t += step {
		x := px(t)
		fmt.Fprintf(w, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333"/>`+"\n", x, y1, x, y1+4)
		fmt.Fprintf(w, `<text x="%.1f" y="%.1f" text-anchor="middle">%.0f</text>`+"\n", x, y1+17, t)
	}
	// Axes.
	fmt.Fprintf(w, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333"/>`+"\n", x0, y1, x1, y1)
	fmt.Fprintf(w, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333"/>`+"\n", x0, y0, x0, y1)
	fmt.Fprintf(w, `<text x="%.1f" y="%.1f" text-anchor="middle">seconds since start</text>`+"\n", (x0+x1)/2, y1+36)
	fmt.Fprintf(w, `<text x="%.1f" y="%.1f" text-anchor="middle" transform="rotate(-90 %.1f %.1f)">%s</text>`+"\n",
		x0-62, (y0+y1)/2, x0-62, (y0+y1)/2, esc(p.Unit))
	// The limit.
	if p.Limit > 0 {
		y := py(p.Limit)
		fmt.Fprintf(w, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#555" stroke-width="1.5" stroke-dasharray="6 4"/>`+"\n", x0, y, x1, y)
		fmt.Fprintf(w, `<text x="%.1f" y="%.1f" text-anchor="end" fill="#555">limit %s</text>`+"\n", x1-4, y-5, esc(Comma(int64(p.Limit))+" "+p.LimitName))
	}
	// One line per strategy.
	for i, s := range p.Series {
		var pts strings.Builder
		for t, v := range s.Values {
			if t > 0 {
				pts.WriteByte(' ')
			}
			fmt.Fprintf(&pts, "%.1f,%.1f", px(float64(t)), py(float64(v)))
		}
		fmt.Fprintf(w, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"><title>%s</title></polyline>`+"\n",
			color(s.Name, i), pts.String(), esc(s.Name))
	}
	// Legend.
	lx := x1 + 18
	for i, s := range p.Series {
		ly := y0 + 10 + float64(i)*20
		fmt.Fprintf(w, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="3"/>`+"\n", lx, ly, lx+24, ly, color(s.Name, i))
		fmt.Fprintf(w, `<text x="%.1f" y="%.1f">%s</text>`+"\n", lx+30, ly+4, esc(s.Name))
	}
	ly := y0 + 10 + float64(len(p.Series))*20
	fmt.Fprintf(w, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#555" stroke-width="1.5" stroke-dasharray="6 4"/>`+"\n", lx, ly, lx+24, ly)
	fmt.Fprintf(w, `<text x="%.1f" y="%.1f">limit</text>`+"\n", lx+30, ly+4)
	fmt.Fprintln(w, `</g>`)
}

// niceStep rounds v up to 1, 2, 2.5 or 5 times a power of ten.
func niceStep(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 5} {
		if m*p >= v*(1-1e-9) {
			return m * p
		}
	}
	return 10 * p
}

// short formats an axis value: 1,500 → "1.5k", 2,000,000 → "2M".
func short(v float64) string {
	switch {
	case v >= 1e6:
		return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.2f", v/1e6), "0"), ".") + "M"
	case v >= 1e4:
		return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.1f", v/1e3), "0"), ".") + "k"
	default:
		return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.1f", v), "0"), ".")
	}
}

func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}
