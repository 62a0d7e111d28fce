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
	Results   []result     `json:"results"`
}

// WriteTable prints the human table.
func WriteTable(w io.Writer, rep *Report) {
	fmt.Fprintf(w, "trace %s: %d pods x %d blocks (%s), speedup %g, event lag %gs; unbounded-cache hit rate %.1f%%\n",
		rep.Trace, rep.Pods, rep.CachePer, rep.Policy, rep.Speedup, rep.EventLag, 100*rep.Ceiling)
	nw := len("policy")
	for _, r := range rep.Results {
		nw = max(nw, len(r.Policy))
	}
	fmt.Fprintf(w, "%-*s %8s %9s %9s %9s %9s %8s %9s %11s %8s\n", nw,
		"policy", "hit%", "ttft_mean", "ttft_p50", "ttft_p90", "ttft_p99", "pod_max", "pod_mean", "cache_blks", "wall_s")
	for _, r := range rep.Results {
		fmt.Fprintf(w, "%-*s %7.1f%% %8.3fs %8.2fs %8.2fs %8.2fs %8d %9.1f %11d %8.2f\n", nw,
			r.Policy, 100*r.HitRate, r.TTFTMean, r.TTFTp50, r.TTFTp90, r.TTFTp99, r.PerPodMax, r.PerPodMean, r.CacheBlocksUsed, r.WallSeconds)
	}
}

