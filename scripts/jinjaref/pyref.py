#!/usr/bin/env python3
"""Render real chat templates with Python jinja2 as vLLM does.

vLLM renders chat templates with transformers' apply_chat_template, whose
renderer (transformers/utils/chat_template_utils.py, _compile_jinja_template
and render_jinja_template) is reproduced here: an ImmutableSandboxedEnvironment
with trim_blocks, lstrip_blocks and the loopcontrols extension, tojson
replaced by json.dumps(ensure_ascii=False, ...), raise_exception and
strftime_now as globals, and messages, tools, documents (None when absent)
and add_generation_prompt passed with the template's keyword arguments.

Usage (from the repository root, Python 3 with jinja2 3.1.x):

    python3 scripts/jinjaref/pyref.py [-n CONVERSATIONS] [-o OUT]

It renders every jinja/testdata/templates/*.jinja with CONVERSATIONS
generated conversations (fixed seed) and writes the variables and the
output (or the error) of each render to OUT (default
jinja/testdata/pyref.json), which jinja's TestPythonJinjaReference replays.
"""

import argparse
import glob
import json
import os
import random
import sys
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment


class AssistantTracker(Extension):
    # transformers' {% generation %} block; rendering without
    # return_assistant_tokens_mask it only outputs its body.
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(format):
    # Fixed, so that the reference is reproducible; the Go test passes the
    # same instant.
    return datetime(2026, 1, 2, 3, 4, 5).strftime(format)


def compile_template(src):
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[AssistantTracker, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(src)


TEXTS = [
    "Hello, how are you?",
    "  leading and trailing spaces  ",
    "\nnewlines around\n\n",
    "héllo wörld — ünïcode 😀 中文 العربية",
    'quotes " and \' and back\\slash and <html> & amp',
    "tab\there and a\r\nCRLF",
    "multi\nline\n\ncontent with trailing newline\n",
    "",
    " ",
    "[INST] looks like a tag <|im_start|> </s>",
    "{{ not a template }} {% neither %}",
    "emoji 👩\u200d💻 and combining e\u0301",
]

REASONING = [
    "Let me think step by step.",
    "\nreasoning with newlines\n",
    "  spaced reasoning  ",
    "思考中… ünïcode",
]

ANSWERS_WITH_THINK = [
    "<think>\ninline reasoning\n</think>\n\nThe answer is 42.",
    "<think>a</think>b</think>\n\nc",
    "prefix</think>\n  spaced answer",
]

TOOL_NAMES = ["get_weather", "search_web", "calc"]

# Whether conversations hold list contents (which vLLM flattens to a string
# for most templates) and nulls (a null content, a null description), whose
# renders differ by the departures doc.go lists; --all turns them on.
PARTS = False
NULLS = False


def rand_scalar(r):
    return r.choice([
        1, 0, -7, 2.5, 1.0, 0.1, 1e-7, 1e20, 123456789012, 3.14159, -0.0,
        True, False, None, "Paris", "ünï 😀", 'q"uote', "line\nbreak", "",
    ])


def rand_value(r, depth=0):
    k = r.random()
    if depth < 3 and k < 0.2:
        return {f"k{i}": rand_value(r, depth + 1) for i in range(r.randint(0, 3))}
    if depth < 3 and k < 0.35:
        return [rand_value(r, depth + 1) for _ in range(r.randint(0, 3))]
    return rand_scalar(r)


def rand_args(r):
    args = {}
    for name in r.sample(["location", "unit", "query", "n", "x", "opts", "tags", "ratio", "flag", "city"], r.randint(0, 4)):
        args[name] = rand_value(r)
    return args


def rand_tool(r, name):
    props = {
        "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "ratio": {"type": "number", "minimum": 0.5, "maximum": 1.0, "default": 0.75},
        "opts": {
            "type": "object",
            "description": "Nested options — ünïcode",
            "properties": {
                "depth": {"type": "integer", "default": 2},
                "filters": {"type": "array", "items": {"type": "object", "properties": {"k": {"type": "string"}, "w": {"type": "number", "default": 1e-3}}}},
            },
        },
    }
    keys = r.sample(list(props), r.randint(0, len(props)))
    fn = {"name": name}
    if not NULLS or r.random() < 0.8:
        fn["description"] = r.choice(["Get the current weather", "Search the web.\nReturns results.", 'Calc "things" <fast>'])
    else:
        fn["description"] = None
    fn["parameters"] = {"type": "object", "properties": {k: props[k] for k in keys}, "required": keys[:1]}
    return {"type": "function", "function": fn}


def rand_content(r, parts_ok):
    text = r.choice(TEXTS)
    if PARTS and parts_ok and r.random() < 0.03:
        return [{"type": "text", "text": text}, {"type": "text", "text": r.choice(TEXTS)}]
    return text


def conversation(r):
    msgs = []
    tools = None
    if r.random() < 0.45:
        tools = [rand_tool(r, n) for n in r.sample(TOOL_NAMES, r.randint(1, 3))]
    if r.random() < 0.55:
        msgs.append({"role": "system", "content": rand_content(r, True)})
    turns = r.randint(1, 4)
    call_id = 0
    for t in range(turns):
        msgs.append({"role": "user", "content": rand_content(r, True)})
        last = t == turns - 1
        if last and r.random() < 0.5:
            break
        m = {"role": "assistant"}
        k = r.random()
        if k < 0.15:
            m["content"] = r.choice(ANSWERS_WITH_THINK)
        else:
            m["content"] = rand_content(r, True)
        if r.random() < 0.3:
            m["reasoning_content"] = r.choice(REASONING)
        if tools and r.random() < 0.6:
            calls = []
            for _ in range(r.randint(1, 2)):
                call_id += 1
                calls.append({
                    "id": f"call_{call_id:09d}",
                    "type": "function",
                    "function": {"name": r.choice(tools)["function"]["name"], "arguments": rand_args(r)},
                })
            m["tool_calls"] = calls
            if r.random() < 0.3:
                m["content"] = r.choice(["", None] if NULLS else [""])
            msgs.append(m)
            for c in calls:
                tm = {"role": "tool", "tool_call_id": c["id"], "content": r.choice(["22.5", '{"temp": 22.5, "unit": "celsius"}', "ok ünï", "\nresult\n"])}
                if r.random() < 0.5:
                    tm["name"] = c["function"]["name"]
                msgs.append(tm)
            if r.random() < 0.7:
                msgs.append({"role": "assistant", "content": rand_content(r, False)})
        else:
            msgs.append(m)
    v = {"messages": msgs, "tools": tools, "documents": None, "add_generation_prompt": msgs[-1]["role"] != "assistant" and r.random() < 0.8}
    if r.random() < 0.3:
        v["enable_thinking"] = r.random() < 0.5
    return v


# Conversations every reference holds: a user repeating the last message
# with tools (Mistral's 'message == user_messages[-1]'), and a reasoning
# turn before thinking is turned off (GLM's per-iteration 'set').
FIXED = [
    {
        "messages": [
            {"role": "system", "content": "You are helpful."},
            {"role": "user", "content": "yes"},
            {"role": "assistant", "content": "Sure?", "reasoning_content": "Ask again."},
            {"role": "user", "content": "yes"},
        ],
        "tools": [{"type": "function", "function": {"name": "calc", "description": "Calc", "parameters": {"type": "object", "properties": {"x": {"type": "number", "maximum": 1.0, "minimum": 0.5}}, "required": ["x"]}}}],
        "documents": None,
        "add_generation_prompt": True,
    },
    {
        "messages": [
            {"role": "user", "content": "q1"},
            {"role": "assistant", "content": "a1", "reasoning_content": "r1"},
            {"role": "user", "content": "q2"},
            {"role": "assistant", "content": "a2"},
            {"role": "assistant", "content": "a3"},
        ],
        "tools": None,
        "documents": None,
        "add_generation_prompt": False,
        "enable_thinking": False,
    },
]

SPECIAL = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}


