// The official `openai` npm client's Responses API (responses.create and
// responses.stream, whose accumulator validates every event's item id, index
// and order) against `k3-run serve` on the tiny model, and function calls
// against k3-script-serve (random weights never call tools). Prompt tokens
// equal `k3-run render` of the chat.completions twin.
//
// usage: node responses_test.mjs NODE_MODULES K3_RUN MODEL_DIR K3_SCRIPT_SERVE
import { execFileSync } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Check, load, startServer, stopServer } from "./lib.mjs";

const [modules, k3Run, modelDir, scriptServe] = process.argv.slice(2);
const { default: OpenAI } = await load(modules, "openai");
const check = new Check();

function renderCount(request) {
  const path = join(mkdtempSync(join(tmpdir(), "k3-resp-")), "req.json");
  writeFileSync(path, JSON.stringify(request));
  const out = JSON.parse(execFileSync(k3Run, ["render", modelDir, "--request", path, "--bos", "--json"]).toString());
  return out.ids.length;
}

const real = await startServer(k3Run, ["serve", modelDir, "--host", "127.0.0.1", "--port", "0", "--model-id", "k3-tiny"]);
try {
  const client = new OpenAI({ apiKey: "unused", baseURL: `http://127.0.0.1:${real.port}/v1`, maxRetries: 0 });
  const input = [{ role: "developer", content: "Be brief." }, { role: "user", content: "Say OK." }];
  const whole = await client.responses.create({ model: "k3-tiny", instructions: "You are k3.", input,
                                                max_output_tokens: 8, reasoning: { effort: "low" } });
  check.ok(whole.object === "response" && ["completed", "incomplete"].includes(whole.status), "create: a response");
  check.ok(whole.output.length >= 1 && whole.output.every((i) => typeof i.id === "string"), "create: output items");
  check.ok(typeof whole.output_text === "string", "create: output_text (the SDK's sum of output_text parts)");
  check.ok(whole.usage.input_tokens > 0 && whole.usage.output_tokens > 0 &&
           whole.usage.input_tokens_details.cached_tokens >= 0 &&
           whole.usage.output_tokens_details.reasoning_tokens >= 0, "create: usage with cached and reasoning tokens");
  // The prompt is the chat.completions twin's: system (instructions), system
  // (developer), user; effort low.
  const twin = { messages: [{ role: "system", content: "You are k3." }, { role: "system", content: "Be brief." },
                            { role: "user", content: "Say OK." }],
                 options: { thinking: true, thinking_effort: "low" } };
  const rendered = renderCount(twin);
  check.ok(whole.usage.input_tokens === rendered, `input_tokens ${whole.usage.input_tokens} == render's ${rendered}`);

  // responses.stream: the SDK's strict accumulator accepts every event.
  const stream = client.responses.stream({ model: "k3-tiny", input: "Say OK.", max_output_tokens: 8 });
  const types = [];
  stream.on("event", (e) => types.push(e.type));
  const final = await stream.finalResponse();
  check.ok(types[0] === "response.created" && types[1] === "response.in_progress", "stream: created, in_progress first");
  check.ok(["response.completed", "response.incomplete"].includes(types.at(-1)), "stream: completed / incomplete last");
  check.ok(final.output.length >= 1 && final.usage.input_tokens > 0, "stream: final response with usage");

  // Errors: a refused request is a 400 the SDK raises with the field named.
  try {
    await client.responses.create({ model: "k3-tiny", input: "x", previous_response_id: "resp_1" });
    check.ok(false, "previous_response_id: refused");
  } catch (e) {
    check.ok(e.status === 400 && e.param === "previous_response_id", "previous_response_id: 400 naming the field");
  }
} finally {
  await stopServer(real);
}

const scripted = await startServer(scriptServe, [modelDir]);
try {
  const client = new OpenAI({ apiKey: "unused", baseURL: `http://127.0.0.1:${scripted.port}/v1`, maxRetries: 0 });
  const tools = [{ type: "function", name: "get_weather", parameters: { type: "object", properties: { city: { type: "string" } } } },
                 { type: "function", name: "get_time", parameters: { type: "object", properties: { tz: { type: "string" } } } },
                 { type: "web_search" }];
  const stream = client.responses.stream({ model: "k3", input: "Weather and time in Beijing?", tools });
  let args = "";
  stream.on("response.function_call_arguments.delta", (e) => { args += e.delta; });
  const final = await stream.finalResponse();
  const calls = final.output.filter((i) => i.type === "function_call");
  check.ok(calls.length === 2 && calls[0].name === "get_weather" && calls[1].name === "get_time", "stream: two function_call items");
  check.ok(JSON.parse(calls[0].arguments).city === "北京 (Beijing)", "stream: arguments with multi-byte text intact");
  check.ok(args === calls[0].arguments + calls[1].arguments, "stream: argument deltas add up to the items");
  check.ok(final.output[0].type === "reasoning" && final.output[0].content[0].text.includes("北京"), "stream: reasoning item");
  check.ok(final.output_text === "Checking both 🙂", "stream: output_text");
  const whole = await client.responses.create({ model: "k3", input: "Weather?", tools });
  check.ok(JSON.stringify(whole.output.map((i) => [i.type, i.name ?? null, i.arguments ?? null])) ===
           JSON.stringify(final.output.map((i) => [i.type, i.name ?? null, i.arguments ?? null])),
           "create: the same items as the stream");
} finally {
  await stopServer(scripted);
}
process.exit(check.done());
