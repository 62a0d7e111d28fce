package chattemplate

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/kvindex/kvindex/tokenization/chattemplate/jinja"
)

// The rules below re-express what vLLM's OpenAI server does to a chat
// request before apply_chat_template: the request model's validation
// (vllm/entrypoints/openai/chat_completion/protocol.py, the openai and
// vLLM TypedDicts of vllm/entrypoints/chat_utils.py) and the message parsing
// of chat_utils.py. Each function names the vLLM function it follows.

// media is how media parts are rendered for one pass: vLLM's own rendering
// ("openai" format: {"type": modality}; "string" format: a placeholder in
// front of the message's text), or a stand-in that renders as plain text so
// that comparing two passes finds where the first media item starts.
type media struct {
	// text, when non-empty, replaces every media item by this text: a text
	// part in "openai" format, the placeholder in "string" format.
	text string
	seen bool // a media item was met
}

// normalise turns the request's messages into the conversation vLLM hands
// to apply_chat_template (chat_utils.py parse_chat_messages).
func normalise(raw json.RawMessage, format ContentFormat, md *media) (*jinja.ListVal, error) {
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
		msg, err := normaliseMessage(m, format, md)
		if err != nil {
			return nil, fmt.Errorf("messages[%d]: %w", i, err)
		}
		out.Items = append(out.Items, msg)
	}
	return out, nil
}

