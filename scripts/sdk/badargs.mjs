// The Anthropic SDK's stream helper on a tool call whose arguments are not
// JSON (vLLM's tool parsers stream such arguments): messages.stream parses
// each input_json_delta's partial_json as it comes and threw on the first
// character no JSON continues with ("Unexpected token 'I'"), losing the
// whole stream. The gateway sends only what keeps the input a JSON
// object's prefix. Environment: INFERA_BASE_URL (no /v1), INFERA_MODEL,
// INFERA_EXPECT_INPUT (the tool_use input the stream must end with, JSON).
import Anthropic from "@anthropic-ai/sdk";
import assert from "node:assert/strict";

const client = new Anthropic({ baseURL: process.env.INFERA_BASE_URL, apiKey: "unused", maxRetries: 0 });
const model = process.env.INFERA_MODEL;
const want = JSON.parse(process.env.INFERA_EXPECT_INPUT);
const tools = [{ name: "get_weather", description: "weather", input_schema: { type: "object", properties: { city: { type: "string" } } } }];
const msg = await client.messages.stream({ model, max_tokens: 64, tools, messages: [{ role: "user", content: "weather in Paris?" }] }).finalMessage();
const use = msg.content.find((b) => b.type === "tool_use");
assert.ok(use, "no tool_use block");
assert.deepEqual(use.input, want);
console.log(`messages.stream finalMessage: ok, input ${JSON.stringify(use.input)}`);
