// The official `openai` npm client (pinned in package.json) against
// `k3-run serve` on the tiny model: plain, streamed, reasoning, usage, errors,
// abort; and tool-call deltas against k3-script-serve (the same server library
// on a scripted token source, since random weights never call tools).
//
// usage: node openai_test.mjs NODE_MODULES K3_RUN MODEL_DIR K3_SCRIPT_SERVE
import { Check, load, metric, startServer, stopServer, waitMetric } from "./lib.mjs";

const [modules, k3Run, modelDir, scriptServe] = process.argv.slice(2);
const { default: OpenAI } = await load(modules, "openai");
const check = new Check();

async function collect(stream) {
  const out = { content: "", reasoning: "", roles: [], finish: [], usage: null, chunks: 0, calls: {} };
  for await (const chunk of stream) {
    out.chunks++;
    if (chunk.usage) out.usage = chunk.usage;
    for (const ch of chunk.choices) {
      const d = ch.delta || {};
      if (d.role) out.roles.push(d.role);
      out.content += d.content || "";
      out.reasoning += d.reasoning_content || "";
      for (const tc of d.tool_calls || []) {
        const slot = (out.calls[tc.index] ||= { id: null, name: null, arguments: "", pieces: 0 });
        if (tc.id) slot.id = tc.id;
        if (tc.function?.name) slot.name = tc.function.name;
        if (tc.function?.arguments) { slot.arguments += tc.function.arguments; slot.pieces++; }
      }
      if (ch.finish_reason) out.finish.push(ch.finish_reason);
    }
  }
  return out;
}

const real = await startServer(k3Run, ["serve", modelDir, "--host", "127.0.0.1", "--port", "0", "--model-id", "k3-tiny"]);
try {
  const client = new OpenAI({ apiKey: "unused", baseURL: `http://127.0.0.1:${real.port}/v1`, maxRetries: 0 });
  const messages = [{ role: "user", content: "Say OK." }];

  // Plain.
  const plain = await client.chat.completions.create({ model: "k3-tiny", messages, max_tokens: 8, seed: 4 });
  const msg = plain.choices[0].message;
  check.ok(typeof msg.content === "string", "plain: message.content is a string");
  check.ok(["stop", "length"].includes(plain.choices[0].finish_reason), "plain: finish_reason");
  check.ok(plain.usage.completion_tokens > 0 && plain.usage.prompt_tokens > 0, "plain: usage");
  check.ok(plain.usage.completion_tokens_details.reasoning_tokens >= 0 &&
           plain.usage.prompt_tokens_details.cached_tokens >= 0, "plain: usage details");
  check.ok(typeof msg.reasoning_content === "string", "plain: reasoning_content (thinking on by default)");

  // Streamed, same seed: the same answer and usage.
  const s = await collect(await client.chat.completions.create({
    model: "k3-tiny", messages, max_tokens: 8, seed: 4, stream: true, stream_options: { include_usage: true } }));
  check.ok(s.roles.length === 1 && s.roles[0] === "assistant", "stream: role once");
  check.ok(s.finish.length === 1 && s.finish[0] === plain.choices[0].finish_reason, "stream: finish once, same");
  check.ok(s.content === msg.content && s.reasoning === msg.reasoning_content, "stream: same text as plain");
  check.ok(s.usage && s.usage.completion_tokens === plain.usage.completion_tokens, "stream: usage chunk");

  // Thinking off: no reasoning.
  const off = await client.chat.completions.create({ model: "k3-tiny", messages, max_tokens: 6, seed: 2,
                                                     thinking: { type: "disabled" } });
  check.ok(!off.choices[0].message.reasoning_content && off.usage.completion_tokens_details.reasoning_tokens === 0,
           "thinking disabled: no reasoning");

  // Errors surface as the SDK's typed errors.
  try {
    await client.chat.completions.create({ model: "k3-tiny", messages, temperature: 1.5 });
    check.ok(false, "locked temperature refused");
  } catch (e) {
    check.ok(e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === "temperature",
             `locked temperature: BadRequestError (${e.constructor.name} ${e.status})`);
  }

  // Abort: the SDK's AbortController; the server cancels.
  const before = await metric(real.port, "k3_requests_cancelled_total");
  const controller = new AbortController();
  const stream = await client.chat.completions.create(
    { model: "k3-tiny", messages, max_tokens: 100000, stream: true }, { signal: controller.signal });
  let aborted = false;
  try {
    for await (const chunk of stream) { if (chunk.choices.length) controller.abort(); }
  } catch (e) { aborted = e.name === "AbortError" || e instanceof OpenAI.APIUserAbortError; }
  check.ok(aborted || stream.controller.signal.aborted, "abort: the stream stops");
  await waitMetric(real.port, "k3_requests_cancelled_total", before + 1);
  check.ok(true, "abort: the server cancelled the request");
  const after = await client.chat.completions.create({ model: "k3-tiny", messages, max_tokens: 2 });
  check.ok(typeof after.choices[0].message.content === "string", "serves after an abort");
} finally {
  await stopServer(real);
}

