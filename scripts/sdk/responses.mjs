// Drives an infera router's /v1/responses with the official OpenAI Node
// SDK's responses.create: plain and streamed, function tools over two
// turns, and the refusal of previous_response_id (with
// INFERA_RESPONSES_STORED=1, engines that store responses behind a
// passthrough router: follow-ups answered, responses.retrieve and
// responses.cancel on the engine holding the response, a background
// response created queued and cancelled there, an unknown id 404).
//
// Environment: INFERA_BASE_URL (http://127.0.0.1:PORT, no /v1),
// INFERA_API_KEY, INFERA_MODEL; INFERA_EXPECT_THINKING=1 also requires
// reasoning items when reasoning is asked for (an engine that reasons).
// Exits non-zero with a message on the first mismatch.
import OpenAI from "openai";
import assert from "node:assert/strict";

const base = process.env.INFERA_BASE_URL;
const model = process.env.INFERA_MODEL;
if (!base || !model) {
  console.error("responses sdk check: set INFERA_BASE_URL and INFERA_MODEL");
  process.exit(2);
}
const client = new OpenAI({ baseURL: base.replace(/\/$/, "") + "/v1", apiKey: process.env.INFERA_API_KEY || "unused", maxRetries: 0 });

async function step(name, fn) {
  try {
    await fn();
  } catch (e) {
    console.error(`responses sdk check: ${name}: ${e?.stack || e}`);
    process.exit(1);
  }
}

const textOf = (r) => r.output.filter((o) => o.type === "message")
  .flatMap((o) => o.content).filter((c) => c.type === "output_text").map((c) => c.text).join("");

await step("responses.create", async () => {
  const r = await client.responses.create({ model, instructions: "be brief", input: "hello there", max_output_tokens: 8 });
  assert.equal(r.object, "response");
  assert.match(r.id, /^resp_/);
  assert.equal(r.model, model);
  assert.ok(["completed", "incomplete"].includes(r.status), `status ${r.status}`);
  assert.ok(textOf(r).length > 0, "no output text");
  assert.equal(r.output_text, textOf(r));
  assert.ok(r.usage.input_tokens > 0 && r.usage.output_tokens > 0, "no usage");
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
});

await step("responses.create stream", async () => {
  const s = await client.responses.create({
    model, stream: true, max_output_tokens: 16,
    input: [{ role: "user", content: [{ type: "input_text", text: "stream please" }] }],
  });
  const types = [];
  let text = "", done;
  let seq = -1;
  for await (const e of s) {
    types.push(e.type);
    assert.equal(e.sequence_number, seq + 1, "sequence_number gap");
    seq = e.sequence_number;
    if (e.type === "response.output_text.delta") text += e.delta;
    if (e.type === "response.completed" || e.type === "response.incomplete") done = e.response;
  }
  assert.equal(types[0], "response.created");
  assert.equal(types[1], "response.in_progress");
  for (const t of ["response.output_item.added", "response.content_part.added", "response.output_text.done",
    "response.content_part.done", "response.output_item.done"]) {
    assert.ok(types.includes(t), `no ${t} event`);
  }
  assert.ok(done, "no response.completed");
  assert.ok(text.length > 0, "no text deltas");
  assert.equal(textOf(done), text);
  assert.ok(done.usage.output_tokens > 0, "no usage in response.completed");

  // the SDK's stream helper accumulates the same answer
  const final = await client.responses.stream({ model, input: "stream please", max_output_tokens: 16 }).finalResponse();
  assert.ok(textOf(final).length > 0, "responses.stream: no text");
});

const tools = [{
  type: "function", name: "get_weather", description: "Weather of a city", strict: false,
  parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
}];

