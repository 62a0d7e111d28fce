package chattemplate

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/kvindex/kvindex/tokenization/chattemplate/jinja"
)

// normalise turns the request's messages into what vLLM hands to
// apply_chat_template for the given content format.
func normalise(raw json.RawMessage, format ContentFormat) (*jinja.ListVal, error) {
	if isNull(raw) {
		return nil, errors.New(`"messages" is required`)
	}
	v, err := jinja.FromJSON(raw)
	if err != nil {
		return nil, fmt.Errorf("messages: %w", err)
	}
	in, ok := v.(*jinja.ListVal)
	if !ok {
		return nil, errors.New("messages must be a list")
	}
	out := &jinja.ListVal{Items: make([]any, 0, len(in.Items))}
	for i, mv := range in.Items {
		m, ok := mv.(*jinja.DictVal)
		if !ok {
			return nil, fmt.Errorf("messages[%d] is not an object", i)
		}
		msg, err := normaliseMessage(m, format)
		if err != nil {
			return nil, fmt.Errorf("messages[%d]: %w", i, err)
		}
		out.Items = append(out.Items, msg)
	}
	return out, nil
}

func normaliseMessage(m *jinja.DictVal, format ContentFormat) (*jinja.DictVal, error) {
	rv, _ := m.Get("role")
	role, ok := rv.(string)
	if !ok {
		return nil, errors.New(`"role" must be a string`)
	}
	texts, err := contentTexts(m)
	if err != nil {
		return nil, err
	}
	msg := jinja.NewDict()
	_ = msg.Set("role", role)
	if format == FormatOpenAI && role != "tool" {
		parts := &jinja.ListVal{Items: make([]any, len(texts))}
		for i, t := range texts {
			p := jinja.NewDict()
			_ = p.Set("type", "text")
			_ = p.Set("text", t)
			parts.Items[i] = p
		}
		_ = msg.Set("content", parts)
	} else {
		// Tool results are joined into a string in either format.
		_ = msg.Set("content", strings.Join(texts, "\n"))
	}
	switch role {
	case "assistant":
		if tc, ok := m.Get("tool_calls"); ok && tc != nil {
			calls, err := toolCalls(tc)
			if err != nil {
				return nil, err
			}
			if calls != nil {
				_ = msg.Set("tool_calls", calls)
			}
		}
		if r, ok := m.Get("reasoning"); ok && r != nil {
			_ = msg.Set("reasoning", r)
			_ = msg.Set("reasoning_content", r)
		}
	case "tool":
		if id, ok := m.Get("tool_call_id"); ok {
			_ = msg.Set("tool_call_id", id)
		}
	}
	if name, ok := m.Get("name"); ok {
		if _, isStr := name.(string); isStr {
			_ = msg.Set("name", name)
		}
	}
	if task, ok := m.Get("task"); ok {
		if _, isStr := task.(string); isStr {
			_ = msg.Set("task", task)
		}
	}
	if role == "developer" {
		tools, _ := m.Get("tools")
		_ = msg.Set("tools", tools)
	}
	return msg, nil
}

// contentTexts returns the message's text parts: a string content is one
// part, null none.
func contentTexts(m *jinja.DictVal) ([]string, error) {
	c, _ := m.Get("content")
	switch c := c.(type) {
	case nil:
		return nil, nil
	case string:
		return []string{c}, nil
	case *jinja.ListVal:
		texts := make([]string, 0, len(c.Items))
		for i, p := range c.Items {
			switch p := p.(type) {
			case string:
				texts = append(texts, p)
			case *jinja.DictVal:
				t, err := partText(p)
				if err != nil {
					return nil, fmt.Errorf("content[%d]: %w", i, err)
				}
				if t != nil {
					texts = append(texts, *t)
				}
			default:
				return nil, fmt.Errorf("content[%d] is neither a string nor an object", i)
			}
		}
		return texts, nil
	}
	return nil, errors.New("content must be a string, a list of parts or null")
}

// partText is a text-like part's text (nil for a part without one, which
// vLLM skips); media parts are an error: they need a multimodal processor.
func partText(p *jinja.DictVal) (*string, error) {
	tv, _ := p.Get("type")
	kind, _ := tv.(string)
	field := ""
	switch kind {
	case "text", "input_text", "output_text":
		field = "text"
	case "refusal":
		field = "refusal"
	case "thinking":
		field = "thinking"
	default:
		return nil, fmt.Errorf("content part type %q is not supported (only text parts can be rendered)", kind)
	}
	v, ok := p.Get(field)
	if !ok || v == nil {
		return nil, nil
	}
	s, ok := v.(string)
	if !ok {
		return nil, fmt.Errorf("%s part's %q must be a string", kind, field)
	}
	return &s, nil
}

// toolCalls copies an assistant's tool_calls, parsing string arguments
// as JSON. It returns nil for an empty list, which vLLM drops.
func toolCalls(v any) (*jinja.ListVal, error) {
	l, ok := v.(*jinja.ListVal)
	if !ok {
		return nil, errors.New("tool_calls must be a list")
	}
	if len(l.Items) == 0 {
		return nil, nil
	}
	out := &jinja.ListVal{Items: make([]any, len(l.Items))}
	for i, it := range l.Items {
		call, ok := it.(*jinja.DictVal)
		if !ok {
			return nil, fmt.Errorf("tool_calls[%d] is not an object", i)
		}
		fv, _ := call.Get("function")
		fn, ok := fv.(*jinja.DictVal)
		if !ok {
			return nil, fmt.Errorf("tool_calls[%d].function is not an object", i)
		}
		newFn := jinja.NewDict()
		for _, k := range fn.Keys() {
			val, _ := fn.Get(k)
			_ = newFn.Set(k, val)
		}
		args, _ := fn.Get("arguments")
		switch a := args.(type) {
		case string:
			parsed, err := jinja.FromJSON([]byte(a))
			if err != nil {
				parsed = jinja.NewDict()
			}
			_ = newFn.Set("arguments", parsed)
		case *jinja.DictVal, *jinja.ListVal:
		default:
			_ = newFn.Set("arguments", jinja.NewDict())
		}
		newCall := jinja.NewDict()
		for _, k := range call.Keys() {
			val, _ := call.Get(k)
			if k == "function" {
				val = newFn
			}
			_ = newCall.Set(k, val)
		}
		out.Items[i] = newCall
	}
	return out, nil
}