const keyed = await startServer(k3Run, ["serve", modelDir, "--host", "127.0.0.1", "--port", "0", "--api-key", "sk-js"]);
try {
  const bad = new OpenAI({ apiKey: "sk-wrong", baseURL: `http://127.0.0.1:${keyed.port}/v1`, maxRetries: 0 });
  try {
    await bad.chat.completions.create({ model: "x", messages: [{ role: "user", content: "x" }], max_tokens: 1 });
    check.ok(false, "wrong key refused");
  } catch (e) {
    check.ok(e instanceof OpenAI.AuthenticationError && e.status === 401, "wrong key: AuthenticationError 401");
  }
  const good = new OpenAI({ apiKey: "sk-js", baseURL: `http://127.0.0.1:${keyed.port}/v1`, maxRetries: 0 });
  const models = await good.models.list();
  check.ok(models.data.length === 1, "right key: models.list()");
} finally {
  await stopServer(keyed);
}

// Tool-call deltas through the SDK (scripted tokens, real parser and serializer).
const script = await startServer(scriptServe, [modelDir]);
try {
  const client = new OpenAI({ apiKey: "x", baseURL: `http://127.0.0.1:${script.port}/v1`, maxRetries: 0 });
  const tools = [
    { type: "function", function: { name: "get_weather", parameters: { type: "object", properties: { city: { type: "string" } } } } },
    { type: "function", function: { name: "get_time", parameters: { type: "object", properties: { tz: { type: "string" } } } } },
  ];
  const req = { model: "k3-script", messages: [{ role: "user", content: "weather and time in Beijing?" }], tools };
  const s = await collect(await client.chat.completions.create({ ...req, stream: true }));
  const calls = Object.keys(s.calls).sort().map((k) => s.calls[k]);
  check.ok(calls.length === 2 && calls[0].name === "get_weather" && calls[1].name === "get_time", "stream: two tool calls");
  check.ok(calls.every((c) => c.id && c.pieces > 1), "stream: ids, arguments in several pieces");
  check.ok(JSON.parse(calls[0].arguments).city === "北京 (Beijing)" && JSON.parse(calls[1].arguments).tz === "Asia/Shanghai",
           `stream: arguments JSON (${calls.map((c) => c.arguments)})`);
  check.ok(s.finish.length === 1 && s.finish[0] === "tool_calls", "stream: finish_reason tool_calls");
  check.ok(s.reasoning.includes("北京") && s.content === "Checking both 🙂", "stream: reasoning and content");
  const whole = await client.chat.completions.create(req);
  const m = whole.choices[0].message;
  check.ok(m.tool_calls.length === 2 && m.tool_calls[0].function.arguments === calls[0].arguments &&
           m.tool_calls[1].function.arguments === calls[1].arguments, "whole: the same tool calls");
  check.ok(whole.choices[0].finish_reason === "tool_calls" && m.content === "Checking both 🙂", "whole: finish and content");
  // The SDK's own stream helper accumulates our chunks into a completion.
  if (check.ok(typeof client.chat.completions.stream === "function", "SDK has chat.completions.stream")) {
    const runner = client.chat.completions.stream({ ...req, stream: true });
    const final = await runner.finalChatCompletion();
    const fm = final.choices[0].message;
    check.ok(fm.tool_calls?.length === 2 && fm.tool_calls[0].function.arguments === calls[0].arguments,
             "SDK stream helper rebuilds the tool calls");
  }
} finally {
  await stopServer(script);
}

process.exit(check.done());
