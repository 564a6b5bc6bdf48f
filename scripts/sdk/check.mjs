// Drives an infera router with the official OpenAI Node SDK, as a user
// would: chat and completions, streaming and not, usage, model listing and
// the error shape. Usage: node check.mjs http://127.0.0.1:PORT/v1 MODEL
import OpenAI from "openai";
import assert from "node:assert/strict";

const [baseURL, model] = process.argv.slice(2);
const c = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0 });

const r = await c.chat.completions.create({ model, max_tokens: 5, messages: [{ role: "user", content: "hi" }] });
assert.equal(r.object, "chat.completion");
assert.equal(r.usage.completion_tokens, 5);
assert.ok(r.choices[0].message.content.length > 0);

const s = await c.chat.completions.create({
  model, max_tokens: 6, stream: true, stream_options: { include_usage: true },
  messages: [{ role: "system", content: "be brief" }, { role: "user", content: [{ type: "text", text: "hello" }] }],
});
let text = "", usage, chunks = 0;
for await (const ch of s) {
  chunks++;
  if (ch.choices[0]?.delta?.content) text += ch.choices[0].delta.content;
  if (ch.usage) usage = ch.usage;
}
assert.ok(chunks >= 6, `only ${chunks} chunks`);
assert.ok(text.length > 0);
assert.equal(usage.completion_tokens, 6);

const comp = await c.completions.create({ model, prompt: "Once upon a time", max_tokens: 3 });
assert.equal(comp.usage.completion_tokens, 3);

const models = await c.models.list();
assert.ok(models.data.some((m) => m.id === model));
const one = await c.models.retrieve(model);
assert.equal(one.id, model);
assert.equal(one.object, "model");
await assert.rejects(c.models.retrieve("no-such-model"), (e) => e.status === 404 && e.code === "model_not_found");

await assert.rejects(
  c.chat.completions.create({ model: "no-such-model", messages: [{ role: "user", content: "x" }] }),
  (e) => e.status === 404 && e.error?.type === "not_found_error",
);
await assert.rejects(
  c.chat.completions.create({ model, messages: "not an array" }),
  (e) => e.status === 400 && e.error?.type === "invalid_request_error",
);
// Embeddings: the SDK asks for base64 by default and decodes it to floats.
const e1 = await c.embeddings.create({ model, input: "the quick brown fox" });
assert.equal(e1.object, "list");
assert.equal(e1.data.length, 1);
assert.equal(e1.data[0].index, 0);
assert.equal(e1.data[0].embedding.length, 256);
const norm = Math.hypot(...e1.data[0].embedding);
assert.ok(Math.abs(norm - 1) < 1e-5, `unit vector, norm ${norm}`);
assert.ok(e1.usage.prompt_tokens > 0 && e1.usage.total_tokens === e1.usage.prompt_tokens);
const e2 = await c.embeddings.create({ model, input: ["the quick brown fox", "jumps"], dimensions: 64, encoding_format: "float" });
assert.equal(e2.data.length, 2);
assert.deepEqual(e2.data.map((d) => d.index), [0, 1]);
assert.equal(e2.data[0].embedding.length, 64);
const e3 = await c.embeddings.create({ model, input: "the quick brown fox", dimensions: 64 });
assert.ok(e3.data[0].embedding.every((x, i) => Math.abs(x - e2.data[0].embedding[i]) < 1e-6), "base64 and float agree");
const e4 = await c.embeddings.create({ model, input: [[1, 2, 3], [4, 5]] });
assert.equal(e4.usage.prompt_tokens, 5);
await assert.rejects(
  c.embeddings.create({ model, input: "" }),
  (e) => e.status === 400 && e.error?.param === "input",
);
await assert.rejects(
  c.embeddings.create({ model: "no-such-model", input: "x" }),
  (e) => e.status === 404 && e.code === "model_not_found",
);
console.log("openai sdk check: ok");
