// Drives an infera router's /v1/messages with the official Anthropic Node
// SDK, as a Claude-style client would: a plain message, a streamed one
// (MessageStream's event sequence and final message), tool use over two
// turns, token counting and the error shape.
//
// Environment: INFERA_BASE_URL (http://127.0.0.1:PORT, no /v1),
// INFERA_API_KEY (sent as x-api-key), INFERA_MODEL; INFERA_EXPECT_THINKING=1
// also requires thinking blocks when thinking is enabled (an engine that
// reasons). Exits non-zero with a message on the first mismatch.
import Anthropic from "@anthropic-ai/sdk";
import assert from "node:assert/strict";

const baseURL = process.env.INFERA_BASE_URL;
const model = process.env.INFERA_MODEL;
if (!baseURL || !model) {
  console.error("anthropic sdk check: set INFERA_BASE_URL and INFERA_MODEL");
  process.exit(2);
}
const client = new Anthropic({ baseURL, apiKey: process.env.INFERA_API_KEY || "unused", maxRetries: 0 });

async function step(name, fn) {
  try {
    await fn();
  } catch (e) {
    console.error(`anthropic sdk check: ${name}: ${e?.stack || e}`);
    process.exit(1);
  }
}

await step("messages.create", async () => {
  const m = await client.messages.create({
    model, max_tokens: 8,
    system: "be brief",
    messages: [{ role: "user", content: "hello there" }],
  });
  assert.equal(m.type, "message");
  assert.equal(m.role, "assistant");
  assert.equal(m.model, model);
  assert.match(m.id, /^msg_/);
  const text = m.content.filter((b) => b.type === "text").map((b) => b.text).join("");
  assert.ok(text.length > 0, "no text block");
  assert.ok(["end_turn", "max_tokens", "stop_sequence"].includes(m.stop_reason), `stop_reason ${m.stop_reason}`);
  assert.ok(m.usage.input_tokens + (m.usage.cache_read_input_tokens ?? 0) > 0, "no input tokens");
  assert.ok(m.usage.output_tokens > 0, "no output tokens");
  allTyped(m);
});

// Every field the SDK types as required (nullable or not) is present, as
// the API sends them: a client reading m.usage.server_tool_use gets null,
// not undefined.
function allTyped(m) {
  for (const k of ["container", "diagnostics", "stop_details", "stop_sequence"]) {
    assert.ok(m[k] !== undefined, `message without ${k}`); // "in" is true for a key set to undefined
  }
  for (const k of ["cache_creation", "cache_creation_input_tokens", "cache_read_input_tokens", "inference_geo",
    "output_tokens_details", "server_tool_use", "service_tier", "speed"]) {
    assert.ok(m.usage[k] !== undefined, `usage without ${k}`);
  }
  assert.equal(m.usage.cache_creation.ephemeral_5m_input_tokens, 0);
  for (const b of m.content) {
    if (b.type === "text") assert.ok(b.citations !== undefined, "text block without citations");
    if (b.type === "tool_use") assert.equal(b.caller?.type, "direct", "tool_use block without caller");
  }
}

await step("messages.stream", async () => {
  const seen = [];
  let text = "";
  const stream = client.messages
    .stream({
      model, max_tokens: 16,
      system: [{ type: "text", text: "be brief" }],
      messages: [{ role: "user", content: [{ type: "text", text: "stream please" }] }],
    })
    .on("streamEvent", (e) => seen.push(e.type))
    .on("text", (delta) => { text += delta; });
  const final = await stream.finalMessage();
  assert.equal(seen[0], "message_start");
  assert.equal(seen.at(-1), "message_stop");
  assert.equal(seen.at(-2), "message_delta");
  for (const t of ["content_block_start", "content_block_delta", "content_block_stop"]) {
    assert.ok(seen.includes(t), `no ${t} event`);
  }
  assert.ok(text.length > 0, "no text deltas");
  const finalText = final.content.filter((b) => b.type === "text").map((b) => b.text).join("");
  assert.equal(finalText, text);
  assert.ok(final.stop_reason, "no stop_reason in the final message");
  assert.ok(final.usage.output_tokens > 0, "no output tokens in the final usage");
  allTyped(final);
});

const tools = [{
  name: "get_weather",
  description: "Weather of a city",
  input_schema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
}];

