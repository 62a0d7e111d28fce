package sim

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"math"
	"strconv"
	"strings"
)

// Report is what --out writes as JSON: the parameters and every policy's result.
type Report struct {
	Trace     string       `json:"trace"`
	Pods      int          `json:"pods"`
	CachePer  int          `json:"cache_blocks_per_pod"`
	Policy    string       `json:"cache_policy"`
	BlockSize int          `json:"block_size"`
	Speedup   float64      `json:"speedup"`
	EventLag  float64      `json:"event_lag_s"`
	Service   ServiceModel `json:"service"`
	Ceiling   float64      `json:"unbounded_hit_rate"`
	Results   []Result     `json:"results"`
}

// WriteTable prints the human table.
func WriteTable(w io.Writer, rep *Report) {
	fmt.Fprintf(w, "trace %s: %d pods x %d blocks (%s), speedup %g, event lag %gs; unbounded-cache hit rate %.1f%%\n",
		rep.Trace, rep.Pods, rep.CachePer, rep.Policy, rep.Speedup, rep.EventLag, 100*rep.Ceiling)
	fmt.Fprintf(w, "%-14s %8s %9s %9s %9s %8s %9s %11s %8s\n",
		"policy", "hit%", "ttft_p50", "ttft_p90", "ttft_p99", "pod_max", "pod_mean", "cache_blks", "wall_s")
	for _, r := range rep.Results {
		fmt.Fprintf(w, "%-14s %7.1f%% %8.2fs %8.2fs %8.2fs %8d %9.1f %11d %8.2f\n",
			r.Policy, 100*r.HitRate, r.TTFTp50, r.TTFTp90, r.TTFTp99, r.PerPodMax, r.PerPodMean, r.CacheBlocksUsed, r.WallSeconds)
	}
}