// WriteMarkdown prints the table as Markdown (docs/simulator.md).
func WriteMarkdown(w io.Writer, rep *Report) {
	fmt.Fprintf(w, "| policy | hit rate | TTFT mean | TTFT p50 | TTFT p90 | TTFT p99 | req/pod max | req/pod mean | cache blocks used |\n")
	fmt.Fprintf(w, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range rep.Results {
		fmt.Fprintf(w, "| %s | %.1f%% | %.3fs | %.2fs | %.2fs | %.2fs | %d | %.1f | %d |\n",
			r.Policy, 100*r.HitRate, r.TTFTMean, r.TTFTp50, r.TTFTp90, r.TTFTp99, r.PerPodMax, r.PerPodMean, r.CacheBlocksUsed)
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
	p(`<text x="%d" y="40" fill="#555">per routing policy, simulated fleet (service model: docs/simulator.md)</text>`, margin)

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

// WriteScenarioTable prints the summary (measured stages) per scheduler.
func WriteScenarioTable(w io.Writer, rep *ScenarioReport) {
	pickers := ""
	if rep.RouterReplicas > 1 {
		// A what-if run must not pass for the committed one.
		pickers = fmt.Sprintf(", every scheduler as %d independent pickers", rep.RouterReplicas)
	}
	fmt.Fprintf(w, "scenario %s: %d pods x %d blocks of %d tokens, %d requests%s\n",
		rep.Scenario, rep.Pods, rep.KVBlocks, rep.Block, rep.Requests, pickers)
	nw := len("scheduler")
	for _, r := range rep.Results {
		nw = max(nw, len(r.Scheduler))
	}
	fmt.Fprintf(w, "%-*s %11s %8s %9s %9s %8s %7s %8s %7s %8s\n", nw,
		"scheduler", "out_tok/s", "req/s", "ttft_p90", "ttft_mean", "itl_mean", "hit%", "preempt", "succ%", "wall_s")
	for _, r := range rep.Results {
		fmt.Fprintf(w, "%-*s %11.1f %8.3f %8.3fs %8.3fs %7.4fs %6.1f%% %8d %6.1f%% %8.2f\n", nw, r.Scheduler, r.OutputTokensPerS,
			r.RequestsPerS, r.TTFTp90, r.TTFTMean, r.ITLMean, 100*r.HitRate, r.Preemptions, 100*r.SuccessRate, r.WallSeconds)
	}
}

// WriteScenarioMarkdown prints the summary and the per-stage TTFT p90 and
// throughput as Markdown tables (docs/simulator.md).
func WriteScenarioMarkdown(w io.Writer, rep *ScenarioReport) {
	fmt.Fprintf(w, "| scheduler | output tok/s | req/s | TTFT p90 | TTFT mean | ITL mean | hit rate | preemptions | success |\n")
	fmt.Fprintf(w, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range rep.Results {
		fmt.Fprintf(w, "| %s | %.0f | %.2f | %.2f s | %.2f s | %.3f s | %.1f%% | %d | %.1f%% |\n", r.Scheduler, r.OutputTokensPerS,
			r.RequestsPerS, r.TTFTp90, r.TTFTMean, r.ITLMean, 100*r.HitRate, r.Preemptions, 100*r.SuccessRate)
	}
	if len(rep.Results) == 0 {
		return
	}
	fmt.Fprintf(w, "\n| rate |")
	for _, r := range rep.Results {
		fmt.Fprintf(w, " %s TTFT p90 | %s tok/s |", r.Scheduler, r.Scheduler)
	}
	fmt.Fprintf(w, "\n| ---: |%s\n", strings.Repeat(" ---: | ---: |", len(rep.Results)))
	for s := range rep.Results[0].Stages {
		fmt.Fprintf(w, "| %g |", rep.Results[0].Stages[s].Rate)
		for _, r := range rep.Results {
			fmt.Fprintf(w, " %.2f s | %.0f |", r.Stages[s].TTFTp90, r.Stages[s].OutputTokensPerS)
		}
		fmt.Fprintln(w)
	}
}

// WriteScenarioJSON writes the report.
func WriteScenarioJSON(w io.Writer, rep *ScenarioReport) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// scenarioColors are distinguishable on white and in greyscale order.
var scenarioColors = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"}

// WriteScenarioSVG draws, per scheduler, TTFT p90 (log scale: the schedulers
// differ by orders of magnitude) and output tokens/s against the offered
// load of each stage, as the published capacity reports plot them. Warm-up
// stages are left out; stages of equal rate are distinct points in order.
func WriteScenarioSVG(w io.Writer, rep *ScenarioReport) error {
	const (
		margin = 14
		plotW  = 380
		plotH  = 260
		top    = 70
		left   = 70
		gap    = 90
	)
	type pt struct{ x, ttft, tput float64 }
	series := make([][]pt, len(rep.Results))
	xMax, tMin, tMax, yMax := 0.0, math.Inf(1), 0.0, 0.0
	for i, r := range rep.Results {
		for _, st := range r.Stages {
			if st.Stage < rep.warmup() || st.Requests == 0 {
				continue
			}
			series[i] = append(series[i], pt{st.Rate, st.TTFTp90, st.OutputTokensPerS})
			xMax, yMax = max(xMax, st.Rate), max(yMax, st.OutputTokensPerS)
			if st.TTFTp90 > 0 {
				tMin, tMax = min(tMin, st.TTFTp90), max(tMax, st.TTFTp90)
			}
		}
	}
	xTop, xStep := niceAxis(xMax)
	yTop, yStep := niceAxis(yMax)
	lo, hi := -1.0, 2.0
	if tMax > 0 {
		lo, hi = math.Floor(math.Log10(tMin)), math.Ceil(math.Log10(tMax))
		if hi <= lo {
			hi = lo + 1
		}
	}
	x1 := left
	x2 := left + plotW + gap
	legendW := 0
	for _, r := range rep.Results {
		legendW = max(legendW, 40+7*len(r.Scheduler))
	}
	width := max(x2+plotW+14+legendW+margin, margin+8*len(rep.Scenario)+margin)
	height := top + plotH + 60
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`,
		width, height, width, height)
	p(`<rect width="100%%" height="100%%" fill="white"/>`)
	p(`<text x="%d" y="22" font-size="14" font-weight="bold">%s</text>`, margin, html.EscapeString(rep.Scenario))
	p(`<text x="%d" y="40" fill="#555">%d pods x %d KV blocks of %d tokens; simulated (docs/simulator.md, engine model)</text>`,
		margin, rep.Pods, rep.KVBlocks, rep.Block)
	p(`<text x="%d" y="%d" font-weight="bold">TTFT p90, s (log scale; lower is better)</text>`, x1, top-10)
	p(`<text x="%d" y="%d" font-weight="bold">Output tokens/s (higher is better)</text>`, x2, top-10)
	xAt := func(x0 int, v float64) float64 { return float64(x0) + v/xTop*plotW }
	tAt := func(v float64) float64 {
		v = math.Max(v, math.Pow(10, lo))
		return float64(top+plotH) - (math.Log10(v)-lo)/(hi-lo)*plotH
	}
	yAt := func(v float64) float64 { return float64(top+plotH) - v/yTop*plotH }
	for _, x0 := range []int{x1, x2} {
		for i := 0; float64(i)*xStep <= xTop*(1+1e-9); i++ {
			v := float64(i) * xStep
			p(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`, xAt(x0, v), top, xAt(x0, v), top+plotH)
			p(`<text x="%.1f" y="%d" text-anchor="middle">%s</text>`, xAt(x0, v), top+plotH+16, tickLabel(v, xStep))
		}
		p(`<text x="%d" y="%d" text-anchor="middle" fill="#555">offered load, requests/s</text>`, x0+plotW/2, top+plotH+34)
		p(`<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#333"/>`, x0, top, plotW, plotH)
	}
	for e := lo; e <= hi; e++ {
		y := tAt(math.Pow(10, e))
		p(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`, x1, y, x1+plotW, y)
		p(`<text x="%d" y="%.1f" text-anchor="end">%s</text>`, x1-6, y+4, strconv.FormatFloat(math.Pow(10, e), 'g', -1, 64))
	}
	for i := 0; float64(i)*yStep <= yTop*(1+1e-9); i++ {
		v := float64(i) * yStep
		p(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`, x2, yAt(v), x2+plotW, yAt(v))
		p(`<text x="%d" y="%.1f" text-anchor="end">%s</text>`, x2-6, yAt(v)+4, tickLabel(v, yStep))
	}
	for i, r := range rep.Results {
		c := scenarioColors[i%len(scenarioColors)]
		var l1, l2 strings.Builder
		for _, q := range series[i] {
			fmt.Fprintf(&l1, "%.1f,%.1f ", xAt(x1, q.x), tAt(q.ttft))
			fmt.Fprintf(&l2, "%.1f,%.1f ", xAt(x2, q.x), yAt(q.tput))
		}
		p(`<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>`, strings.TrimSpace(l1.String()), c)
		p(`<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>`, strings.TrimSpace(l2.String()), c)
		for _, q := range series[i] {
			p(`<circle cx="%.1f" cy="%.1f" r="2.5" fill="%s"/>`, xAt(x1, q.x), tAt(q.ttft), c)
			p(`<circle cx="%.1f" cy="%.1f" r="2.5" fill="%s"/>`, xAt(x2, q.x), yAt(q.tput), c)
		}
		ly := top + 10 + i*20
		p(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3"/>`, x2+plotW+14, ly, x2+plotW+34, ly, c)
		p(`<text x="%d" y="%d">%s</text>`, x2+plotW+40, ly+4, html.EscapeString(r.Scheduler))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}