await step("tool use", async () => {
  const ask = { role: "user", content: "What is the weather in Paris?" };
  const m = await client.messages.create({ model, max_tokens: 64, tools, tool_choice: { type: "any" }, messages: [ask] });
  assert.equal(m.stop_reason, "tool_use");
  const call = m.content.find((b) => b.type === "tool_use");
  assert.ok(call, "no tool_use block");
  assert.equal(call.name, "get_weather");
  assert.equal(typeof call.input, "object");
  assert.ok(call.id.length > 0);
  allTyped(m);

  // the same through a stream: the SDK rebuilds input from input_json_delta
  const s = await client.messages.stream({ model, max_tokens: 64, tools, messages: [ask] }).finalMessage();
  const scall = s.content.find((b) => b.type === "tool_use");
  assert.ok(scall, "no streamed tool_use block");
  assert.deepEqual(scall.input, call.input);
  assert.equal(s.stop_reason, "tool_use");
  allTyped(s);

  const m2 = await client.messages.create({
    model, max_tokens: 16, tools,
    messages: [ask, { role: "assistant", content: m.content },
      { role: "user", content: [{ type: "tool_result", tool_use_id: call.id, content: "sunny, 21C" }] }],
  });
  assert.ok(m2.content.some((b) => b.type === "text" && b.text.length > 0), "no answer after the tool result");
});

await step("structured output (messages.parse)", async () => {
  // The engine answers in the schema's shape, as guided decoding does: protocol's
  // test engine with {"answer": "Paris"}, infera engine with "sim" for a string.
  if (typeof client.messages.parse !== "function") return; // an SDK before structured outputs
  const m = await client.messages.parse({
    model, max_tokens: 64,
    output_config: { format: { type: "json_schema", schema: { type: "object", properties: { answer: { type: "string" } }, required: ["answer"], additionalProperties: false } } },
    messages: [{ role: "user", content: "Capital of France? Answer in JSON." }],
  });
  assert.ok(["Paris", "sim"].includes(m.parsed_output?.answer), `parsed_output ${JSON.stringify(m.parsed_output)}`);
});

await step("thinking", async () => {
  const params = { model, max_tokens: 32, thinking: { type: "enabled", budget_tokens: 1024 },
    messages: [{ role: "user", content: "think first" }] };
  const m = await client.messages.create(params);
  let thinking = "";
  const final = await client.messages.stream(params).on("thinking", (d) => { thinking += d; }).finalMessage();
  if (process.env.INFERA_EXPECT_THINKING === "1") {
    const block = m.content.find((b) => b.type === "thinking");
    assert.ok(block && block.thinking.length > 0, "no thinking block");
    assert.equal(m.content[0].type, "thinking", "thinking must come first");
    assert.ok(thinking.length > 0, "no thinking_delta events");
    assert.equal(final.content.find((b) => b.type === "thinking")?.thinking, thinking);
  }
  assert.ok(final.content.some((b) => b.type === "text"), "no text after thinking");
});

await step("messages.countTokens", async () => {
  const short = await client.messages.countTokens({ model, messages: [{ role: "user", content: "hi" }] });
  const long = await client.messages.countTokens({
    model, system: "You are a helpful assistant.", tools,
    messages: [{ role: "user", content: "hi ".repeat(200) }],
  });
  assert.ok(short.input_tokens > 0, "no tokens counted");
  assert.ok(long.input_tokens > short.input_tokens, `${long.input_tokens} <= ${short.input_tokens}`);
});

await step("error shape", async () => {
  await assert.rejects(
    client.messages.create({ model, max_tokens: 8, messages: [{ role: "robot", content: "x" }] }),
    (e) => e.status === 400 && e.error?.type === "error" && e.error?.error?.type === "invalid_request_error",
  );
});

if (process.env.INFERA_ROUTER === "1") {
  // The router's /v1/models carries Anthropic's fields beside OpenAI's.
  await step("models", async () => {
    const page = await client.models.list();
    const m = page.data.find((x) => x.id === model);
    assert.ok(m, `no ${model} in ${JSON.stringify(page.data)}`);
    assert.equal(m.type, "model");
    assert.equal(m.display_name, model);
    assert.ok(!Number.isNaN(new Date(m.created_at).getTime()), `created_at ${m.created_at}`);
    assert.equal(page.has_more, false);
    const one = await client.models.retrieve(model);
    assert.equal(one.display_name, model);
  });
}

console.log("anthropic sdk check: ok");