def render(tpl, v):
    kwargs = dict(SPECIAL)
    kwargs.update(v)
    return tpl.render(**kwargs)


# Small templates, one per behaviour a Go test names, rendered with the same
# environment into FEATURES_OUT.
FEATURES = [
    ("set_in_loop_body_does_not_outlive_its_iteration",
     "{% for m in xs %}{% if m > 1 %}{% set r = m %}{% endif %}[{{ 'y' if r is defined else 'n' }}{{ r }}]{% endfor %}",
     {"xs": [2, 1, 3, 0]}),
    # meetkai/functionary-medium-v3.2 loops over a list of tuple literals.
    ("for_unpacks_tuple_literals",
     "{% for field, name in [('maximum', 'Maximum'), ('minimum', 'Minimum')] %}{% if field in p %}{{ name }}: {{ p[field] }};{% endif %}{% endfor %}",
     {"p": {"minimum": 1, "maximum": 9}}),
    # Mistral v0.3/Nemo/Small put the tools before the user message that
    # equals (==) the last one: dicts compare by value.
    ("equal_compares_dicts_and_lists_by_value",
     "{% for m in ms %}{{ 'T' if m == ms[-1] else 'F' }}{{ 'T' if m != ms[-1] else 'F' }}{% endfor %}"
     "|{{ 'T' if [1, {'a': [2]}] == [1, {'a': [2]}] else 'F' }}{{ 'T' if {'a': 1, 'b': 2} == {'b': 2, 'a': 1} else 'F' }}"
     "{{ 'T' if [1, 2] == [1, 2, 3] else 'F' }}{{ 'T' if {'a': 1} == {'a': 2} else 'F' }}{{ 'T' if {'a': 1} == {'b': 1} else 'F' }}",
     {"ms": [{"role": "user", "content": "yes"}, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "yes"}]}),
    # Hermes 2 Pro / Hermes 3 write 'param_fields.description|trim' for
    # every tool parameter, described or not.
    ("string_filters_of_undefined_are_empty",
     "[{{ p.description|trim }}][{{ p.nope|upper }}{{ p.nope|lower }}{{ p.nope|title }}{{ p.nope|capitalize }}{{ p.nope|string }}][{{ p.nope|length }}]",
     {"p": {"type": "string"}}),
    # CISCai/Mistral-7B-Instruct-v0.3-SOTA-GGUF builds tool results and
    # calls with dict(...).
    ("dict_builds_a_mapping",
     "{{ dict(call_id=m.id, content=m.content)|tojson }}|{{ dict(m, z=1)|tojson }}|{{ dict([('a', 1)])['a'] }}",
     {"m": {"id": "call_1", "content": "22.5 ü"}}),
    # meetkai/functionary-medium-v3.2 writes a parameter's bounds with ~.
    ("concat_and_join_write_floats_as_python_str",
     "{{ 'Maximum=' ~ p.maximum }} {{ p.minimum ~ '<' }} {{ 'x' + p.maximum|string }} {{ [p.maximum, p.minimum, p.big, p.tiny, 3, p.nz]|join(',') }}",
     {"p": {"maximum": 1.0, "minimum": 0.5, "big": 1e20, "tiny": 1e-7, "nz": -0.0}}),
    # meetkai/functionary-medium-v3.2 indents nested parameters with
    # ' ' * depth.
    ("star_repeats_a_string",
     "[{{ ' ' * n }}][{{ 2 * 'ab' }}][{{ 'x' * 0 }}][{{ 'x' * -1 }}][{{ 'ü' * 3 }}]",
     {"n": 4}),
    # Mistral Nemo checks that the messages without tool_calls alternate.
    ("selectattr_tests_a_missing_attribute_as_undefined",
     "{% for m in ms | rejectattr('role', 'equalto', 'tool') | selectattr('tool_calls', 'undefined') %}{{ loop.index0 }}{{ m.role }},{% endfor %}"
     "|{{ ms | selectattr('tool_calls', 'defined') | list | length }}{{ ms | rejectattr('tool_calls', 'undefined') | list | length }}"
     "{{ ms | selectattr('tool_calls') | list | length }}{{ ms | rejectattr('tool_calls') | list | length }}{{ ms | selectattr('name', 'equalto', 'f') | list | length }}",
     {"ms": [{"role": "user"}, {"role": "assistant", "tool_calls": [{"name": "f"}]}, {"role": "tool", "name": "f"}, {"role": "assistant"}, {"role": "assistant"}]}),
]
FEATURES_OUT = "jinja/testdata/pyref_features.json"


