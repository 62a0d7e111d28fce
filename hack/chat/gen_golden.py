#!/usr/bin/python3
"""Golden chat-template renders for chattemplate's parity test.

Reference: Debian's python3-jinja2 configured the way transformers renders chat
templates (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, the
loopcontrols extension, a {% generation %} tag that renders its body, tojson
with ensure_ascii=False and no HTML escaping, raise_exception, strftime_now),
plus transformers' apply_chat_template steps (named template selection,
special-token variables, continue_final_message) and the message
normalisation vLLM's OpenAI server applies before it (vllm_rules.py: content-format
detection from the template's syntax tree, text parts joined or wrapped, tool
messages' text parts joined, tool-call arguments parsed from JSON).

strftime_now is pinned to FIXED_NOW so the renders are reproducible; the Go
test pins the same instant.

It also renders the engine's feature snippets (tokenization/chattemplate/jinja/testdata/
snippets.jsonl, one small template each, all with the variables of
snippets_vars.json) into snippets.golden.jsonl.

The content format vLLM would detect for each template of
tokenization/chattemplate/testdata/parity/format_cases.jsonl goes to format_cases.golden.jsonl.

Usage: hack/chat/gen_golden.py           rewrites the golden files
       hack/chat/gen_golden.py --check   exits 1 if a committed golden file differs
                                         (chattemplate's tests run this when Jinja2 is there)
"""
import copy
import datetime
import functools
import gzip
import json
import os
import random
import sys

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
TEMPLATES = os.path.join(ROOT, "tokenization", "chattemplate", "testdata", "templates")
PARITY = os.path.join(ROOT, "tokenization", "chattemplate", "testdata", "parity")
FIXED_NOW = datetime.datetime(2026, 1, 15, 9, 30, 5)
SPECIAL_TOKEN_KEYS = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token", "additional_special_tokens"]
CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


CHECK = "--check" in sys.argv[1:]
STALE = []


def write_golden(path, text):
    """Writes a golden file, or in --check mode records it as stale if it differs."""
    if CHECK:
        try:
            with open(path, encoding="utf-8") as f:
                same = f.read() == text
        except FileNotFoundError:
            same = False
        if not same:
            STALE.append(os.path.relpath(path, ROOT))
        return
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


class TemplateRaised(Exception):
    """raise_exception() from inside a template."""


