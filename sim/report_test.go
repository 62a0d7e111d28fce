package sim

import (
	"bytes"
	"encoding/xml"
	"io"
	"strconv"
	"strings"
	"testing"
)

// svgText is one <text> element of a chart, with what a reader sees.
type svgText struct {
	x      float64
	anchor string
	size   float64
	s      string
}

// parseSVG returns the chart's width and its text elements (the chart must
// be well-formed XML).
func parseSVG(t *testing.T, b []byte) (width float64, texts []svgText) {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(b))
	var cur *svgText
	for {
		tok, err := d.Token()
		if err == io.EOF {
			return width, texts
		}
		if err != nil {
			t.Fatalf("svg is not well-formed: %v", err)
		}
		switch e := tok.(type) {
		case xml.StartElement:
			attr := map[string]string{}
			for _, a := range e.Attr {
				attr[a.Name.Local] = a.Value
			}
			switch e.Name.Local {
			case "svg":
				width, _ = strconv.ParseFloat(attr["width"], 64)
			case "text":
				x, _ := strconv.ParseFloat(attr["x"], 64)
				size := 12.0
				if v, ok := attr["font-size"]; ok {
					size, _ = strconv.ParseFloat(v, 64)
				}
				cur = &svgText{x: x, anchor: attr["text-anchor"], size: size}
			}
		case xml.CharData:
			if cur != nil {
				cur.s += string(e)
			}
		case xml.EndElement:
			if e.Name.Local == "text" && cur != nil {
				texts = append(texts, *cur)
				cur = nil
			}
		}
	}
}

// A person must be able to read the chart: no label may run off the canvas
// (sans-serif glyphs average well under 0.6 em, so 0.6 em per character is
// a safe upper bound), the axes carry round tick values, and the legend
// names what the shades mean.
func TestWriteSVGReadable(t *testing.T) {
	rep := &Report{Trace: "conversation_trace.jsonl.gz", Pods: 8, CachePer: 2000, Policy: "lru", Speedup: 2, EventLag: 0.1,
		Ceiling: 0.374, Results: []result{
			{Policy: "random", HitRate: 0.076, TTFTp50: 0.88, TTFTp90: 3.61},
			{Policy: "precise+spec x4", HitRate: 0.265, TTFTp50: 0.52, TTFTp90: 2.58},
		}}
	var buf bytes.Buffer
	if err := WriteSVG(&buf, rep); err != nil {
		t.Fatal(err)
	}
	width, texts := parseSVG(t, buf.Bytes())
	all := map[string]bool{}
	for _, tx := range texts {
		all[strings.TrimSpace(tx.s)] = true
		w := 0.6 * tx.size * float64(len([]rune(tx.s)))
		lo, hi := tx.x, tx.x+w
		switch tx.anchor {
		case "end":
			lo, hi = tx.x-w, tx.x
		case "middle":
			lo, hi = tx.x-w/2, tx.x+w/2
		}
		if lo < 0 || hi > width {
			t.Errorf("text %q spans [%.0f, %.0f], outside the %.0f-wide canvas", tx.s, lo, hi, width)
		}
	}
	// Hit-rate axis: 0..40% in steps of 10 (the ceiling 37.4% fits); TTFT
	// axis: 0..4 s in steps of 1 (the largest p90 is 3.61 s).
	for _, want := range []string{"0%", "10%", "20%", "30%", "40%", "0", "1", "2", "3", "4", "p50", "p90",
		"random", "precise+spec x4", "0.88 / 3.61", "26.5%", "unbounded cache 37.4%"} {
		if !all[want] {
			t.Errorf("chart has no text %q", want)
		}
	}
}

func TestNiceAxis(t *testing.T) {
	for _, tc := range []struct{ v, top, step float64 }{
		{37.4, 40, 10}, {68.3, 80, 20}, {100, 100, 25}, {3.61, 4, 1}, {0.52, 0.6, 0.2}, {9.42, 10, 2.5},
		{29.12, 30, 10}, {0, 1, 0.25}, {1, 1, 0.25},
	} {
		if top, step := niceAxis(tc.v); !near(top, tc.top) || !near(step, tc.step) {
			t.Errorf("niceAxis(%v) = %v, %v; want %v, %v", tc.v, top, step, tc.top, tc.step)
		}
	}
}
