// The OpenAI SDK's Responses helpers on a function call that takes no
// arguments: with a strict tool, responses.parse and responses.stream's
// finalResponse JSON.parse each function_call's arguments (lib/ResponsesParser
// parseToolCall), as OpenAI sends "{}" for such a call.
// Environment: INFERA_BASE_URL (no /v1), INFERA_MODEL.
import OpenAI from "openai";
import assert from "node:assert/strict";

const client = new OpenAI({ baseURL: process.env.INFERA_BASE_URL + "/v1", apiKey: "unused", maxRetries: 0 });
const model = process.env.INFERA_MODEL;
const tools = [{ type: "function", name: "now", description: "the time", strict: true,
  parameters: { type: "object", properties: {}, required: [], additionalProperties: false } }];
let failed = 0;
for (const [name, call] of [
  ["responses.create", async () => (await client.responses.create({ model, input: "what time is it?", tools })).output],
  ["responses.parse", async () => (await client.responses.parse({ model, input: "what time is it?", tools })).output],
  ["responses.stream finalResponse", async () => (await client.responses.stream({ model, input: "what time is it?", tools }).finalResponse()).output],
]) {
  try {
    const call0 = (await call()).find((o) => o.type === "function_call");
    assert.ok(call0, "no function_call");
    assert.equal(call0.arguments.trim(), "{}", `arguments ${JSON.stringify(call0.arguments)}`);
    console.log(`${name}: ok, arguments ${JSON.stringify(call0.arguments)}`);
  } catch (e) {
    failed++;
    console.error(`${name}: ${e?.constructor?.name}: ${e?.message}`);
  }
}
process.exit(failed ? 1 : 0);