class GenerationTag(jinja2.ext.Extension):
    # transformers' AssistantTracker without mask tracking: the body renders as is.
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_env():
    def raise_exception(message):
        raise TemplateRaised(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return FIXED_NOW.strftime(fmt)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


from vllm_rules import (  # noqa: E402 (the rules live beside this script)
    _is_var_access,
    _is_attr_access,
    _is_var_or_elems_access,
    _assigned_from,
    _loop_targets,
    compiled,
    content_format,
    MediaPart,
    MODALITY_MARKERS,
    PART_TYPES,
    SNIFF_KEYS,
    SKIP_NONE,
    _classify_part,
    _parse_part,
    _parse_content,
    _tool_calls,
    normalise,
    normalise_tools,
    check_documents,
    REASONING_EFFORTS,
)


# --- transformers' apply_chat_template ---

def load_tokenizer_dir(path):
    with open(os.path.join(path, "tokenizer_config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    template = cfg.get("chat_template")
    processor = None
    jinja_file = os.path.join(path, "chat_template.jinja")
    if os.path.exists(jinja_file):
        with open(jinja_file, encoding="utf-8", newline="") as f:
            template = f.read()
        processor = template
    else:
        json_file = os.path.join(path, "chat_template.json")
        if os.path.exists(json_file):
            with open(json_file, encoding="utf-8") as f:
                processor = json.load(f).get("chat_template")
    if isinstance(template, list):
        template = {t["name"]: t["template"] for t in template}
    special = {}
    for k in SPECIAL_TOKEN_KEYS:
        v = cfg.get(k)
        if v is None:
            continue
        if k == "additional_special_tokens":
            special[k] = [t["content"] if isinstance(t, dict) else t for t in v]
        else:
            special[k] = v["content"] if isinstance(v, dict) else v
    return (template, processor), special


def select_template(template_src, tools):
    """renderers/hf.py resolve_chat_template: the processor's template unless
    the request has tools, then the tokenizer's (a named list picks
    "tool_use" with tools, else "default")."""
    template, processor = template_src
    if tools is None and processor is not None:
        return processor
    if isinstance(template, dict):
        if tools is not None and "tool_use" in template:
            return template["tool_use"]
        if "default" in template:
            return template["default"]
        raise ValueError("multiple chat templates and no default")
    return template


@functools.lru_cache(maxsize=None)
def template_variables(env, template):
    import jinja2.meta
    return jinja2.meta.find_undeclared_variables(env.parse(template))


# transformers' apply_chat_template parameters (renderers/hf.py
# _get_hf_base_chat_template_params reads them from its signature).
HF_PARAMS = {"conversation", "tools", "documents", "chat_template", "add_generation_prompt", "continue_final_message",
             "tokenize", "padding", "truncation", "max_length", "return_tensors", "return_dict",
             "return_assistant_tokens_mask", "tokenizer_kwargs"}


def render(env, template_src, special, case):
    """One request through vLLM's chat path; returns (format, prompt, media)."""
    add_gen = case.get("add_generation_prompt", True)
    cont = case.get("continue_final_message", False)
    # ChatCompletionRequest.check_generation_prompt
    if cont and add_gen:
        raise ValueError("continue_final_message and add_generation_prompt cannot both be true")
    effort = case.get("reasoning_effort")
    if effort not in REASONING_EFFORTS:
        raise ValueError(f"reasoning_effort {effort} is not one of none, minimal, low, medium, high, xhigh, max")
    check_documents(case.get("documents"))
    tools = normalise_tools(case.get("tools"))
    template = select_template(template_src, tools)
    fmt = content_format(env, template)
    messages, media = normalise(case["messages"], fmt)
    user_kwargs = case.get("chat_template_kwargs")
    if user_kwargs is not None and not isinstance(user_kwargs, dict):
        raise ValueError("chat_template_kwargs must be an object")
    user_kwargs = dict(user_kwargs or {})
    # chat_completion/protocol.py build_chat_params + renderers/params.py
    # merge_kwargs: the request's own fields override chat_template_kwargs
    # unless None (or "auto").
    extra = {"add_generation_prompt": add_gen, "continue_final_message": cont,
             "documents": case.get("documents"), "reasoning_effort": effort}
    if effort is not None and "enable_thinking" not in user_kwargs:
        extra["enable_thinking"] = effort != "none"
    kwargs = user_kwargs | {k: v for k, v in extra.items() if v is not None and v != "auto"}
    # renderers/hf.py resolve_chat_template_kwargs (chat_template in the
    # kwargs is refused by the server's request-template check; tokenize is
    # a parameter of safe_apply_chat_template and only picks the return type).
    if "chat_template" in kwargs:
        raise ValueError("chat_template_kwargs may not set chat_template")
    kwargs.pop("tokenize", None)
    for k in ("conversation", "tools", "messages"):
        if k in kwargs:
            raise ValueError(f"chat_template_kwargs may not set {k}")
    accepted = template_variables(env, template) | HF_PARAMS
    kwargs = {k: v for k, v in kwargs.items() if k in accepted}
    add_gen = kwargs.pop("add_generation_prompt")
    cont = kwargs.pop("continue_final_message")
    documents = kwargs.pop("documents", None)
    for k in HF_PARAMS:
        kwargs.pop(k, None)
    final_text = None
    if cont:
        messages = copy.deepcopy(messages)
        last = messages[-1]["content"]
        if isinstance(last, (list, tuple)):
            for block in reversed(last):
                if "text" in block:
                    final_text = block["text"]
                    block["text"] = block["text"] + CONTINUE_TAG
                    break
            else:
                raise ValueError("continue_final_message: no text in the final message")
        else:
            final_text = last
            messages[-1]["content"] = last + CONTINUE_TAG
    ctx = dict(special)
    ctx.update(kwargs)
    out = compiled(env, template).render(messages=messages, tools=tools, documents=documents,
                                           add_generation_prompt=add_gen, **ctx)
    if cont:
        if final_text.strip() not in out or CONTINUE_TAG.strip() not in out:
            raise ValueError("continue_final_message: the final message does not appear in the rendered chat")
        at = out.rindex(CONTINUE_TAG.strip())
        out = out[:at] if out[at:at + len(CONTINUE_TAG)] == CONTINUE_TAG else out[:at].rstrip()
    return fmt, out, media


def render_record(env, template_src, special, case):
    rec = {"case": case["name"]}
    try:
        rec["format"], rec["prompt"], media = render(env, template_src, special, case)
        if media:
            rec["media"] = True
    except TemplateRaised as e:
        rec["raised"] = str(e)
    except Exception as e:  # any other failure: the Go side must fail too
        rec["error"] = f"{type(e).__name__}: {e}"
    return rec


def snippets(env):
    d = os.path.join(ROOT, "tokenization", "chattemplate", "jinja", "testdata")
    with open(os.path.join(d, "snippets_vars.json"), encoding="utf-8") as f:
        variables = json.load(f)
    out = []
    for line in open(os.path.join(d, "snippets.jsonl"), encoding="utf-8"):
        if not line.strip():
            continue
        sn = json.loads(line)
        rec = {"name": sn["name"]}
        try:
            tmpl = env.from_string(sn["template"])
        except Exception as e:
            rec["error"] = f"load: {type(e).__name__}: {e}"
        else:
            try:
                rec["out"] = tmpl.render(**copy.deepcopy(variables))
            except TemplateRaised as e:
                rec["raised"] = str(e)
            except Exception as e:
                rec["error"] = f"render: {type(e).__name__}: {e}"
        out.append(json.dumps(rec, ensure_ascii=False))
    write_golden(os.path.join(d, "snippets.golden.jsonl"), "\n".join(out) + "\n")
    print(f"snippets: {len(out)}", file=sys.stderr)


def formats(env):
    path = os.path.join(PARITY, "format_cases.jsonl")
    out = []
    for line in open(path, encoding="utf-8"):
        if line.strip():
            case = json.loads(line)
            out.append(json.dumps({"template": case["template"], "format": content_format(env, case["template"])}))
    write_golden(os.path.join(PARITY, "format_cases.golden.jsonl"), "\n".join(out) + "\n")


# --- seeded random inputs: whitespace-control templates and conversations ---

def random_whitespace_templates(n, seed=20261123):
    """Templates mixing text, spaces, tabs and newlines with every kind of tag
    and whitespace marker: a differential test of the lexer's rules."""
    rnd = random.Random(seed)
    ws = ["", " ", "  ", "\t", "\n", "\n\n", " \n", "\n  ", "\t\n\t", "\r\n", "\u00a0", "\u3000\n"]
    words = ["a", "b c", "x", "{", "}", "%", "#", "-", "é"]
    def mark():
        return rnd.choice(["", "", "-", "+"])
    def endmark():
        return rnd.choice(["", "", "-", "+"])
    def piece(depth):
        k = rnd.randrange(9 if depth < 3 else 6)
        if k == 0:
            return rnd.choice(words)
        if k == 1:
            return "{{" + rnd.choice(["", "-"]) + " " + rnd.choice(["n", "'v'", "s", "none"]) + " " + rnd.choice(["", "-"]) + "}}"
        if k == 2:
            return "{#" + mark() + " c " + endmark() + "#}"
        if k == 3:
            return "{%" + mark() + " set q = 1 " + endmark() + "%}"
        if k == 4:
            return "{%" + mark() + " raw " + endmark() + "%}" + rnd.choice(ws) + "{{ r }}" + rnd.choice(ws) + "{%" + mark() + " endraw " + endmark() + "%}"
        if k == 5:
            return rnd.choice(ws)
        body = "".join(rnd.choice(ws) + piece(depth + 1) for _ in range(rnd.randrange(1, 4))) + rnd.choice(ws)
        if k == 6:
            return "{%" + mark() + " if " + rnd.choice(["true", "false"]) + " " + endmark() + "%}" + body + \
                "{%" + mark() + " else " + endmark() + "%}" + rnd.choice(ws) + "E" + rnd.choice(ws) + "{%" + mark() + " endif " + endmark() + "%}"
        if k == 7:
            return "{%" + mark() + " for i in [1, 2] " + endmark() + "%}" + body + "{%" + mark() + " endfor " + endmark() + "%}"
        return "{%" + mark() + " macro m() " + endmark() + "%}" + body + "{%" + mark() + " endmacro " + endmark() + "%}" + "{{ m() }}"
    out = []
    for _ in range(n):
        out.append("".join(rnd.choice(ws) + piece(0) for _ in range(rnd.randrange(1, 6))) + rnd.choice(ws + ["\n"]))
    return out


def random_conversations(n, seed=20261124):
    rnd = random.Random(seed)
    texts = ["Hello", "  padded  ", "\nnewlines\n\n", "tabs\there", "ünïcödé ✓ 日本", "emoji 👩🏽‍💻", "quotes ' \" \\", "{{ x }} {% y %}",
             "<|im_end|>", "<think>\nhidden\n</think>\n\nshown", "", " ", "1e5", "line\u2028sep", "a" * 50]
    tool_names = ["get_weather", "search_docs"]
    def text():
        return " ".join(rnd.choice(texts) for _ in range(rnd.randrange(1, 3)))
    def content():
        k = rnd.randrange(10)
        if k < 6:
            return text()
        if k < 9:
            return [{"type": "text", "text": text()} for _ in range(rnd.randrange(1, 3))]
        return None
    def args():
        k = rnd.randrange(5)
        obj = {"city": text(), "n": rnd.choice([1, 2.5, -3, 0.1, True, None]), "l": [rnd.choice([1, "x", None])]}
        if k == 0:
            return obj
        if k == 1:
            return "not json {"
        if k == 2:
            return ""
        return json.dumps(obj, ensure_ascii=rnd.random() < 0.5)
    cases = []
    for i in range(n):
        msgs = []
        if rnd.random() < 0.5:
            msgs.append({"role": rnd.choice(["system", "system", "developer"]), "content": content() or "sys"})
        turns = rnd.randrange(1, 6)
        tools_on = rnd.random() < 0.4
        for t in range(turns):
            msgs.append({"role": "user", "content": content()})
            if t == turns - 1 and rnd.random() < 0.5:
                break
            if tools_on and rnd.random() < 0.5:
                calls = [{"id": f"c{i}{t}{j}", "type": "function", "function": {"name": rnd.choice(tool_names), "arguments": args()}}
                         for j in range(rnd.randrange(1, 3))]
                msgs.append({"role": "assistant", "content": rnd.choice([None, "", text()]), "tool_calls": calls})
                for c in calls:
                    m = {"role": "tool", "tool_call_id": c["id"], "content": content() or "ok"}
                    if rnd.random() < 0.8:
                        m["name"] = c["function"]["name"]
                    msgs.append(m)
                if rnd.random() < 0.5:
                    continue
            a = {"role": "assistant", "content": content() or "answer"}
            if rnd.random() < 0.2:
                a["reasoning"] = text()
            msgs.append(a)
        case = {"name": f"random_{i:03d}", "messages": msgs}
        if tools_on:
            case["tools"] = [{"type": "function", "function": {"name": "get_weather", "description": "Weather.",
                              "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City"}}, "required": ["city"]}}}]
        if msgs[-1]["role"] == "assistant" and rnd.random() < 0.5:
            case["add_generation_prompt"] = False
            if rnd.random() < 0.6:
                case["continue_final_message"] = True
        elif rnd.random() < 0.2:
            case["add_generation_prompt"] = False
        if rnd.random() < 0.3:
            case["chat_template_kwargs"] = {"enable_thinking": rnd.random() < 0.5, "reasoning_effort": rnd.choice(["low", "high"])}
        cases.append(case)
    return cases