// normaliseMessage is chat_utils.py _parse_chat_message_content plus the
// request model's renaming of reasoning_content (protocol.py
// ChatCompletionRequest._normalize_messages_before). The keys come out in
// vLLM's order: role, content, tool_calls, reasoning, reasoning_content,
// tool_call_id, name, task, tools.
func normaliseMessage(m *jinja.DictVal, format ContentFormat, md *media) (*jinja.DictVal, error) {
	rv, _ := m.Get("role")
	role, ok := rv.(string)
	if !ok {
		return nil, errors.New(`"role" must be a string`)
	}
	c, _ := m.Get("content")
	content, err := parseContent(c, format, md)
	if err != nil {
		return nil, err
	}
	msg := jinja.NewDict()
	_ = msg.Set("role", role)
	_ = msg.Set("content", content)
	switch role {
	case "assistant":
		if tc, ok := m.Get("tool_calls"); ok && tc != nil {
			calls, err := toolCalls(tc)
			if err != nil {
				return nil, err
			}
			if calls != nil { // _postprocess_messages drops an empty list
				_ = msg.Set("tool_calls", calls)
			}
		}
		r, _ := m.Get("reasoning")
		if r == nil {
			r, _ = m.Get("reasoning_content")
		}
		if r != nil {
			_ = msg.Set("reasoning", r)
			_ = msg.Set("reasoning_content", r)
		}
	case "tool":
		if id, ok := m.Get("tool_call_id"); ok {
			_ = msg.Set("tool_call_id", id)
		}
		if parts, ok := content.(*jinja.ListVal); ok {
			joined, err := toolContent(parts)
			if err != nil {
				return nil, err
			}
			if joined != nil {
				_ = msg.Set("content", *joined)
			}
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

// toolContent is the tool-message rule of _parse_chat_message_content: a
// list of only text parts becomes their texts joined with "\n"; a list with
// any other part (a tool_reference, a media item) is kept as it is (nil).
func toolContent(parts *jinja.ListVal) (*string, error) {
	texts := make([]string, 0, len(parts.Items))
	for _, p := range parts.Items {
		d, ok := p.(*jinja.DictVal)
		if !ok {
			continue
		}
		if ty, _ := d.Get("type"); ty != "text" {
			return nil, nil
		}
		t, _ := d.Get("text")
		s, ok := t.(string)
		if !ok {
			// "\n".join over a None text raises TypeError in vLLM.
			return nil, errors.New("a tool message's text part has no text")
		}
		texts = append(texts, s)
	}
	s := strings.Join(texts, "\n")
	return &s, nil
}

// partKind is one content part type of chat_utils.py MM_PARSER_MAP: the
// field holding its content and its modality ("" for text-like parts).
type partKind struct{ field, modality string }

var partKinds = map[string]partKind{
	"text": {"text", ""}, "thinking": {"thinking", ""}, "input_text": {"text", ""},
	"output_text": {"text", ""}, "refusal": {"refusal", ""}, "tool_reference": {"name", ""},
	"image_url": {"image_url", "image"}, "input_image": {"image_url", "image"}, "image_pil": {"image_pil", "image"},
	"image_embeds": {"image_embeds", "image"}, "audio_url": {"audio_url", "audio"},
	"input_audio": {"input_audio", "audio"}, "audio_embeds": {"audio_embeds", "audio"},
	"video_url": {"video_url", "video"}, "prompt_embeds": {"data", "prompt_embeds"},
}

// sniffKeys: a part without "type", or with a "uuid", is recognised by the
// first of these keys it has (_parse_chat_message_content_mm_part).
var sniffKeys = []string{"image_url", "image_pil", "image_embeds", "audio_embeds", "prompt_embeds", "audio_url",
	"input_audio", "video_url", "tool_reference"}

// classifyPart is chat_utils.py _parse_chat_message_content_mm_part: the
// part's type and content.
func classifyPart(p *jinja.DictVal) (string, any, error) {
	tv, hasType := p.Get("type")
	uuid, _ := p.Get("uuid")
	kind, isStr := tv.(string)
	if k, known := partKinds[kind]; isStr && known && uuid == nil {
		content, _ := p.Get(k.field)
		if kind == "image_url" || kind == "audio_url" || kind == "video_url" {
			if d, ok := content.(*jinja.DictVal); ok {
				content, _ = d.Get("url")
			}
		}
		return kind, content, nil
	}
	if !hasType || tv == nil || uuid != nil {
		for _, key := range sniffKeys {
			v, ok := p.Get(key)
			if key == "input_audio" {
				ok = ok && v != nil
			}
			if !ok {
				continue
			}
			switch key {
			case "tool_reference":
				v, _ = p.Get("name")
			case "prompt_embeds":
				v, _ = p.Get("data")
			}
			return key, v, nil
		}
		return "", nil, errors.New("missing 'type' field in multimodal part")
	}
	if !isStr {
		return "", nil, errors.New("invalid 'type' field in multimodal part")
	}
	return "", nil, fmt.Errorf("unsupported chat content part type: %s", kind)
}

// parseContent is chat_utils.py _parse_chat_message_content_parts: content
// as a list of {"type": ...} parts ("openai") or one string ("string").
func parseContent(c any, format ContentFormat, md *media) (any, error) {
	var parts []any
	switch c := c.(type) {
	case nil:
	case string:
		parts = []any{c}
	case *jinja.ListVal:
		parts = c.Items
	default:
		return nil, errors.New("content must be a string, a list of parts or null")
	}
	wrap := format == FormatOpenAI
	var items []any
	var texts, placeholders []string
	for i, p := range parts {
		text, isText, item, err := parsePart(p, wrap, md)
		if err != nil {
			return nil, fmt.Errorf("content[%d]: %w", i, err)
		}
		switch {
		case item != nil:
			items = append(items, item)
		case isText && text != "":
			// "if parse_res:" keeps only truthy results: a None or ""
			// text is dropped in "string" format.
			texts = append(texts, text)
		case !isText && !wrap:
			placeholders = append(placeholders, md.text)
		}
	}
	if wrap {
		return &jinja.ListVal{Items: items}, nil
	}
	// _get_full_multimodal_text_prompt with interleave_strings off: the
	// media placeholders go in front, all joined with "\n".
	if len(placeholders) > 0 {
		if len(texts) > 0 {
			placeholders = append(placeholders, strings.Join(texts, "\n"))
		}
		return strings.Join(placeholders, "\n"), nil
	}
	return strings.Join(texts, "\n"), nil
}

// parsePart is chat_utils.py _parse_chat_message_content_part. It returns
// the part as a wrapped item ("openai"), or its text (isText), or neither
// for a media item in "string" format (a placeholder goes in front).
func parsePart(p any, wrap bool, md *media) (text string, isText bool, item any, err error) {
	textItem := func(t any) any {
		d := jinja.NewDict()
		_ = d.Set("type", "text")
		_ = d.Set("text", t)
		return d
	}
	switch p := p.(type) {
	case string:
		if wrap {
			return "", true, textItem(p), nil
		}
		return p, true, nil, nil
	case *jinja.DictVal:
		kind, content, err := classifyPart(p)
		if err != nil {
			return "", false, nil, err
		}
		if (kind == "text" || kind == "refusal") && content == nil {
			return "", true, nil, nil // PART_TYPES_TO_SKIP_NONE_CONTENT
		}
		k := partKinds[kind]
		switch {
		case kind == "tool_reference":
			if wrap {
				d := jinja.NewDict()
				_ = d.Set("type", "tool_reference")
				_ = d.Set("name", content)
				return "", true, d, nil
			}
			s, _ := content.(string)
			return s, true, nil, nil
		case k.modality == "":
			if content != nil {
				if _, ok := content.(string); !ok {
					return "", false, nil, fmt.Errorf("%s part's %q must be a string", kind, k.field)
				}
			}
			if wrap {
				return "", true, textItem(content), nil
			}
			s, _ := content.(string)
			return s, true, nil, nil
		case k.modality == "prompt_embeds":
			return "", false, nil, errors.New("prompt_embeds content parts cannot be scored (no token ids)")
		}
		md.seen = true
		if !wrap {
			return "", false, nil, nil
		}
		if md.text != "" {
			return "", true, textItem(md.text), nil
		}
		d := jinja.NewDict()
		_ = d.Set("type", k.modality)
		return "", false, d, nil
	}
	return "", false, nil, errors.New("a content part must be a string or an object")
}

// toolCalls is the request model's view of an assistant's tool_calls
// (openai's ChatCompletionMessageFunctionToolCallParam: id, function
// {arguments, name} and type, all required strings, type "function"):
// pydantic rebuilds each call in that field order and drops other keys, and
// a call that does not fit is a 400. Then chat_utils.py
// _postprocess_messages parses the arguments as JSON (invalid JSON is {}).
// It returns nil for an empty list, which vLLM drops.
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
		id, _ := call.Get("id")
		ty, _ := call.Get("type")
		fv, _ := call.Get("function")
		fn, isFn := fv.(*jinja.DictVal)
		if _, ok := id.(string); !ok || ty != "function" || !isFn {
			return nil, fmt.Errorf("tool_calls[%d] needs a string id, type function and a function object", i)
		}
		args, _ := fn.Get("arguments")
		name, _ := fn.Get("name")
		argStr, ok := args.(string)
		if _, isStr := name.(string); !ok || !isStr {
			return nil, fmt.Errorf("tool_calls[%d].function needs string arguments and name (arguments is a JSON string, not an object)", i)
		}
		parsed, err := jinja.FromJSON([]byte(argStr))
		if err != nil {
			parsed = jinja.NewDict()
		}
		newFn := jinja.NewDict()
		_ = newFn.Set("arguments", parsed)
		_ = newFn.Set("name", name)
		newCall := jinja.NewDict()
		_ = newCall.Set("id", id)
		_ = newCall.Set("function", newFn)
		_ = newCall.Set("type", "function")
		out.Items[i] = newCall
	}
	return out, nil
}

// normaliseTools is the request's tools as vLLM hands them to the template:
// each parsed as ChatCompletionToolsParam (protocol.py) and dumped with
// model_dump(): {"type": "function", "function": {"name", "description",
// "parameters", ["defer_loading"], the function's other keys}, and
// "defer_loading" when set}. The tool's other keys are dropped (its
// serializer keeps model fields); the function's are kept (OpenAIBaseModel
// allows extra fields). An empty list is a 400 (check_tool_usage).
func normaliseTools(raw json.RawMessage) (*jinja.ListVal, error) {
	v, err := jinja.FromJSON(raw)
	if err != nil {
		return nil, fmt.Errorf("tools: %v", err)
	}
	in, ok := v.(*jinja.ListVal)
	if !ok {
		return nil, errors.New("tools must be a list")
	}
	if len(in.Items) == 0 {
		return nil, errors.New("`tools` must not be an empty array; omit the field instead")
	}
	out := &jinja.ListVal{Items: make([]any, len(in.Items))}
	for i, it := range in.Items {
		t, ok := it.(*jinja.DictVal)
		fv, _ := t.Get("function")
		fn, isFn := fv.(*jinja.DictVal)
		if !ok || !isFn {
			return nil, fmt.Errorf("tools[%d] needs a function object", i)
		}
		if ty, has := t.Get("type"); has && ty != "function" {
			return nil, fmt.Errorf("tools[%d].type must be function", i)
		}
		name, _ := fn.Get("name")
		if _, ok := name.(string); !ok {
			return nil, fmt.Errorf("tools[%d].function.name must be a string", i)
		}
		desc, _ := fn.Get("description")
		if _, ok := desc.(string); !ok && desc != nil {
			return nil, fmt.Errorf("tools[%d].function.description must be a string", i)
		}
		params, _ := fn.Get("parameters")
		if _, ok := params.(*jinja.DictVal); !ok && params != nil {
			return nil, fmt.Errorf("tools[%d].function.parameters must be an object", i)
		}
		toolDefer, _ := t.Get("defer_loading")
		fnDefer, _ := fn.Get("defer_loading")
		for _, d := range []any{toolDefer, fnDefer} {
			if _, ok := d.(bool); !ok && d != nil {
				return nil, fmt.Errorf("tools[%d] defer_loading must be a boolean", i)
			}
		}
		f := jinja.NewDict()
		_ = f.Set("name", name)
		_ = f.Set("description", desc)
		_ = f.Set("parameters", params)
		if fnDefer == nil {
			fnDefer = toolDefer // _propagate_defer_loading
		}
		if fnDefer != nil {
			_ = f.Set("defer_loading", fnDefer)
		}
		for _, k := range fn.Keys() {
			if _, done := f.Get(k); done || k == "defer_loading" {
				continue
			}
			val, _ := fn.Get(k)
			_ = f.Set(k, val)
		}
		tool := jinja.NewDict()
		_ = tool.Set("type", "function")
		_ = tool.Set("function", f)
		if toolDefer != nil {
			_ = tool.Set("defer_loading", toolDefer)
		}
		out.Items[i] = tool
	}
	return out, nil
}

// checkDocuments is ChatCompletionRequest.documents: list[dict[str, str]].
func checkDocuments(v any) error {
	l, ok := v.(*jinja.ListVal)
	if !ok {
		return errors.New("documents must be a list of objects with string values")
	}
	for _, d := range l.Items {
		dv, ok := d.(*jinja.DictVal)
		if !ok {
			return errors.New("documents must be a list of objects with string values")
		}
		for _, k := range dv.Keys() {
			if val, _ := dv.Get(k); !isString(val) {
				return errors.New("documents must be a list of objects with string values")
			}
		}
	}
	return nil
}

func isString(v any) bool { _, ok := v.(string); return ok }
