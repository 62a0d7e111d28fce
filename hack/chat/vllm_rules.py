"""vLLM's OpenAI-server preprocessing of a chat request, re-expressed rule by
rule for the golden renders (gen_golden.py): the content-format detection of
a template and the message, tool and document normalisation the server applies
before the chat template. Each rule names the vLLM file and function it follows.
"""

import collections
import functools
import json

import jinja2.nodes

# --- vLLM's content-format detection (a walk of the template's syntax tree) ---

def _is_var_access(node, varname):
    return isinstance(node, jinja2.nodes.Name) and node.ctx == "load" and node.name == varname


def _is_attr_access(node, varname, key):
    if isinstance(node, jinja2.nodes.Getitem):
        return _is_var_access(node.node, varname) and isinstance(node.arg, jinja2.nodes.Const) and node.arg.value == key
    if isinstance(node, jinja2.nodes.Getattr):
        return _is_var_access(node.node, varname) and node.attr == key
    return False


def _is_var_or_elems_access(node, varname, key=None):
    if isinstance(node, jinja2.nodes.Filter):
        return node.node is not None and _is_var_or_elems_access(node.node, varname, key)
    if isinstance(node, jinja2.nodes.Test):
        return _is_var_or_elems_access(node.node, varname, key)
    if isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice):
        return _is_var_or_elems_access(node.node, varname, key)
    return _is_attr_access(node, varname, key) if key else _is_var_access(node, varname)


def _assigned_from(root, varname):
    yield varname
    queue = collections.deque([varname])
    while queue:
        name = queue.popleft()
        for assign in root.find_all(jinja2.nodes.Assign):
            if _is_var_or_elems_access(assign.node, name):
                if not isinstance(assign.target, jinja2.nodes.Name):
                    raise ValueError("assignment target is not a name")
                yield assign.target.name
                if assign.target.name != name:
                    queue.append(assign.target.name)


def _loop_targets(root, varnames, key=None):
    for loop in root.find_all(jinja2.nodes.For):
        for v in varnames:
            if _is_var_or_elems_access(loop.iter, v, key):
                if not isinstance(loop.target, jinja2.nodes.Name):
                    raise ValueError("loop target is not a name")
                yield loop.target.name
                break


@functools.lru_cache(maxsize=None)
def compiled(env, template):
    return env.from_string(template)


@functools.lru_cache(maxsize=None)
def content_format(env, template):
    try:
        ast = env.parse(template)
    except Exception:
        return "string"
    try:
        messages = list(_assigned_from(ast, "messages"))
        message_vars = list(_loop_targets(ast, messages))
        if any(True for _ in _loop_targets(ast, message_vars, "content")):
            return "openai"
        # vLLM's fallback (vllm-project/vllm#42660): a loop over a variable
        # named "content", as templates that pass content to a macro write it.
        for loop in ast.find_all(jinja2.nodes.For):
            if isinstance(loop.iter, jinja2.nodes.Name) and loop.iter.name == "content":
                if not isinstance(loop.target, jinja2.nodes.Name):
                    raise ValueError("loop target is not a name")
                return "openai"
    except Exception:
        return "string"
    return "string"


# --- vLLM's OpenAI server: request validation and message parsing ---
#
# Re-expressed from vLLM's current sources, rule by rule (the comments name
# the file and function each rule comes from). A request vLLM answers with
# 400 raises ValueError here; the Go side must refuse it too.

class MediaPart:
    """A media content part: what vLLM hands its multimodal parser."""

    def __init__(self, modality):
        self.modality = modality


# vllm/entrypoints/chat_utils.py MODALITY_PLACEHOLDERS_MAP: the generic marker
# of a media item in a "string"-format message. vLLM replaces it by the model's
# own placeholder (model_cls.get_placeholder_str), which depends on the model
# class; the reference keeps the generic marker and the Go side cuts there.
MODALITY_MARKERS = {"image": "<##IMAGE##>", "audio": "<##AUDIO##>", "video": "<##VIDEO##>"}

# chat_utils.py MM_PARSER_MAP: part type -> (field holding its content,
# modality or None for text-like parts).
PART_TYPES = {
    "text": ("text", None), "thinking": ("thinking", None), "input_text": ("text", None),
    "output_text": ("text", None), "refusal": ("refusal", None),
    "tool_reference": ("name", None),
    "image_url": ("image_url", "image"), "input_image": ("image_url", "image"), "image_pil": ("image_pil", "image"),
    "image_embeds": ("image_embeds", "image"), "audio_url": ("audio_url", "audio"),
    "input_audio": ("input_audio", "audio"), "audio_embeds": ("audio_embeds", "audio"),
    "video_url": ("video_url", "video"), "prompt_embeds": ("data", "prompt_embeds"),
}
# chat_utils.py _parse_chat_message_content_mm_part: a part without "type" (or
# with a "uuid") is recognised by the first of these keys it has.
SNIFF_KEYS = ["image_url", "image_pil", "image_embeds", "audio_embeds", "prompt_embeds", "audio_url",
              "input_audio", "video_url", "tool_reference"]
