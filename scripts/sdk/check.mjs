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
console.log("openai sdk check: ok");
