package sim

import (
	"math"
	"slices"
	"testing"
)

func TestEngineAbortFreesBlocksEverywhere(t *testing.T) {
	e := testEngine(t, 20, 4, 8, 64)
	for i := 0; i < 4; i++ {
		if err := e.add(i, 10, 5, nil, uint64(i)); err != nil {
			t.Fatal(err)
		}
	}
	if e.add(1, 10, 5, nil, 1) == nil {
		t.Fatal("a request added twice was accepted")
	}
	// Idle engine, queued request: leaves the queue at once.
	if !e.abort(3) || e.numWaiting() != 3 {
		t.Fatalf("abort of a queued request: waiting %d", e.numWaiting())
	}
	checkPool(t, e)
	if e.abort(3) || e.abort(99) {
		t.Fatal("abort of a request not in the engine reported true")
	}
	if _, ok := e.startStep(); !ok {
		t.Fatal("no step")
	}
	// Request 0 is in the step in progress: it leaves when the step ends,
	// without sampling a token.
	if !e.abort(0) {
		t.Fatal("abort of a running request reported false")
	}
	out := e.finishStep(nil)
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
	used := e.usedBlocks()
	if !e.abort(1) || e.usedBlocks() >= used {
		t.Fatalf("abort between steps: used blocks %d -> %d", used, e.usedBlocks())
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
	st := e.statsNow()
	if finished != 1 || st.FinishedSeqs != 1 || st.AbortedSeqs != 3 || e.usedBlocks() != 0 || len(e.byReq) != 0 {
		t.Fatalf("finished %d, stats %+v, used %d, tracked %d", finished, st, e.usedBlocks(), len(e.byReq))
	}
}

// inferencePerfSmall is the small scenario with inference-perf's client.
func inferencePerfSmall(t *testing.T, client string) *Scenario {
	t.Helper()
	return parseSmall(t, "client:\n  type: inference-perf\n"+client)
}

func TestInferencePerfClientDrainsStagesAndBoundsConcurrency(t *testing.T) {
	sc := inferencePerfSmall(t, "  stage_gap_s: 0.5\n  max_concurrency: 4\n  request_overhead_s: 0.05\n")
	wl := sc.generateWorkload()
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
		run, err := newScenarioRun(sc, wl, schedulerSpec{Name: name})
		if err != nil {
			t.Fatal(err)
		}
		run.OnStep = func(_ int, e *engine) {
			checkPool(t, e)
			if run.outstanding > 4 {
				t.Fatalf("%s: %d requests outstanding, bound 4", name, run.outstanding)
			}
		}
		res, err := run.run()
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
	wl := sc.generateWorkload()
	for _, name := range []string{"precise", "random"} {
		run, err := newScenarioRun(sc, wl, schedulerSpec{Name: name})
		if err != nil {
			t.Fatal(err)
		}
		run.OnStep = func(pod int, e *engine) { checkPool(t, e) }
		res, err := run.run()
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
			st := e.statsNow()
			fin, ab = fin+st.FinishedSeqs, ab+st.AbortedSeqs
			if e.usedBlocks() != 0 || e.numRunning() != 0 || e.numWaiting() != 0 || len(e.byReq) != 0 {
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

func TestGatewayLimitRefusesAtOnceAndNeverQueues(t *testing.T) {
	// The small scenario's 30 req/s stage keeps more than 6 requests in
	// flight, so a limit of 6 refuses some sends.
	const limit = 6
	sc := inferencePerfSmall(t, "  gateway_max_active: 6\n  request_overhead_s: 0.01\n")
	wl := sc.generateWorkload()
	for _, name := range []string{"precise", "random"} {
		run, err := newScenarioRun(sc, wl, schedulerSpec{Name: name})
		if err != nil {
			t.Fatal(err)
		}
		maxActive := 0
		run.OnStep = func(_ int, e *engine) {
			checkPool(t, e)
			maxActive = max(maxActive, run.gwActive)
			onPods := 0
			for _, e := range run.engines {
				onPods += len(e.byReq)
			}
			if onPods > limit || run.gwActive > limit {
				t.Fatalf("%s: %d requests on the pods, %d admitted by the gateway; limit %d", name, onPods, run.gwActive, limit)
			}
		}
		res, err := run.run()
		if err != nil {
			t.Fatal(err)
		}
		if maxActive != limit {
			t.Errorf("%s: at most %d admitted at once: the limit was never reached (or exceeded)", name, maxActive)
		}
		rejected, done, delivered := 0, 0, 0
		for i, rec := range run.records {
			switch {
			case rec.rejected:
				rejected++
				// Refused at once: ends at its send, fails, never reaches a pod.
				if !rec.failed || rec.done || rec.delivered || rec.finish != rec.send || rec.generated != 0 {
					t.Fatalf("%s: rejected request %d: %+v", name, i, rec)
				}
			case rec.done:
				done++
			default:
				t.Fatalf("%s: request %d neither rejected nor finished: %+v", name, i, rec)
			}
			if rec.delivered {
				delivered++
			}
		}
		if rejected == 0 || done == 0 || delivered != done {
			t.Fatalf("%s: rejected %d, done %d, delivered %d", name, rejected, done, delivered)
		}
		perPod := 0
		for _, n := range res.PerPodRequests {
			perPod += n
		}
		if perPod != done {
			t.Errorf("%s: requests per pod sum to %d, but %d reached a pod", name, perPod, done)
		}
		if res.SuccessRate >= 1 || res.SuccessRate <= 0 {
			t.Errorf("%s: success rate %.3f with %d refused", name, res.SuccessRate, rejected)
		}
	}
}

func TestGatewayLimitAboveTheLoadChangesNothing(t *testing.T) {
	base := inferencePerfSmall(t, "  request_overhead_s: 0.01\n")
	limited := inferencePerfSmall(t, "  request_overhead_s: 0.01\n  gateway_max_active: 100000\n")
	a, err := RunScenario(base)
	if err != nil {
		t.Fatal(err)
	}
	b, err := RunScenario(limited)
	if err != nil {
		t.Fatal(err)
	}
	for i := range a.Results {
		x, y := a.Results[i], b.Results[i]
		if x.OutputTokensPerS != y.OutputTokensPerS || x.TTFTp90 != y.TTFTp90 || x.SuccessRate != 1 || y.SuccessRate != 1 {
			t.Errorf("%s: a limit nobody reaches changed the result: %+v vs %+v", x.Scheduler, x.stageResult, y.stageResult)
		}
	}
}

func TestRequestOverheadExponentialPart(t *testing.T) {
	sc := inferencePerfSmall(t, "  request_overhead_s: 0.03\n  request_overhead_exp_s: 0.15\n")
	wl := sc.generateWorkload()
	run, err := newScenarioRun(sc, wl, schedulerSpec{Name: "random"})
	if err != nil {
		t.Fatal(err)
	}
	other, err := newScenarioRun(sc, wl, schedulerSpec{Name: "precise"})
	if err != nil {
		t.Fatal(err)
	}
	// Many draws: the mean and the p90 of fixed + Exp(mean 0.15).
	const n = 200000
	draws := make([]float64, n)
	sum := 0.0
	for i := range draws {
		o := run.overhead(i)
		if o < 0.03 || math.IsInf(o, 0) || math.IsNaN(o) {
			t.Fatalf("draw %d: %v, below the fixed part or not finite", i, o)
		}
		if o != other.overhead(i) {
			t.Fatalf("draw %d differs between schedulers: %v vs %v", i, o, other.overhead(i))
		}
		draws[i] = o
		sum += o
	}
	slices.Sort(draws)
	if mean := sum / n; math.Abs(mean-0.18) > 0.003 {
		t.Errorf("mean overhead %.4f, want 0.03 + 0.15", mean)
	}
	if p90, want := quantile(draws, 0.9), 0.03+0.15*math.Log(10); math.Abs(p90-want) > 0.005 {
		t.Errorf("p90 overhead %.4f, want %.4f (0.03 + 0.15 ln 10)", p90, want)
	}
	// In a run, every TTFT includes at least the fixed part and the
	// request's own draw.
	if _, err := run.run(); err != nil {
		t.Fatal(err)
	}
	for i, rec := range run.records {
		if rec.done && rec.firstToken-rec.send < run.overhead(i) {
			t.Fatalf("request %d: TTFT %.4f below its overhead %.4f", i, rec.firstToken-rec.send, run.overhead(i))
		}
	}
}

func TestInferencePerfStagesStartAtTheFirstPrompt(t *testing.T) {
	// inference-perf numbers each stage's requests from 0 and sends prompt
	// n mod prompts; the open client cycles through the order across
	// stages. Both use the same seeded order.
	ip := inferencePerfSmall(t, "").generateWorkload()
	open := parseSmall(t, "").generateWorkload()
	nPrompts := len(ip.Prompts)
	var order []int // the shared order, from the open client's first cycle
	for _, q := range open.Requests[:min(nPrompts, len(open.Requests))] {
		order = append(order, q.Prompt.ID)
	}
	if len(order) < nPrompts {
		t.Fatalf("the small scenario sends %d requests, fewer than its %d prompts", len(open.Requests), nPrompts)
	}
	n, stage := 0, -1
	for i, q := range ip.Requests {
		if q.Stage != stage {
			n, stage = 0, q.Stage
		}
		if want := order[n%nPrompts]; q.Prompt.ID != want {
			t.Fatalf("inference-perf request %d (stage %d, #%d): prompt %d, want %d", i, q.Stage, n, q.Prompt.ID, want)
		}
		n++
	}
	restarted := false
	for i, q := range open.Requests {
		if q.Prompt.ID != order[i%nPrompts] {
			t.Fatalf("open request %d: prompt %d, want %d (one cycle across stages)", i, q.Prompt.ID, order[i%nPrompts])
		}
		if i > 0 && q.Stage != open.Requests[i-1].Stage && i%nPrompts != 0 {
			restarted = true // a stage boundary inside a cycle: the two clients differ there
		}
	}
	if !restarted {
		t.Fatal("no stage boundary falls inside a cycle: the test cannot tell the clients apart")
	}
}