# chat_utils.py PART_TYPES_TO_SKIP_NONE_CONTENT
SKIP_NONE = ("text", "refusal")


def _classify_part(part):
    """chat_utils.py _parse_chat_message_content_mm_part: (part type, content)."""
    kind = part.get("type")
    uuid = part.get("uuid")
    if isinstance(kind, str) and kind in PART_TYPES and uuid is None:
        field = PART_TYPES[kind][0]
        content = part.get(field)
        if kind in ("image_url", "audio_url", "video_url") and isinstance(content, dict):
            content = content.get("url")
        return kind, content
    if kind is None or uuid is not None:
        for key in SNIFF_KEYS:
            if key == "input_audio":
                if part.get(key) is not None:
                    return key, part[key]
                continue
            if key in part:
                if key == "tool_reference":
                    return key, part.get("name")
                if key == "prompt_embeds":
                    return key, part.get("data")
                return key, part[key]
        raise ValueError("missing 'type' field in multimodal part")
    if not isinstance(kind, str):
        raise ValueError("invalid 'type' field in multimodal part")
    raise ValueError(f"unsupported chat content part type: {kind}")


def _parse_part(part, wrap):
    """chat_utils.py _parse_chat_message_content_part: a text (str or
    {"type": "text"} dict), a tool reference, a MediaPart, or None (skipped)."""
    if isinstance(part, str):
        return {"type": "text", "text": part} if wrap else part
    if not isinstance(part, dict):
        raise ValueError("a content part must be a string or an object")
    kind, content = _classify_part(part)
    if kind in SKIP_NONE and content is None:
        return None
    if PART_TYPES[kind][1] is None and kind != "tool_reference":
        if content is not None and not isinstance(content, str):
            raise ValueError(f"{kind} part's content must be a string")
        return {"type": "text", "text": content} if wrap else content
    if kind == "tool_reference":
        return {"type": "tool_reference", "name": content} if wrap else content
    modality = PART_TYPES[kind][1]
    if modality == "prompt_embeds":
        # chat_utils.py parse_prompt_embeds: only with --enable-prompt-embeds,
        # and never scoreable (no token ids).
        raise ValueError("prompt_embeds content parts cannot be scored")
    return MediaPart(modality)


def _parse_content(role, content, fmt):
    """chat_utils.py _parse_chat_message_content_parts: the message content in
    the template's format, and whether it holds media."""
    wrap = fmt == "openai"
    if content is None:
        parts = []
    elif isinstance(content, str):
        parts = [content]
    elif isinstance(content, list):
        parts = content
    else:
        raise ValueError("content must be a string, a list of parts or null")
    out, media = [], []
    for p in parts:
        r = _parse_part(p, wrap)
        if isinstance(r, MediaPart):
            media.append(r.modality)
            if wrap:
                out.append({"type": r.modality})
            continue
        # "if parse_res:" drops falsy results: None, and "" in string format.
        if r:
            out.append(r)
    if wrap:
        return out, bool(media)
    text = "\n".join(out)
    if media:
        # _get_full_multimodal_text_prompt (interleave_strings off): the
        # placeholders go first, joined to the text with "\n".
        return "\n".join([MODALITY_MARKERS[m] for m in media] + ([text] if text else [])), True
    return text, False


def _tool_calls(calls):
    """The request model's view of an assistant's tool_calls: openai's
    ChatCompletionMessageFunctionToolCallParam TypedDict (id, function, type,
    all required; function = {arguments: str, name: str}). pydantic rebuilds
    each dict in the TypedDict's field order and drops unknown keys; anything
    else is a validation error (400)."""
    if not isinstance(calls, list):
        raise ValueError("tool_calls must be a list")
    out = []
    for i, c in enumerate(calls):
        if not isinstance(c, dict):
            raise ValueError(f"tool_calls[{i}] must be an object")
        fn = c.get("function")
        if not isinstance(c.get("id"), str) or c.get("type") != "function" or not isinstance(fn, dict):
            raise ValueError(f"tool_calls[{i}] needs a string id, type function and a function object")
        if not isinstance(fn.get("arguments"), str) or not isinstance(fn.get("name"), str):
            raise ValueError(f"tool_calls[{i}].function needs string arguments and name")
        out.append({"id": c["id"], "function": {"arguments": fn["arguments"], "name": fn["name"]}, "type": "function"})
    return out


