#!/usr/bin/env python3
"""Write py_text and vllm_text into tokenizer/testdata/qwen3_chat_ref.jsonl:
each reference conversation rendered by Python's jinja2 as transformers'
apply_chat_template renders the messages given (py_text), and the prompt
vLLM renders for the same request (vllm_text).

gen.mjs renders the conversations with @huggingface/jinja (JavaScript); vLLM
renders them with Python's jinja2 through transformers' apply_chat_template,
after its own preprocessing of the request:

  - ChatCompletionRequest renames a message's deprecated reasoning_content
    to reasoning when reasoning is not given (None is not given);
  - chat_utils hands an assistant's reasoning to the template as reasoning
    and reasoning_content (other roles' not at all) and decodes every
    assistant tool call's arguments string with json.loads (an empty object
    when that fails, or when arguments is neither a string nor a container).

The environment is scripts/jinjaref/pyref.py's (transformers'). The router's
typed render (tokenizer.RenderChatFields) must match vllm_text byte for byte,
and RenderChatJSON (the messages as given) py_text (TestQwen3ChatReference). Run after gen.mjs (make tokref), from the
repository root, with Python 3 and jinja2 3.1.x.
"""

import copy
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "scripts", "jinjaref"))
import pyref  # noqa: E402

REF = os.path.join(ROOT, "tokenizer", "testdata", "qwen3_chat_ref.jsonl")
TEMPLATE = os.path.join(ROOT, "jinja", "testdata", "qwen3.jinja")


def vllm_messages(msgs):
    out = copy.deepcopy(msgs)
    for m in out:
        rc = m.pop("reasoning_content", None)
        if rc is not None and m.get("reasoning") is None:
            m["reasoning"] = rc
        r = m.pop("reasoning", None)
        if m.get("role") == "assistant" and r is not None:
            m["reasoning"] = r
            m["reasoning_content"] = r
        if m.get("role") != "assistant" or not isinstance(m.get("tool_calls"), list):
            continue
        for tc in m["tool_calls"]:
            a = tc["function"].get("arguments")
            if isinstance(a, str):
                try:
                    tc["function"]["arguments"] = json.loads(a)
                except json.JSONDecodeError:
                    tc["function"]["arguments"] = {}
            elif not isinstance(a, (dict, list)):
                tc["function"]["arguments"] = {}
    return out


def main():
    with open(TEMPLATE, encoding="utf-8") as f:
        tpl = pyref.compile_template(f.read())
    recs = []
    with open(REF, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                recs.append(json.loads(line))
    for rec in recs:
        for key, msgs in (("py_text", rec["messages"]), ("vllm_text", vllm_messages(rec["messages"]))):
            v = {
                "messages": msgs,
                "tools": rec["tools"],
                "documents": None,
                "add_generation_prompt": rec["add_generation_prompt"],
                "bos_token": "",
                "eos_token": "<|im_end|>",
            }
            if rec.get("enable_thinking") is not None:
                v["enable_thinking"] = rec["enable_thinking"]
            rec[key] = tpl.render(**v)
    with open(REF, "w", encoding="utf-8") as f:
        for rec in recs:
            f.write(json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n")
    print(f"wrote py_text and vllm_text of {len(recs)} conversations to {REF}")


if __name__ == "__main__":
    main()