def features():
    out = []
    for name, src, v in FEATURES:
        c = {"name": name, "template": src, "vars": v}
        try:
            c["out"] = compile_template(src).render(**v)
        except Exception as e:  # noqa: BLE001
            c["error"] = f"{type(e).__name__}: {e}"
        out.append(c)
    with open(FEATURES_OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=12)
    ap.add_argument("-o", default="jinja/testdata/pyref.json")
    ap.add_argument("--seed", type=int, default=171)
    ap.add_argument("--all", action="store_true", help="also list contents and nulls")
    args = ap.parse_args()
    global PARTS, NULLS
    PARTS = NULLS = args.all
    features()
    r = random.Random(args.seed)
    convs = FIXED + [conversation(r) for _ in range(args.n)]
    names = sorted(os.path.basename(p)[: -len(".jinja")] for p in glob.glob("jinja/testdata/templates/*.jinja"))
    cases = []
    for name in names:
        with open(f"jinja/testdata/templates/{name}.jinja", encoding="utf-8") as f:
            src = f.read()
        try:
            tpl = compile_template(src)
        except Exception as e:  # noqa: BLE001
            cases.append({"template": name, "conversation": -1, "error": f"{type(e).__name__}: {e}"})
            continue
        for i, v in enumerate(convs):
            c = {"template": name, "conversation": i}
            try:
                c["out"] = render(tpl, v)
            except Exception as e:  # noqa: BLE001
                c["error"] = f"{type(e).__name__}: {e}"
            cases.append(c)
    out = {
        "generator": "scripts/jinjaref/pyref.py",
        "jinja2": jinja2.__version__,
        "seed": args.seed,
        "special_tokens": SPECIAL,
        "conversations": convs,
        "cases": cases,
    }
    with open(args.o, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=0)
        f.write("\n")
    errs = sum(1 for c in cases if "error" in c)
    print(f"{len(names)} templates, {len(convs)} conversations, {len(cases)} renders, {errs} errors", file=sys.stderr)


if __name__ == "__main__":
    main()
