package sim

import (
	"math"
	"testing"
)

func TestEngineAbortFreesBlocksEverywhere(t *testing.T) {
	e := testEngine(t, 20, 4, 8, 64)
	for i := 0; i < 4; i++ {
		if err := e.Add(i, 10, 5, nil, uint64(i)); err != nil {
			t.Fatal(err)
		}
	}
	if e.Add(1, 10, 5, nil, 1) == nil {
		t.Fatal("a request added twice was accepted")
	}
	// Idle engine, queued request: leaves the queue at once.
	if !e.Abort(3) || e.Waiting() != 3 {
		t.Fatalf("abort of a queued request: waiting %d", e.Waiting())
	}
	checkPool(t, e)
	if e.Abort(3) || e.Abort(99) {
		t.Fatal("abort of a request not in the engine reported true")
	}
	if _, ok := e.StartStep(); !ok {
		t.Fatal("no step")
	}
	// Request 0 is in the step in progress: it leaves when the step ends,
	// without sampling a token.
	if !e.Abort(0) {
		t.Fatal("abort of a running request reported false")
	}
	out := e.FinishStep(nil)
	for _, p := range out {
		if p.Req == 0 {
			t.Fatalf("an aborted request sampled a token: %+v", p)
		}
	}
	checkPool(t, e)
	for _, s := range e.running {
		if s.req == 0 {
			t.Fatal("aborted request still running")
		}
	}
	// Request 1 is running between steps: its blocks are freed at once.
	used := e.UsedBlocks()
	if !e.Abort(1) || e.UsedBlocks() >= used {
		t.Fatalf("abort between steps: used blocks %d -> %d", used, e.UsedBlocks())
	}
	checkPool(t, e)
	all, _ := runEngine(t, e, 1000)
	finished := 0
	for _, p := range all {
		if p.Req != 2 {
			t.Fatalf("aborted request %d progressed: %+v", p.Req, p)
		}
		if p.Finished {
			finished++
		}
	}
	st := e.Stats()
	if finished != 1 || st.FinishedSeqs != 1 || st.AbortedSeqs != 3 || e.UsedBlocks() != 0 || len(e.byReq) != 0 {
		t.Fatalf("finished %d, stats %+v, used %d, tracked %d", finished, st, e.UsedBlocks(), len(e.byReq))
	}
}

// inferencePerfSmall is the small scenario with inference-perf's client.
func inferencePerfSmall(t *testing.T, client string) *Scenario {
	t.Helper()
	return parseSmall(t, "client:\n  type: inference-perf\n"+client)
}