def normalise(messages, fmt):
    """chat_utils.py parse_chat_messages: the conversation handed to
    apply_chat_template, and whether a message holds media."""
    if not isinstance(messages, list):
        raise ValueError("messages must be a list")
    out, has_media = [], False
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ValueError("each message needs a string role")
        m = dict(m)
        role = m["role"]
        # chat_completion/protocol.py ChatCompletionRequest._normalize_messages_before:
        # the deprecated reasoning_content becomes reasoning.
        rc = m.pop("reasoning_content", None)
        if rc is not None and m.get("reasoning") is None:
            m["reasoning"] = rc
        content, media = _parse_content(role, m.get("content"), fmt)
        has_media = has_media or media
        msg = {"role": role, "content": content}
        # chat_utils.py _parse_chat_message_content
        if role == "assistant":
            if m.get("tool_calls") is not None:
                msg["tool_calls"] = _tool_calls(m["tool_calls"])
            if m.get("reasoning") is not None:
                msg["reasoning"] = m["reasoning"]
                msg["reasoning_content"] = m["reasoning"]
        elif role == "tool":
            if "tool_call_id" in m:
                msg["tool_call_id"] = m["tool_call_id"]
            c = msg["content"]
            if isinstance(c, list):
                if not any(isinstance(p, dict) and p.get("type") != "text" for p in c):
                    texts = [p.get("text", "") for p in c if isinstance(p, dict) and p.get("type") == "text"]
                    if any(t is None for t in texts):
                        raise ValueError("a tool message's text part has no text")
                    msg["content"] = "\n".join(texts) if texts else ""
        if isinstance(m.get("name"), str):
            msg["name"] = m["name"]
        if isinstance(m.get("task"), str):
            msg["task"] = m["task"]
        if role == "developer":
            msg["tools"] = m.get("tools")
        out.append(msg)
    # chat_utils.py _postprocess_messages
    for msg in out:
        if msg["role"] == "assistant" and isinstance(msg.get("tool_calls"), list):
            if not msg["tool_calls"]:
                del msg["tool_calls"]
                continue
            for item in msg["tool_calls"]:
                args = item["function"]["arguments"]
                try:
                    item["function"]["arguments"] = json.loads(args)
                except json.JSONDecodeError:
                    item["function"]["arguments"] = {}
    return out, has_media


def normalise_tools(tools):
    """chat_completion/protocol.py ChatCompletionToolsParam and
    generate/base/protocol.py FunctionDefinition, dumped with model_dump():
    {"type", "function": {"name", "description", "parameters",
    ["defer_loading"], extra keys...}, ["defer_loading"]}. Unknown keys of
    the tool are dropped (its serializer keeps model fields only); the
    function keeps them (OpenAIBaseModel allows extras). An empty list is a
    400 (ChatCompletionRequest.check_tool_usage)."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise ValueError("tools must be a list")
    if not tools:
        raise ValueError("`tools` must not be an empty array")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or not isinstance(t.get("function"), dict):
            raise ValueError(f"tools[{i}] needs a function object")
        if t.get("type", "function") != "function":
            raise ValueError(f"tools[{i}].type must be function")
        fn = t["function"]
        if not isinstance(fn.get("name"), str):
            raise ValueError(f"tools[{i}].function.name must be a string")
        if fn.get("description") is not None and not isinstance(fn["description"], str):
            raise ValueError(f"tools[{i}].function.description must be a string")
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise ValueError(f"tools[{i}].function.parameters must be an object")
        for d in (t.get("defer_loading"), fn.get("defer_loading")):
            if d is not None and not isinstance(d, bool):
                raise ValueError(f"tools[{i}] defer_loading must be a boolean")
        f = {"name": fn["name"], "description": fn.get("description"), "parameters": fn.get("parameters")}
        defer = fn.get("defer_loading")
        if defer is None:
            defer = t.get("defer_loading")  # _propagate_defer_loading
        if defer is not None:
            f["defer_loading"] = defer
        for k, v in fn.items():
            if k not in f and k != "defer_loading":
                f[k] = v
        tool = {"type": "function", "function": f}
        if t.get("defer_loading") is not None:
            tool["defer_loading"] = t["defer_loading"]
        out.append(tool)
    return out


def check_documents(documents):
    """ChatCompletionRequest.documents: list[dict[str, str]] | None."""
    if documents is None:
        return
    if not isinstance(documents, list) or not all(
            isinstance(d, dict) and all(isinstance(v, str) for v in d.values()) for d in documents):
        raise ValueError("documents must be a list of objects with string values")


REASONING_EFFORTS = (None, "none", "minimal", "low", "medium", "high", "xhigh", "max")
