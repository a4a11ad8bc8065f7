package bench

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestSVGIsWellFormed(t *testing.T) {
	t.Parallel()
	panel := func(title string, limit float64) Panel {
		p := Panel{Title: title, Unit: "successful tokens per trailing 60 s", Limit: limit}
		for i, name := range Strategies {
			vals := make([]int64, 90)
			for s := range vals {
				vals[s] = int64(s * (i + 1) * 1000)
			}
			p.Series = append(p.Series, Series{Name: name, Values: vals})
		}
		return p
	}
	var buf bytes.Buffer
	// Titles with markup characters must be escaped.
	if err := WriteSVG(&buf, []Panel{panel("workload a <RPM> & more", 600), panel("workload b", 200_000)}); err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(&buf)
	polylines, dashed, root := 0, 0, ""
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v", err)
		}
		se, ok := tok.(xml.StartElement)
		if !ok {
			continue
		}
		if root == "" {
			root = se.Name.Local
		}
		switch se.Name.Local {
		case "polyline":
			polylines++
			for _, a := range se.Attr {
				if a.Name.Local == "points" && len(strings.Fields(a.Value)) != 90 {
					t.Errorf("polyline has %d points, want 90", len(strings.Fields(a.Value)))
				}
			}
		case "line":
			for _, a := range se.Attr {
				if a.Name.Local == "stroke-dasharray" {
					dashed++
				}
			}
		}
	}
	if root != "svg" {
		t.Errorf("root element %q, want svg", root)
	}
	if polylines != 8 {
		t.Errorf("%d polylines, want 4 per panel (8)", polylines)
	}
	if dashed != 4 { // a limit line and its legend entry per panel
		t.Errorf("%d dashed lines, want 4", dashed)
	}
}

func TestSVGEmptySeries(t *testing.T) {
	t.Parallel()
	p := Panel{Title: "empty", Limit: 0, Series: []Series{{Name: Sluice}}}
	var buf bytes.Buffer
	if err := WriteSVG(&buf, []Panel{p}); err != nil {
		t.Fatal(err)
	}
	if err := xml.Unmarshal(buf.Bytes(), new(struct{})); err != nil {
		t.Errorf("not well-formed XML: %v", err)
	}
}