def gz_text(lines):
    return "\n".join(lines) + "\n"


def write_golden_gz(path, text):
    data = gzip.compress(text.encode("utf-8"), mtime=0)
    if CHECK:
        try:
            with gzip.open(path, "rb") as f:
                same = f.read() == text.encode("utf-8")
        except FileNotFoundError:
            same = False
        if not same:
            STALE.append(os.path.relpath(path, ROOT))
        return
    with open(path, "wb") as f:
        f.write(data)


def random_snippets(env):
    d = os.path.join(ROOT, "tokenization", "chattemplate", "jinja", "testdata")
    out = []
    for i, t in enumerate(random_whitespace_templates(400)):
        rec = {"name": f"ws{i:03d}", "template": t}
        try:
            rec["out"] = env.from_string(t).render(n=5, s=" s ", r="raw")
        except Exception as e:
            rec["error"] = f"{type(e).__name__}: {e}"
        out.append(json.dumps(rec, ensure_ascii=False))
    write_golden_gz(os.path.join(d, "whitespace_random.jsonl.gz"), gz_text(out))


def random_parity(env):
    cases = random_conversations(150)
    write_golden_gz(os.path.join(PARITY, "conversations_random.jsonl.gz"), gz_text([json.dumps(c, ensure_ascii=False) for c in cases]))
    for name in sorted(os.listdir(TEMPLATES)):
        template_src, special = load_tokenizer_dir(os.path.join(TEMPLATES, name))
        lines = []
        for case in cases:
            lines.append(json.dumps(render_record(env, template_src, special, case), ensure_ascii=False))
        write_golden_gz(os.path.join(PARITY, "golden", name + ".random.jsonl.gz"), gz_text(lines))


def main():
    env = make_env()
    snippets(env)
    random_snippets(env)
    formats(env)
    random_parity(env)
    with open(os.path.join(PARITY, "conversations.jsonl"), encoding="utf-8") as f:
        cases = [json.loads(line) for line in f if line.strip()]
    os.makedirs(os.path.join(PARITY, "golden"), exist_ok=True)
    for name in sorted(os.listdir(TEMPLATES)):
        template_src, special = load_tokenizer_dir(os.path.join(TEMPLATES, name))
        lines = []
        n_err = 0
        for case in cases:
            rec = render_record(env, template_src, special, case)
            n_err += "prompt" not in rec
            lines.append(json.dumps(rec, ensure_ascii=False))
        write_golden(os.path.join(PARITY, "golden", name + ".jsonl"), "\n".join(lines) + "\n")
        print(f"{name}: {len(cases)} cases, {len(cases) - n_err} renders, {n_err} errors", file=sys.stderr)
    if STALE:
        print("stale golden files (rerun hack/chat/gen_golden.py): " + ", ".join(STALE), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