await step("function tools", async () => {
  const input = [{ role: "user", content: "What is the weather in Paris?" }];
  const r = await client.responses.create({ model, input, tools, tool_choice: "required" });
  const call = r.output.find((o) => o.type === "function_call");
  assert.ok(call, "no function_call item");
  assert.equal(call.name, "get_weather");
  assert.equal(typeof JSON.parse(call.arguments), "object");
  assert.ok(call.call_id.length > 0);

  const s = await client.responses.create({ model, input, tools, stream: true });
  let args = "", item;
  for await (const e of s) {
    if (e.type === "response.function_call_arguments.delta") args += e.delta;
    if (e.type === "response.output_item.done" && e.item.type === "function_call") item = e.item;
  }
  assert.ok(item, "no streamed function_call item");
  assert.equal(item.arguments, args);
  assert.deepEqual(JSON.parse(args), JSON.parse(call.arguments));

  const r2 = await client.responses.create({
    model, tools,
    input: [...input, call, { type: "function_call_output", call_id: call.call_id, output: "sunny, 21C" }],
  });
  assert.ok(textOf(r2).length > 0, "no answer after the function output");
});

await step("reasoning", async () => {
  const r = await client.responses.create({ model, input: "think first", reasoning: { effort: "high" }, max_output_tokens: 32 });
  if (process.env.INFERA_EXPECT_THINKING === "1") {
    const item = r.output.find((o) => o.type === "reasoning");
    assert.ok(item, "no reasoning item");
    assert.equal(r.output[0].type, "reasoning", "reasoning must come first");
    assert.ok(item.content?.[0]?.text?.length > 0, "empty reasoning text");
  }
  assert.ok(textOf(r).length > 0, "no output text after reasoning");
});

if (process.env.INFERA_RESPONSES_STORED === "1") {
  // Passthrough to engines that store responses: a follow-up reaches the
  // engine holding its previous response (turn after turn), an unknown id
  // is the engine's 404.
  await step("previous_response_id followed", async () => {
    let prev = await client.responses.create({ model, input: "hi", max_output_tokens: 8 });
    for (let i = 0; i < 4; i++) {
      const r = await client.responses.create({ model, input: "again", previous_response_id: prev.id, max_output_tokens: 8 });
      assert.ok(r.id && r.id !== prev.id, "no new id");
      prev = r;
    }
  });
  await step("responses.retrieve and cancel", async () => {
    // Each on the engine that stored the response (two engines: a
    // retrieve routed by load would miss half the time).
    for (let i = 0; i < 4; i++) {
      const created = await client.responses.create({ model, input: "keep this", max_output_tokens: 8 });
      const got = await client.responses.retrieve(created.id);
      assert.equal(got.id, created.id);
      assert.equal(got.status, created.status);
      assert.equal(textOf(got), textOf(created));
      await assert.rejects(client.responses.cancel(created.id),
        (e) => e.status === 400 && /Cannot cancel a synchronous response/.test(e.error?.message));
    }
    await assert.rejects(client.responses.retrieve("resp_123"),
      (e) => e.status === 404 && e.error?.param === "response_id" && /not found/.test(e.error?.message));
  });
  await step("background responses.create, retrieve and cancel", async () => {
    // A long background response (seconds of generation): answered at once
    // queued, retrieved queued (vLLM stores no in_progress for it), then
    // cancelled on the engine running it.
    const created = await client.responses.create({ model, input: "take your time", max_output_tokens: 30000, background: true });
    assert.equal(created.status, "queued");
    assert.equal(created.background, true);
    assert.deepEqual(created.output, []);
    assert.equal(created.usage, null);
    const got = await client.responses.retrieve(created.id);
    assert.equal(got.id, created.id);
    assert.equal(got.status, "queued");
    const cancelled = await client.responses.cancel(created.id);
    assert.equal(cancelled.id, created.id);
    assert.equal(cancelled.status, "cancelled");
    assert.equal((await client.responses.retrieve(created.id)).status, "cancelled");
    await assert.rejects(client.responses.cancel(created.id),
      (e) => e.status === 400 && /Cannot cancel a synchronous response/.test(e.error?.message));
  });
  await step("unknown previous_response_id", async () => {
    await assert.rejects(
      client.responses.create({ model, input: "again", previous_response_id: "resp_123" }),
      (e) => e.status === 404 && e.error?.type === "invalid_request_error" && /not found/.test(e.error?.message),
    );
  });
} else {
  await step("previous_response_id refused", async () => {
    await assert.rejects(
      client.responses.create({ model, input: "again", previous_response_id: "resp_123" }),
      (e) => e.status === 400 && e.error?.type === "invalid_request_error" && e.error?.param === "previous_response_id",
    );
  });
}

console.log("responses sdk check: ok");