func TestInferencePerfClientDrainsStagesAndBoundsConcurrency(t *testing.T) {
	sc := inferencePerfSmall(t, "  stage_gap_s: 0.5\n  max_concurrency: 4\n  request_overhead_s: 0.05\n")
	wl := sc.GenerateWorkload()
	count := make([]int, len(sc.Load.Stages))
	for _, q := range wl.Requests {
		count[q.Stage]++
	}
	for s, st := range sc.Load.Stages {
		if count[s] != int(st.Rate*st.Duration) {
			t.Fatalf("stage %d: %d requests, inference-perf sends int(rate x duration) = %d", s, count[s], int(st.Rate*st.Duration))
		}
	}
	for _, name := range []string{"precise", "random"} {
		run, err := NewScenarioRun(sc, wl, SchedulerSpec{Name: name})
		if err != nil {
			t.Fatal(err)
		}
		run.OnStep = func(_ int, e *Engine) {
			checkPool(t, e)
			if run.outstanding > 4 {
				t.Fatalf("%s: %d requests outstanding, bound 4", name, run.outstanding)
			}
		}
		res, err := run.Run()
		if err != nil {
			t.Fatal(err)
		}
		if run.maxOut != 4 {
			t.Errorf("%s: at most %d outstanding: the bound was never reached (or exceeded)", name, run.maxOut)
		}
		lastEnd := make([]float64, len(count))
		firstSend := make([]float64, len(count))
		for s := range firstSend {
			firstSend[s], lastEnd[s] = math.Inf(1), math.Inf(-1)
		}
		prevSend := -1.0
		for i, rec := range run.records {
			q := &wl.Requests[i]
			if !rec.done || rec.failed || rec.generated != q.OutputLen {
				t.Fatalf("%s: request %d: %+v", name, i, rec)
			}
			// The client queue is FIFO: requests are sent in order.
			if rec.send < prevSend {
				t.Fatalf("%s: request %d sent at %.3f before its predecessor (%.3f)", name, i, rec.send, prevSend)
			}
			prevSend = rec.send
			if rec.firstToken-rec.send < sc.Client.RequestOverhead {
				t.Fatalf("%s: request %d TTFT %.3f below the overhead", name, i, rec.firstToken-rec.send)
			}
			firstSend[q.Stage] = min(firstSend[q.Stage], rec.send)
			lastEnd[q.Stage] = max(lastEnd[q.Stage], rec.finish)
		}
		for s := 1; s < len(count); s++ {
			if firstSend[s] < lastEnd[s-1]+sc.Client.StageGap {
				t.Errorf("%s: stage %d started at %.3f before stage %d drained (%.3f) + gap", name, s, firstSend[s], s-1, lastEnd[s-1])
			}
		}
		// Throughput as inference-perf reports it: tokens over first send
		// to last response.
		for s, st := range res.Stages {
			want := float64(count[s]*sc.Data.OutputLen) / (lastEnd[s] - firstSend[s])
			if math.Abs(st.OutputTokensPerS-want) > 1e-9*want || st.SuccessRate != 1 {
				t.Errorf("%s: stage %d: %.3f tok/s, success %.2f; want %.3f, 1", name, s, st.OutputTokensPerS, st.SuccessRate, want)
			}
		}
	}
}

func TestClientTimeoutAbortsOnThePodAndConserves(t *testing.T) {
	// The 30 req/s stage overloads the small fleet: with a 1.5 s timeout
	// some requests fail and their pods abort them.
	sc := parseSmall(t, "client:\n  timeout_s: 1.5\n  request_overhead_s: 0.01\n")
	wl := sc.GenerateWorkload()
	for _, name := range []string{"precise", "random"} {
		run, err := NewScenarioRun(sc, wl, SchedulerSpec{Name: name})
		if err != nil {
			t.Fatal(err)
		}
		run.OnStep = func(pod int, e *Engine) { checkPool(t, e) }
		res, err := run.Run()
		if err != nil {
			t.Fatal(err)
		}
		done, failed := 0, 0
		for i, rec := range run.records {
			switch {
			case rec.done == rec.failed:
				t.Fatalf("%s: request %d ended %v times", name, i, rec.done)
			case rec.failed && math.Abs(rec.finish-rec.send-1.5) > 1e-9:
				t.Fatalf("%s: request %d failed %.3f s after its send", name, i, rec.finish-rec.send)
			case rec.done && rec.finish-rec.send > 1.5:
				t.Fatalf("%s: request %d finished after its timeout", name, i)
			case rec.done:
				done++
			default:
				failed++
			}
		}
		fin, ab := 0, 0
		for _, e := range run.engines {
			st := e.Stats()
			fin, ab = fin+st.FinishedSeqs, ab+st.AbortedSeqs
			if e.UsedBlocks() != 0 || e.Running() != 0 || e.Waiting() != 0 || len(e.byReq) != 0 {
				t.Errorf("%s: an engine still holds requests or blocks", name)
			}
		}
		if failed == 0 || done == 0 || fin != done || ab != failed {
			t.Fatalf("%s: done %d failed %d; engines finished %d aborted %d", name, done, failed, fin, ab)
		}
		measured, measuredDone := 0, 0
		for i, rec := range run.records {
			if wl.Requests[i].Stage >= sc.Load.WarmupStages {
				measured++
				if rec.done {
					measuredDone++
				}
			}
		}
		if want := float64(measuredDone) / float64(measured); math.Abs(res.SuccessRate-want) > 1e-12 || want >= 1 {
			t.Errorf("%s: summary success rate %.3f, want %.3f (< 1)", name, res.SuccessRate, want)
		}
	}
}
