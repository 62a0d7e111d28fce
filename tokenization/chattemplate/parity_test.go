package chattemplate

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/tokenization/chattemplate/jinja"
)

// The golden renders come from hack/chat/gen_golden.py: Debian's
// python3-jinja2 set up as transformers sets it up for chat templates, with
// vLLM's message normalisation in front. Regenerate with
// `hack/chat/gen_golden.py` after changing a template or conversation.

// fixedNow is the strftime_now instant gen_golden.py pins (FIXED_NOW).
var fixedNow = time.Date(2026, 1, 15, 9, 30, 5, 0, time.UTC)

type golden struct {
	Case   string `json:"case"`
	Format string `json:"format"`
	Prompt string `json:"prompt"`
	Raised string `json:"raised"`
	Error  string `json:"error"`
	// Media: the request has media parts. In "openai" format the prompt is
	// vLLM's; in "string" format it holds vLLM's generic markers
	// (<##IMAGE##>, ...) where the model's placeholders go.
	Media bool `json:"media"`
}

func readJSONL[T any](t testing.TB, path string) []T {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(path, ".gz") {
		zr, err := gzip.NewReader(f)
		if err != nil {
			t.Fatal(err)
		}
		r = zr
	}
	var out []T
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var v T
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, v)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

type conversation struct {
	Name string `json:"name"`
	Request
}

func TestParityWithJinja2(t *testing.T) {
	cases := readJSONL[conversation](t, "testdata/parity/conversations.jsonl")
	if len(cases) < 30 {
		t.Fatalf("only %d conversations", len(cases))
	}
	checkParity(t, cases, ".jsonl")
}

// TestRandomParityWithJinja2 does the same for 150 seeded random
// conversations (hack/chat/gen_golden.py random_conversations): any mix of
// roles, content strings/parts/null, tool calls with all argument forms,
// reasoning, generation prompt and continuation flags, kwargs.
func TestRandomParityWithJinja2(t *testing.T) {
	cases := readJSONL[conversation](t, "testdata/parity/conversations_random.jsonl.gz")
	if len(cases) < 150 {
		t.Fatalf("only %d conversations", len(cases))
	}
	checkParity(t, cases, ".random.jsonl.gz")
}

func checkParity(t *testing.T, cases []conversation, goldenSuffix string) {
	dirs, err := filepath.Glob("testdata/templates/*")
	if err != nil || len(dirs) < 8 {
		t.Fatalf("templates: %v %v", dirs, err)
	}
	sort.Strings(dirs)
	for _, dir := range dirs {
		name := filepath.Base(dir)
		t.Run(name, func(t *testing.T) {
			tpl, err := LoadDir(dir, "", WithClock(func() time.Time { return fixedNow }))
			if err != nil {
				t.Fatalf("load: %v", err)
			}
			want := readJSONL[golden](t, filepath.Join("testdata/parity/golden", name+goldenSuffix))
			if len(want) != len(cases) {
				t.Fatalf("%d goldens for %d conversations: rerun hack/chat/gen_golden.py", len(want), len(cases))
			}
			equal := 0
			for i, c := range cases {
				g := want[i]
				if g.Case != c.Name {
					t.Fatalf("golden %d is %q, conversation is %q", i, g.Case, c.Name)
				}
				p, err := tpl.Render(&c.Request)
				got := p.Text
				if err == nil && g.Media {
					if !mediaParity(t, c.Name, p, g) {
						continue
					}
					got = g.Prompt
				}
				switch {
				case g.Raised != "":
					var re *jinja.RaisedError
					if !errors.As(err, &re) || re.Message != g.Raised {
						t.Errorf("%s: want raise_exception(%q), got %q, %v", c.Name, g.Raised, got, err)
						continue
					}
				case g.Error != "":
					var rq *RequestError
					if !errors.As(err, &rq) {
						t.Errorf("%s: want an error like %q, got %q, %v", c.Name, g.Error, got, err)
						continue
					}
				default:
					if err != nil {
						t.Errorf("%s: %v", c.Name, err)
						continue
					}
					if got != g.Prompt {
						t.Errorf("%s: render differs\n got: %q\nwant: %q", c.Name, got, g.Prompt)
						continue
					}
					hasTools := !isNull(c.Tools)
					if f, _ := tpl.ContentFormat(hasTools); string(f) != g.Format {
						t.Errorf("%s: content format %s, reference %s", c.Name, f, g.Format)
						continue
					}
				}
				equal++
			}
			t.Logf("%s: %d/%d equal to the Jinja2 reference", name, equal, len(cases))
		})
	}
}

// TestGoldensAreCurrent reruns the Jinja2 reference over the committed
// inputs so a changed template, conversation or snippet cannot leave stale
// goldens behind. It needs /usr/bin/python3 with python3-jinja2; without it
// the test skips, or fails when KVINDEX_REQUIRE_INTEROP is set (as in CI).
func TestGoldensAreCurrent(t *testing.T) {
	if err := exec.Command("/usr/bin/python3", "-c", "import jinja2").Run(); err != nil {
		if os.Getenv("KVINDEX_REQUIRE_INTEROP") != "" {
			t.Fatalf("/usr/bin/python3 with jinja2 is required: %v", err)
		}
		t.Skipf("no /usr/bin/python3 with jinja2 (hack/test-deps.sh installs it): %v", err)
	}
	out, err := exec.Command("/usr/bin/python3", "../../hack/chat/gen_golden.py", "--check").CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
}

// mediaParity checks a prompt with media against the reference: the whole
// prompt in "openai" format with the first media item after MediaAt; in
// "string" format the text before the first media marker, exactly.
func mediaParity(t *testing.T, name string, p Prompt, g golden) bool {
	t.Helper()
	if p.MediaAt < 0 {
		t.Errorf("%s: media not found", name)
		return false
	}
	if g.Format == string(FormatString) {
		at := strings.Index(g.Prompt, "<##")
		if !p.Cut || at < 0 || p.Text != g.Prompt[:at] || p.MediaAt != at {
			t.Errorf("%s: text before the media %q (at %d), reference %q", name, p.Text, p.MediaAt, g.Prompt[:max(at, 0)])
			return false
		}
		return true
	}
	if p.Cut || p.Text != g.Prompt || p.MediaAt > len(p.Text) {
		t.Errorf("%s: render differs\n got: %q\nwant: %q", name, p.Text, g.Prompt)
		return false
	}
	return true
}
