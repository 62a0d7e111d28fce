package promises

import (
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/testkit/harness"
	"github.com/kvindex/kvindex/internal/testkit/race"
)

// hugePrompt streams the JSON of a score request whose prompt is n bytes of
// 'a', without holding it: the client's memory is not the daemon's.
type hugePrompt struct {
	head, tail []byte
	n          int
}

func newHugePrompt(n int) *hugePrompt {
	return &hugePrompt{head: []byte(`{"model":"` + model + `","prompt":"`), tail: []byte(`"}`), n: n}
}

func (h *hugePrompt) Read(p []byte) (int, error) {
	switch {
	case len(h.head) > 0:
		k := copy(p, h.head)
		h.head = h.head[k:]
		return k, nil
	case h.n > 0:
		k := min(len(p), h.n)
		for i := range k {
			p[i] = 'a'
		}
		h.n -= k
		return k, nil
	case len(h.tail) > 0:
		k := copy(p, h.tail)
		h.tail = h.tail[k:]
		return k, nil
	}
	return 0, io.EOF
}

// Issue 35: the prompt cap is applied before the body is decoded. A body
// is capped at what the largest prompt needs (3 x --max-prompt-bytes +
// 1 MiB: 25 MiB at the defaults), refused with 413 at once when its
// Content-Length says more, and bodies over 1 MiB share a 64 MiB budget
// (--http-body-budget-bytes; 503 after 2 s without room). 32 clients
// sending 60 MB prompts at once, with a length and then chunked (no
// length: read up to the cap), keep the daemon's peak RSS far below the
// 4.9 GB the same attack took when every body was read and decoded, and a
// normal prompt is scored meanwhile.
func TestPromiseBodyBudget(t *testing.T) {
	t.Parallel()
	harness.Heavy(t)
	d := harness.Start(t, tokenizerFlag(t))
	if code, body := scorePrompt(d, "warm the tokenizer"); code != http.StatusOK {
		t.Fatalf("warm-up: %d %s", code, body)
	}
	const clients, size = 32, 60 << 20
	attack := func(chunked bool) map[int]int {
		var mu sync.Mutex
		codes := map[int]int{}
		var wg sync.WaitGroup
		for range clients {
			wg.Go(func() {
				var body io.Reader = newHugePrompt(size)
				req, err := http.NewRequest("POST", "http://"+d.HTTP+"/v1/score", body)
				if err != nil {
					t.Error(err)
					return
				}
				if !chunked {
					req.ContentLength = int64(size + len(`{"model":"`+model+`","prompt":""}`))
				}
				req.Header.Set("Content-Type", "application/json")
				code := 0 // the daemon closed the connection while the body was sent
				if resp, err := (&http.Client{Timeout: answerLimit}).Do(req); err == nil {
					code = resp.StatusCode
					resp.Body.Close()
				}
				mu.Lock()
				codes[code]++
				mu.Unlock()
			})
		}
		stop := make(chan struct{})
		var worst time.Duration
		normal := make(chan struct{})
		go func() {
			defer close(normal)
			for {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				if code, body := scorePrompt(d, "a prompt of usual size"); code != http.StatusOK {
					t.Errorf("a normal prompt during the attack: %d %s", code, body)
				}
				worst = max(worst, time.Since(start))
				time.Sleep(100 * time.Millisecond)
			}
		}()
		wg.Wait()
		close(stop)
		<-normal
		t.Logf("chunked=%v: answers %v; slowest normal prompt %v", chunked, codes, worst)
		return codes
	}
	if codes := attack(false); codes[http.StatusRequestEntityTooLarge] != clients {
		t.Errorf("60 MB bodies with a Content-Length: %v, want %d x 413", codes, clients)
	}
	codes := attack(true)
	if codes[http.StatusOK] != 0 {
		t.Errorf("chunked 60 MB prompts: %v, none may be scored", codes)
	}
	rss := d.PeakRSS()
	t.Logf("peak RSS %d MB; %v bodies refused by the budget", rss>>20, d.Metric("kvindexd_http_body_budget_rejected_total"))
	if rss > 1<<30 && !race.Enabled {
		t.Errorf("peak RSS %d MB with %d hostile 60 MB bodies, want below 1 GiB", rss>>20, clients)
	}
	if code, body := scorePrompt(d, "a prompt of usual size"); code != http.StatusOK {
		t.Fatalf("after the attack: %d %s", code, body)
	}
}
