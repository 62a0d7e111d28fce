package chattemplate

import (
	"encoding/json"
	"strings"
	"testing"
)

// FuzzRender feeds arbitrary request bodies to the Qwen3 and Gemma 3
// templates: malformed input must come back as an error, never a panic
// (which Render's last-resort recover would report as an internal error).
func FuzzRender(f *testing.F) {
	for _, s := range []string{
		`{"messages": [{"role": "user", "content": "hi"}]}`,
		`{"messages": [{"role": "assistant", "content": null, "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}], "tools": [], "continue_final_message": true, "add_generation_prompt": false}`,
		`{"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}], "chat_template_kwargs": {"enable_thinking": false}}`,
	} {
		f.Add([]byte(s))
	}
	var tpls []*Templates
	for _, d := range []string{"testdata/templates/qwen3", "testdata/templates/gemma3"} {
		tpl, err := LoadDir(d, "")
		if err != nil {
			f.Fatal(err)
		}
		tpls = append(tpls, tpl)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var req Request
		if json.Unmarshal(body, &req) != nil {
			return
		}
		for _, tpl := range tpls {
			if _, err := tpl.Render(&req); err != nil && strings.Contains(err.Error(), "internal template") {
				t.Fatalf("%s: %v", body, err)
			}
		}
	})
}