// WriteMarkdown prints the table as Markdown (sim/README.md).
func WriteMarkdown(w io.Writer, rep *Report) {
	fmt.Fprintf(w, "| policy | hit rate | TTFT p50 | TTFT p90 | TTFT p99 | req/pod max | req/pod mean | cache blocks used |\n")
	fmt.Fprintf(w, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range rep.Results {
		fmt.Fprintf(w, "| %s | %.1f%% | %.2fs | %.2fs | %.2fs | %d | %.1f | %d |\n",
			r.Policy, 100*r.HitRate, r.TTFTp50, r.TTFTp90, r.TTFTp99, r.PerPodMax, r.PerPodMean, r.CacheBlocksUsed)
	}
}

// WriteJSON writes the report.
func WriteJSON(w io.Writer, rep *Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// WriteCSV writes one row per policy.
func WriteCSV(w io.Writer, rep *Report) error {
	cw := csv.NewWriter(w)
	cw.Write([]string{"policy", "requests", "prompt_tokens", "hit_tokens", "hit_rate", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s",
		"ttft_mean_s", "requests_per_pod_max", "requests_per_pod_mean", "cache_blocks_used", "makespan_s"})
	f := func(x float64) string { return strconv.FormatFloat(x, 'f', -1, 64) }
	for _, r := range rep.Results {
		cw.Write([]string{r.Policy, strconv.Itoa(r.Requests), strconv.FormatInt(r.PromptTokens, 10), strconv.FormatInt(r.HitTokens, 10),
			f(r.HitRate), f(r.TTFTp50), f(r.TTFTp90), f(r.TTFTp99), f(r.TTFTMean), strconv.Itoa(r.PerPodMax), f(r.PerPodMean),
			strconv.Itoa(r.CacheBlocksUsed), f(r.Makespan)})
	}
	cw.Flush()
	return cw.Error()
}

// WriteSVG draws one row per policy with two aligned bar panels: prompt-token
// hit rate (the unbounded-cache ceiling as a dashed line) and TTFT p50 over
// p90. Axes end at a round value with gridlines at each tick, every bar
// carries its value, and the layout is sized from the longest label so
// nothing is clipped. Hand-written SVG, no dependencies.
func WriteSVG(w io.Writer, rep *Report) error {
	const (
		charW  = 7 // generous average width of a 12px sans-serif glyph
		margin = 12
		plotW  = 300
		rowH   = 26
		barH   = 18
		top    = 92 // title, subtitle, panel headers and legends above the rows
	)
	labelW := 12 * charW
	hitMax := rep.Ceiling
	ttftMax := 0.0
	for _, r := range rep.Results {
		labelW = max(labelW, len(r.Policy)*charW)
		hitMax = max(hitMax, r.HitRate)
		ttftMax = max(ttftMax, r.TTFTp90)
	}
	hitTop, hitStep := niceAxis(100 * hitMax)
	hitTop = min(hitTop, 100)
	tTop, tStep := niceAxis(ttftMax)
	// Room right of the longest bar for its value label ("100.0%", "12.34 / 56.78").
	hitValW, tValW := 7*charW, 15*charW
	x1 := margin + labelW + 10           // hit-rate panel
	x2 := x1 + plotW + hitValW + 4*charW // TTFT panel
	n := len(rep.Results)
	axisY := top + n*rowH + 4
	height := axisY + 40
	title := fmt.Sprintf("%s: %d pods x %d blocks (%s), speedup %g, event lag %gs",
		rep.Trace, rep.Pods, rep.CachePer, rep.Policy, rep.Speedup, rep.EventLag)
	width := max(x2+plotW+tValW+margin, margin+len(title)*8+margin)

	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`,
		width, height, width, height)
	p(`<rect width="100%%" height="100%%" fill="white"/>`)
	p(`<text x="%d" y="22" font-size="14" font-weight="bold">%s</text>`, margin, html.EscapeString(title))
	p(`<text x="%d" y="40" fill="#555">per routing policy, simulated fleet (service model: sim/README.md)</text>`, margin)

	// Panel headers and legends.
	p(`<text x="%d" y="62" font-weight="bold">Prompt-token hit rate (higher is better)</text>`, x1)
	p(`<line x1="%d" y1="76" x2="%d" y2="76" stroke="#c0392b" stroke-width="1.5" stroke-dasharray="4,3"/>`, x1, x1+18)
	p(`<text x="%d" y="80">unbounded cache %.1f%%</text>`, x1+24, 100*rep.Ceiling)
	p(`<text x="%d" y="62" font-weight="bold">Time to first token, s (lower is better)</text>`, x2)
	p(`<rect x="%d" y="70" width="12" height="12" fill="#ca6f1e"/>`, x2)
	p(`<text x="%d" y="80">p50</text>`, x2+16)
	p(`<rect x="%d" y="70" width="12" height="12" fill="#f0b27a"/>`, x2+50)
	p(`<text x="%d" y="80">p90</text>`, x2+66)
	p(`<text x="%d" y="80" fill="#555">(label: p50 / p90)</text>`, x2+100)

	// Gridlines and tick labels first, so bars and values draw over them.
	axis := func(x0 int, axTop, step float64, unit string) {
		for i := 0; float64(i)*step <= axTop*(1+1e-9); i++ {
			v := float64(i) * step
			gx := float64(x0) + v/axTop*plotW
			p(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`, gx, top-2, gx, axisY)
			p(`<text x="%.1f" y="%d" text-anchor="middle">%s%s</text>`, gx, axisY+16, tickLabel(v, step), unit)
		}
		p(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>`, x0, axisY, x0+plotW, axisY)
	}
	axis(x1, hitTop, hitStep, "%")
	axis(x2, tTop, tStep, "")
	p(`<text x="%d" y="%d" text-anchor="middle" fill="#555">seconds</text>`, x2+plotW/2, axisY+32)
	p(`<text x="%d" y="%d" text-anchor="middle" fill="#555">share of prompt tokens served from cache</text>`, x1+plotW/2, axisY+32)

	for i, r := range rep.Results {
		y := top + i*rowH
		p(`<text x="%d" y="%d" text-anchor="end">%s</text>`, x1-10, y+15, html.EscapeString(r.Policy))
		p(`<rect x="%d" y="%d" width="%.1f" height="%d" fill="#4a7fb5"/>`, x1, y+2, r.HitRate*100/hitTop*plotW, barH)
		p(`<rect x="%d" y="%d" width="%.1f" height="%d" fill="#f0b27a"/>`, x2, y+2, r.TTFTp90/tTop*plotW, barH)
		p(`<rect x="%d" y="%d" width="%.1f" height="%d" fill="#ca6f1e"/>`, x2, y+2, r.TTFTp50/tTop*plotW, barH)
	}
	// The ceiling goes over the bars (a fleet cannot beat it), under the values.
	cx := float64(x1) + 100*rep.Ceiling/hitTop*plotW
	p(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#c0392b" stroke-width="1.5" stroke-dasharray="4,3"/>`, cx, top-2, cx, axisY)
	halo := `paint-order="stroke" stroke="white" stroke-width="3"`
	for i, r := range rep.Results {
		y := top + i*rowH
		p(`<text x="%.1f" y="%d" %s>%.1f%%</text>`, float64(x1)+r.HitRate*100/hitTop*plotW+4, y+15, halo, 100*r.HitRate)
		p(`<text x="%.1f" y="%d" %s>%.2f / %.2f</text>`, float64(x2)+max(r.TTFTp50, r.TTFTp90)/tTop*plotW+4, y+15, halo,
			r.TTFTp50, r.TTFTp90)
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// niceAxis returns an axis end >= v on a 1-2-2.5-5 grid with about four
// steps (37.4 -> 40 by 10; 3.61 -> 4 by 1), so ticks are round numbers.
func niceAxis(v float64) (top, step float64) {
	if !(v > 0) || math.IsInf(v, 0) {
		return 1, 0.25
	}
	raw := v / 4
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if step = m * mag; step >= raw*(1-1e-9) {
			break
		}
	}
	return math.Ceil(v/step-1e-9) * step, step
}

// tickLabel prints v with just the decimals step needs (0.2 -> "0.4", 2.5 -> "7.5").
func tickLabel(v, step float64) string {
	prec := 0
	for s := step; prec < 6 && math.Abs(s-math.Round(s)) > 1e-9*math.Max(1, s); s *= 10 {
		prec++
	}
	return strconv.FormatFloat(v, 'f', prec, 64)
}
