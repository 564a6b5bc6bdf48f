// Retrieves stored Responses by id with the official OpenAI Node SDK's
// responses.retrieve through an infera router that did not create them
// (routers sharing their Responses table through --state redis): each id
// in INFERA_RESPONSE_IDS (comma-separated) is answered by the engine
// holding it, and an id no router recorded is the router's 404 as vLLM
// answers it.
//
// Environment: INFERA_BASE_URL (http://127.0.0.1:PORT, no /v1),
// INFERA_API_KEY, INFERA_RESPONSE_IDS. Exits non-zero with a message on
// the first mismatch.
import OpenAI from "openai";
import assert from "node:assert/strict";

const base = process.env.INFERA_BASE_URL;
const ids = (process.env.INFERA_RESPONSE_IDS || "").split(",").filter(Boolean);
if (!base || ids.length === 0) {
  console.error("retrieve sdk check: set INFERA_BASE_URL and INFERA_RESPONSE_IDS");
  process.exit(2);
}
const client = new OpenAI({ baseURL: base.replace(/\/$/, "") + "/v1", apiKey: process.env.INFERA_API_KEY || "unused", maxRetries: 0 });

try {
  for (const id of ids) {
    const r = await client.responses.retrieve(id);
    assert.equal(r.object, "response");
    assert.equal(r.id, id);
    assert.ok(["completed", "incomplete", "queued", "in_progress", "cancelled"].includes(r.status), `status ${r.status}`);
    console.log(`retrieved ${id}: ${r.status}`);
  }
  await assert.rejects(client.responses.retrieve("resp_nobodyrecordedthis"),
    (e) => e.status === 404 && e.error?.param === "response_id" && /not found/.test(e.error?.message));
} catch (e) {
  console.error(`retrieve sdk check: ${e?.stack || e}`);
  process.exit(1);
}
