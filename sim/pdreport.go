package sim

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// PDReport is one P/D comparison: the fleet, the workload and every
// router's result.
type PDReport struct {
	Workload string     `json:"workload"`
	Requests int        `json:"requests"`
	Config   PDConfig   `json:"config"`
	Results  []PDResult `json:"results"`
}

// RunPD runs every router on the same requests and fleet.
func RunPD(workload string, reqs []Request, cfg PDConfig, routers []string) (*PDReport, error) {
	rep := &PDReport{Workload: workload, Requests: len(reqs), Config: cfg}
	for _, r := range routers {
		res, err := SimulatePD(cfg, reqs, r)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", r, err)
		}
		rep.Results = append(rep.Results, res)
	}
	return rep, nil
}

// PDScaleKeys are the constants PDSensitivity varies.
var PDScaleKeys = []string{"transfer_per_block", "decode_capacity", "max_local_prefill_tokens"}

// Scaled returns cfg with one constant multiplied by factor (integers
// rounded, at least 1 for the decode capacity).
func (c PDConfig) Scaled(key string, factor float64) (PDConfig, error) {
	if !(factor > 0) {
		return c, fmt.Errorf("pd: scale factor must be positive")
	}
	switch key {
	case "transfer_per_block":
		c.TransferPerBlock *= factor
	case "decode_capacity":
		c.DecodeCapacity = max(1, int(float64(c.DecodeCapacity)*factor+0.5))
	case "max_local_prefill_tokens":
		c.PD.MaxLocalPrefillTokens = int(float64(c.PD.MaxLocalPrefillTokens)*factor + 0.5)
	default:
		return c, fmt.Errorf("pd: unknown constant %q (want one of %s)", key, strings.Join(PDScaleKeys, ", "))
	}
	return c, nil
}

// PDSensitivityRow is one variant of the fleet: a constant and its factor
// ("as committed" has neither).
type PDSensitivityRow struct {
	Key    string    `json:"key,omitempty"`
	Factor float64   `json:"factor,omitempty"`
	Report *PDReport `json:"report"`
}

// PDSensitivity runs the comparison as configured and with each of
// PDScaleKeys at x0.5 and x2.
func PDSensitivity(workload string, reqs []Request, cfg PDConfig, routers []string) ([]PDSensitivityRow, error) {
	rep, err := RunPD(workload, reqs, cfg, routers)
	if err != nil {
		return nil, err
	}
	rows := []PDSensitivityRow{{Report: rep}}
	for _, k := range PDScaleKeys {
		for _, f := range []float64{0.5, 2} {
			c, err := cfg.Scaled(k, f)
			if err != nil {
				return nil, err
			}
			rep, err := RunPD(workload, reqs, c, routers)
			if err != nil {
				return nil, err
			}
			rows = append(rows, PDSensitivityRow{Key: k, Factor: f, Report: rep})
		}
	}
	return rows, nil
}

func (rep *PDReport) header() string {
	c := rep.Config
	return fmt.Sprintf("workload %s: %d requests; %d prefill + %d decode pods (aggregated: %d), %d blocks (%s) each, "+
		"decode capacity %d, transfer %gs/block, threshold %d tokens, prefill queue bound %d, speedup %g, event lag %gs",
		rep.Workload, rep.Requests, c.PrefillPods, c.DecodePods, c.PrefillPods+c.DecodePods, c.Cache.Capacity, c.Cache.Policy,
		c.DecodeCapacity, c.TransferPerBlock, c.PD.MaxLocalPrefillTokens, c.PD.MaxPrefillWaiting, c.Speedup, c.EventLag)
}

// WritePDTable prints the human table.
func WritePDTable(w io.Writer, rep *PDReport) {
	fmt.Fprintln(w, rep.header())
	fmt.Fprintf(w, "%-14s %9s %9s %9s %8s %9s %6s %6s %9s %9s %7s %6s %7s\n", "router", "ttft_p50", "ttft_p90", "ttft_mean",
		"itl_ms", "out_tok/s", "hit%", "disag%", "xfer_blks", "pull_blks", "d_hit%", "early", "wall_s")
	for _, r := range rep.Results {
		fmt.Fprintf(w, "%-14s %8.3fs %8.3fs %8.3fs %8.1f %9.0f %5.1f%% %5.1f%% %9d %9d %6.1f%% %6d %7.2f\n", r.Router, r.TTFTp50,
			r.TTFTp90, r.TTFTMean, 1000*r.ITLMean, r.OutputTokensPerS, 100*r.HitRate, 100*share(r.Disaggregated, r.Requests),
			r.Transferred, r.Pulled, 100*r.DecodeLocalHit, r.EarlyTurns, r.WallSeconds)
	}
}

func share(n, of int) float64 {
	if of == 0 {
		return 0
	}
	return float64(n) / float64(of)
}

// WritePDMarkdown prints the table as Markdown (docs/simulator.md).
func WritePDMarkdown(w io.Writer, rep *PDReport) {
	fmt.Fprintln(w, "| router | TTFT p50 | TTFT p90 | TTFT mean | ITL mean | output tok/s | prompt hit | disaggregated | blocks transferred | blocks pulled | decode pod held |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, r := range rep.Results {
		fmt.Fprintf(w, "| %s | %.3f s | %.3f s | %.3f s | %.1f ms | %.0f | %.1f%% | %.1f%% | %d | %d | %.1f%% |\n", r.Router, r.TTFTp50,
			r.TTFTp90, r.TTFTMean, 1000*r.ITLMean, r.OutputTokensPerS, 100*r.HitRate, 100*share(r.Disaggregated, r.Requests),
			r.Transferred, r.Pulled, 100*r.DecodeLocalHit)
	}
}

// WritePDSensitivityMarkdown prints one row per variant: each router's
// TTFT p50 / p90 and output tokens/s.
func WritePDSensitivityMarkdown(w io.Writer, rows []PDSensitivityRow) {
	if len(rows) == 0 {
		return
	}
	fmt.Fprint(w, "| constant |")
	for _, r := range rows[0].Report.Results {
		fmt.Fprintf(w, " %s p50 / p90, tok/s |", r.Router)
	}
	fmt.Fprintln(w)
	fmt.Fprint(w, "| --- |")
	for range rows[0].Report.Results {
		fmt.Fprint(w, " ---: |")
	}
	fmt.Fprintln(w)
	for _, row := range rows {
		name := "as committed"
		if row.Key != "" {
			name = fmt.Sprintf("%s x%g", row.Key, row.Factor)
		}
		fmt.Fprintf(w, "| %s |", name)
		for _, r := range row.Report.Results {
			fmt.Fprintf(w, " %.3f / %.3f s, %.0f |", r.TTFTp50, r.TTFTp90, r.OutputTokensPerS)
		}
		fmt.Fprintln(w)
	}
}

// WritePDJSON writes v (a report or sensitivity rows) as indented JSON.
func WritePDJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
