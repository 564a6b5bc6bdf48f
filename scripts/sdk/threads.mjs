// Drives an infera router's /v1/messages with the Anthropic SDK's message
// threads, as the SDK uses them by default: client.beta.messages.toolRunner
// sends thread {"type":"create"} on its first turn and, on the next, thread
// {"type":"continue","previous_message_id":...} with only the new messages
// (the tool results), counting on the server to hold the conversation. A
// server that holds no threads must refuse the field with a 400 whose
// error.details.error_code is "thread_unsupported_request": toolRunner then
// continues unthreaded (the full history every turn), and
// client.beta.messages.thread().send() raises ThreadUnsupportedRequestError.
//
// Environment: INFERA_BASE_URL (no /v1), INFERA_API_KEY, INFERA_MODEL.
import Anthropic from "@anthropic-ai/sdk";
import { betaTool } from "@anthropic-ai/sdk/helpers/beta/json-schema";
import assert from "node:assert/strict";

const baseURL = process.env.INFERA_BASE_URL;
const model = process.env.INFERA_MODEL;
const sent = [];
const client = new Anthropic({
  baseURL, apiKey: process.env.INFERA_API_KEY || "unused", maxRetries: 0,
  fetch: async (url, init) => { sent.push(JSON.parse(init.body)); return fetch(url, init); },
});

async function step(name, fn) {
  try {
    await fn();
  } catch (e) {
    console.error(`threads sdk check: ${name}: ${e?.stack || e}`);
    for (const b of sent) console.error(`  sent: thread=${JSON.stringify(b.thread)} roles=${JSON.stringify(b.messages?.map((m) => m.role))}`);
    process.exit(1);
  }
}

const weather = betaTool({
  name: "get_weather", description: "Weather of a city",
  inputSchema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
  run: async (input) => `sunny in ${input.city}`,
});

await step("toolRunner", async () => {
  let turns = 0, last;
  for await (const m of client.beta.messages.toolRunner({
    model, max_tokens: 64, max_iterations: 4, tools: [weather],
    messages: [{ role: "user", content: "What is the weather in Paris? (SCEN:tools)" }],
  })) { turns++; last = m; }
  assert.ok(turns >= 2, `${turns} turns`);
  assert.ok(last.content.some((b) => b.type === "text"), "no answer after the tool result");
  // every request that reached the engine carried the whole conversation: the
  // last one the SDK sent without a thread, with the user's question first
  const final = sent.at(-1);
  assert.equal(final.thread, undefined, `the SDK still threads: ${JSON.stringify(final.thread)}`);
  assert.equal(final.messages[0].role, "user");
});

await step("thread().send", async () => {
  const thread = client.beta.messages.thread({ model, max_tokens: 16 });
  await assert.rejects(thread.send({ role: "user", content: "my name is Ann" }), (e) => {
    assert.equal(e.status, 400, `${e?.constructor?.name}: ${e?.message}`);
    assert.equal(e.error?.error?.details?.error_code, "thread_unsupported_request", JSON.stringify(e.error));
    return true;
  });
});

console.log("threads sdk check: ok");
