// Drives an infera router's user limits with the official OpenAI and
// Anthropic Node SDKs at their default retry settings (maxRetries 2): the
// answers of a user whose template has an RPM of 100 and a monthly quota of
// 2 requests carry the rate limit headers each SDK's users read
// (x-ratelimit-* / anthropic-ratelimit-*), and once the quota is spent each
// SDK raises its RateLimitError at once, without retrying (the router says
// X-Should-Retry: false; the Anthropic SDK would otherwise sleep until the
// month ends).
//
// Environment: INFERA_BASE_URL (http://127.0.0.1:PORT, no /v1),
// INFERA_API_KEY (the user's key), INFERA_MODEL. Exits non-zero with a
// message on the first mismatch.
import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";
import assert from "node:assert/strict";

const baseURL = process.env.INFERA_BASE_URL;
const model = process.env.INFERA_MODEL;
const apiKey = process.env.INFERA_API_KEY;
if (!baseURL || !model || !apiKey) {
  console.error("limits sdk check: set INFERA_BASE_URL, INFERA_API_KEY and INFERA_MODEL");
  process.exit(2);
}
const openai = new OpenAI({ baseURL: baseURL + "/v1", apiKey });
const anthropic = new Anthropic({ baseURL, apiKey });

async function step(name, fn) {
  try {
    await fn();
  } catch (e) {
    console.error(`limits sdk check: ${name}: ${e?.stack || e}`);
    process.exit(1);
  }
}

await step("openai headers", async () => {
  const { data, response } = await openai.chat.completions
    .create({ model, max_tokens: 4, messages: [{ role: "user", content: "hello" }] })
    .withResponse();
  assert.ok(data.choices.length > 0);
  assert.equal(response.headers.get("x-ratelimit-limit-requests"), "100");
  assert.equal(response.headers.get("x-ratelimit-remaining-requests"), "99");
  assert.match(response.headers.get("x-ratelimit-reset-requests"), /^[0-9.]+m?s$/);
  assert.ok(response.headers.get("x-request-id"));
});

await step("anthropic headers", async () => {
  const { data, response } = await anthropic.messages
    .create({ model, max_tokens: 4, messages: [{ role: "user", content: "hello" }] })
    .withResponse();
  assert.equal(data.type, "message");
  assert.equal(response.headers.get("anthropic-ratelimit-requests-limit"), "100");
  assert.ok(Number(response.headers.get("anthropic-ratelimit-requests-remaining")) <= 98);
  assert.ok(!Number.isNaN(Date.parse(response.headers.get("anthropic-ratelimit-requests-reset"))));
});

for (const [name, call, Err] of [
  ["anthropic quota spent", () => anthropic.messages.create({ model, max_tokens: 4, messages: [{ role: "user", content: "again" }] }), Anthropic.RateLimitError],
  ["openai quota spent", () => openai.chat.completions.create({ model, max_tokens: 4, messages: [{ role: "user", content: "again" }] }), OpenAI.RateLimitError],
]) {
  await step(name, async () => {
    const start = Date.now();
    await assert.rejects(call(), (e) => {
      assert.ok(e instanceof Err, `${e?.constructor?.name}: ${e?.message}`);
      assert.equal(e.status, 429);
      assert.equal(e.headers?.get ? e.headers.get("x-should-retry") : e.headers?.["x-should-retry"], "false");
      return true;
    });
    const took = Date.now() - start;
    assert.ok(took < 3000, `the SDK took ${took} ms: it retried`);
  });
}
console.log("limits sdk check: headers read by both SDKs; quota refusals not retried");
