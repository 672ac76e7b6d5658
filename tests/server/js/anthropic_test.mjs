// The official `@anthropic-ai/sdk` npm client (pinned in package.json)
// against `k3-run serve` on the tiny model: /v1/messages plain and streamed
// (event order checked on the raw events, the SDK's MessageStream rebuilding
// the same message), thinking on/off, stop sequences, count_tokens (equal to
// the OpenAI route's prompt for the twin request), forced tool use
// (tool_choice any / tool, inputs validated against their schemas, a
// tool_result turn), errors as the SDK's typed errors, x-api-key and Bearer
// auth, abort; and the SDK's tool-use deltas against k3-script-serve (the same
// server library on a scripted token source: thinking, text and two calls).
//
// usage: node anthropic_test.mjs NODE_MODULES K3_RUN MODEL_DIR K3_SCRIPT_SERVE
import { Check, load, metric, startServer, stopServer, waitMetric } from "./lib.mjs";

const [modules, k3Run, modelDir, scriptServe] = process.argv.slice(2);
const { default: Anthropic } = await load(modules, "@anthropic-ai/sdk");
const check = new Check();

// Checks Anthropic's event grammar on raw stream events:
// message_start (content_block_start delta* content_block_stop)* message_delta message_stop.
function checkEventOrder(events, what) {
  const types = events.map((e) => e.type);
  let ok = types[0] === "message_start" && types.at(-1) === "message_stop" && types.at(-2) === "message_delta";
  let open = -1, next = 0;
  for (const e of events.slice(1, -2)) {
    if (e.type === "content_block_start") { ok &&= open === -1 && e.index === next; open = e.index; }
    else if (e.type === "content_block_delta") ok &&= e.index === open;
    else if (e.type === "content_block_stop") { ok &&= e.index === open; open = -1; next++; }
    else ok = false;
  }
  check.ok(ok && open === -1, `${what}: event order (${types.join(" ")})`);
}

async function rawEvents(client, params) {
  const events = [];
  for await (const e of await client.messages.create({ ...params, stream: true })) events.push(e);
  return events;
}

const texts = (m, type) => m.content.filter((b) => b.type === type);
const count_of = (m) => m.usage.input_tokens + m.usage.cache_read_input_tokens;

const real = await startServer(k3Run, ["serve", modelDir, "--host", "127.0.0.1", "--port", "0", "--model-id", "k3-tiny"]);
try {
  const client = new Anthropic({ apiKey: "unused", baseURL: `http://127.0.0.1:${real.port}`, maxRetries: 0 });
  const messages = [{ role: "user", content: "Say OK." }];
  // temperature 0 is greedy: the streamed answer must equal the whole one.
  const base = { model: "k3-tiny", max_tokens: 8, temperature: 0, messages };

  const plain = await client.messages.create(base);
  check.ok(plain.type === "message" && plain.role === "assistant" && plain.id.startsWith("msg_"), "plain: a message");
  check.ok(["end_turn", "max_tokens"].includes(plain.stop_reason) && plain.stop_sequence === null, "plain: stop_reason");
  check.ok(plain.usage.output_tokens > 0 && plain.usage.input_tokens > 0 &&
           plain.usage.cache_read_input_tokens >= 0, "plain: usage");
  check.ok(texts(plain, "thinking").length === 0, "plain: no thinking block unless asked");
  const plainText = texts(plain, "text").map((b) => b.text).join("");

  // Streamed: the raw events in Anthropic's order, and the SDK's accumulator
  // rebuilds the same message.
  const events = await rawEvents(client, base);
  checkEventOrder(events, "stream");
  const streamed = events.filter((e) => e.type === "content_block_delta" && e.delta.type === "text_delta")
    .map((e) => e.delta.text).join("");
  check.ok(streamed === plainText, `stream: same text as plain (${JSON.stringify(streamed)} vs ${JSON.stringify(plainText)})`);
  const final = await client.messages.stream(base).finalMessage();
  check.ok(JSON.stringify(final.content) === JSON.stringify(plain.content) && final.stop_reason === plain.stop_reason,
           "MessageStream.finalMessage() equals the whole message");
  check.ok(final.usage.output_tokens === plain.usage.output_tokens, "stream: usage from message_delta");
  // A follow-up that extends the conversation prefills only its tail: the
  // reused prefix is Anthropic's cache_read_input_tokens (as serve_test's
  // prefix-reuse check on the OpenAI route).
  const follow = await client.messages.create({ ...base, max_tokens: 2, messages: [
    ...messages, { role: "assistant", content: final.content }, { role: "user", content: "And then?" }] });
  const prompt = follow.usage.input_tokens + follow.usage.cache_read_input_tokens;
  check.ok(follow.usage.cache_read_input_tokens > 0 && follow.usage.input_tokens > 0 &&
           prompt > count_of(plain), `prefix reuse: cache_read_input_tokens (${JSON.stringify(follow.usage)})`);

  // Thinking on: thinking blocks first, with a signature, streamed as thinking_delta + signature_delta.
  const thinkParams = { ...base, max_tokens: 12, thinking: { type: "enabled", budget_tokens: 1024 } };
  const think = await client.messages.create(thinkParams);
  const blocks = texts(think, "thinking");
  check.ok(blocks.length === 1 && think.content[0].type === "thinking" && blocks[0].thinking.length > 0 &&
           blocks[0].signature.length > 0, `thinking on: a signed thinking block (${think.content.map((b) => b.type)})`);
  const thinkEvents = await rawEvents(client, thinkParams);
  checkEventOrder(thinkEvents, "thinking stream");
  check.ok(thinkEvents.some((e) => e.delta?.type === "thinking_delta") &&
           thinkEvents.some((e) => e.delta?.type === "signature_delta"), "thinking stream: thinking and signature deltas");
  const off = await client.messages.create({ ...thinkParams, thinking: { type: "disabled" } });
  check.ok(texts(off, "thinking").length === 0, "thinking disabled: no thinking block");

  // Stop sequences: a piece of the greedy answer ends the same answer early.
  const long = await client.messages.create({ ...base, max_tokens: 24 });
  const longText = texts(long, "text").map((b) => b.text).join("");
  const piece = (longText.slice(2).match(/[A-Za-z]{2,}/) || longText.slice(2).match(/[^\ufffd\s]/u) || [null])[0];
  if (check.ok(piece !== null, `stop: the greedy answer has a usable piece (${JSON.stringify(longText)})`)) {
    const stopped = await client.messages.create({ ...base, max_tokens: 24, stop_sequences: [piece] });
    const stoppedText = texts(stopped, "text").map((b) => b.text).join("");
    check.ok(stopped.stop_reason === "stop_sequence" && stopped.stop_sequence === piece,
             `stop: stop_reason stop_sequence (${stopped.stop_reason} ${stopped.stop_sequence})`);
    check.ok(longText.startsWith(stoppedText + piece) || longText.startsWith(stoppedText), "stop: the text before it");
  }

  // count_tokens: the prompt the message used, and the OpenAI route's prompt for the twin request.
  const count = await client.messages.countTokens({ model: "k3-tiny", messages });
  check.ok(count.input_tokens === plain.usage.input_tokens + plain.usage.cache_read_input_tokens,
           `count_tokens equals the message's input (${count.input_tokens})`);
  const twin = await (await fetch(`http://127.0.0.1:${real.port}/v1/chat/completions`, {
    method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "k3-tiny", messages, max_tokens: 1, thinking: { type: "disabled" } }) })).json();
  check.ok(twin.usage.prompt_tokens === count.input_tokens, "count_tokens equals the OpenAI twin's prompt_tokens");

  // Errors: the SDK's typed errors with Anthropic's error types.
  try {
    await client.messages.create({ ...base, messages: [{ role: "user", content: [{ type: "image",
      source: { type: "base64", media_type: "image/png", data: "iVBORw0KGgo=" } }] }] });
    check.ok(false, "image refused");
  } catch (e) {
    check.ok(e instanceof Anthropic.BadRequestError && e.status === 400 && e.error?.error?.type === "invalid_request_error" &&
             /not supported/.test(e.message), `image: BadRequestError (${e.constructor.name} ${e.status} ${e.message})`);
  }
  try {
    await client.messages.create({ model: "k3-tiny", messages });  // no max_tokens
    check.ok(false, "missing max_tokens refused");
  } catch (e) {
    check.ok(e instanceof Anthropic.BadRequestError && /max_tokens/.test(e.message), "missing max_tokens: BadRequestError");
  }
  try {
    await client.post("/v1/messages/nothing", { body: {} });
    check.ok(false, "unknown route refused");
  } catch (e) {
    check.ok(e instanceof Anthropic.NotFoundError && e.error?.error?.type === "not_found_error", "unknown route: NotFoundError");
  }

  // Forced tool use on random weights (the decoder constrains the call):
  // tool_choice any and a named tool, whole and streamed; every input
  // validates against its schema; then a tool_result turn.
  const tools = [
    { name: "get_weather", description: "Weather of a city",
      input_schema: { type: "object", additionalProperties: false, required: ["city", "days"],
                      properties: { city: { type: "string", maxLength: 12 }, days: { type: "integer", minimum: 1, maximum: 7 } } } },
    { name: "get_time", input_schema: { type: "object", required: ["tz"], properties: { tz: { type: "string", enum: ["UTC", "CET"] } } } },
  ];
  const valid = (call) => call.name === "get_weather"
    ? Object.keys(call.input).sort().join() === "city,days" && typeof call.input.city === "string" &&
      [...call.input.city].length <= 12 && Number.isInteger(call.input.days) && call.input.days >= 1 && call.input.days <= 7
    : call.name === "get_time" && ["UTC", "CET"].includes(call.input.tz);
  const toolReq = { model: "k3-tiny", max_tokens: 200, messages: [{ role: "user", content: "Weather in Paris?" }], tools };
  for (const [choice, streamed] of [[{ type: "any" }, false], [{ type: "tool", name: "get_weather" }, true]]) {
    const what = `tool_choice ${choice.type}${streamed ? " (streamed)" : ""}`;
    const m = streamed ? await client.messages.stream({ ...toolReq, tool_choice: choice }).finalMessage()
                       : await client.messages.create({ ...toolReq, tool_choice: choice });
    const calls = texts(m, "tool_use");
    check.ok(calls.length >= 1 && calls.every((c) => c.id.startsWith("toolu_") && valid(c)),
             `${what}: tool_use blocks whose input validates (${JSON.stringify(calls)})`);
    check.ok(choice.type !== "tool" || calls.every((c) => c.name === "get_weather"), `${what}: the named tool`);
    check.ok(["tool_use", "max_tokens"].includes(m.stop_reason), `${what}: stop_reason ${m.stop_reason}`);
    if (streamed) {
      const follow = await client.messages.create({ ...toolReq, max_tokens: 8, messages: [
        ...toolReq.messages, { role: "assistant", content: m.content },
        { role: "user", content: calls.map((c) => ({ type: "tool_result", tool_use_id: c.id, content: "sunny" })) }] });
      check.ok(follow.type === "message", "forced call: the tool_result turn is answered");
    }
  }

  // Abort: the client goes away mid-stream; the server cancels.
  const before = await metric(real.port, "k3_requests_cancelled_total");
  const stream = client.messages.stream({ ...base, temperature: 1, max_tokens: 100000 });
  let aborted = false;
  stream.on("text", () => stream.abort());
  try { await stream.finalMessage(); } catch (e) { aborted = e instanceof Anthropic.APIUserAbortError; }
  check.ok(aborted, "abort: the SDK reports the abort");
  await waitMetric(real.port, "k3_requests_cancelled_total", before + 1);
  check.ok(true, "abort: the server cancelled the request");
  const after = await client.messages.create({ ...base, max_tokens: 2 });
  check.ok(after.type === "message", "serves after an abort");
} finally {
  await stopServer(real);
}

const keyed = await startServer(k3Run, ["serve", modelDir, "--host", "127.0.0.1", "--port", "0", "--api-key", "sk-ant"]);
try {
  const baseURL = `http://127.0.0.1:${keyed.port}`;
  const req = { model: "x", max_tokens: 1, messages: [{ role: "user", content: "x" }] };
  try {
    await new Anthropic({ apiKey: "sk-wrong", baseURL, maxRetries: 0 }).messages.create(req);
    check.ok(false, "wrong key refused");
  } catch (e) {
    check.ok(e instanceof Anthropic.AuthenticationError && e.status === 401 &&
             e.error?.error?.type === "authentication_error", "wrong key: AuthenticationError 401");
  }
  const viaKey = await new Anthropic({ apiKey: "sk-ant", baseURL, maxRetries: 0 }).messages.create(req);
  check.ok(viaKey.type === "message", "right key in x-api-key");
  const viaBearer = await new Anthropic({ apiKey: null, authToken: "sk-ant", baseURL, maxRetries: 0 }).messages.create(req);
  check.ok(viaBearer.type === "message", "right key as Authorization: Bearer");
} finally {
  await stopServer(keyed);
}

// Tool use through the SDK (scripted tokens: thinking, text, two calls).
const script = await startServer(scriptServe, [modelDir]);
try {
  const client = new Anthropic({ apiKey: "x", baseURL: `http://127.0.0.1:${script.port}`, maxRetries: 0 });
  const tools = [
    { name: "get_weather", description: "Weather of a city", input_schema: { type: "object", properties: { city: { type: "string" } } } },
    { name: "get_time", input_schema: { type: "object", properties: { tz: { type: "string" } } } },
  ];
  const req = { model: "k3-script", max_tokens: 200, messages: [{ role: "user", content: "weather and time in Beijing?" }], tools };
  const events = await rawEvents(client, req);
  checkEventOrder(events, "tool stream");
  check.ok(events.filter((e) => e.delta?.type === "input_json_delta").length > 2, "tool stream: input_json_delta pieces");
  const streamed = await client.messages.stream(req).finalMessage();
  const calls = texts(streamed, "tool_use");
  check.ok(calls.length === 2 && calls[0].name === "get_weather" && calls[1].name === "get_time" &&
           calls.every((c) => c.id.startsWith("toolu_")), "stream: two tool_use blocks");
  check.ok(calls[0].input.city === "北京 (Beijing)" && calls[1].input.tz === "Asia/Shanghai",
           `stream: inputs parsed by the SDK (${JSON.stringify(calls.map((c) => c.input))})`);
  check.ok(streamed.stop_reason === "tool_use", "stream: stop_reason tool_use");
  check.ok(streamed.content[0].type === "thinking" && streamed.content[0].thinking.includes("北京") &&
           texts(streamed, "text")[0]?.text === "Checking both 🙂", "stream: thinking and text blocks");
  const whole = await client.messages.create(req);
  check.ok(JSON.stringify(whole.content) === JSON.stringify(streamed.content), "whole: the same blocks");

  // The tool_result turn: the assistant's blocks sent back as they came, then the results.
  const followUp = await client.messages.create({
    ...req,
    messages: [
      ...req.messages,
      { role: "assistant", content: whole.content },
      { role: "user", content: [
        { type: "tool_result", tool_use_id: calls[0].id, content: "sunny, 21°C" },
        { type: "tool_result", tool_use_id: calls[1].id, content: [{ type: "text", text: "12:00" }], is_error: false },
        { type: "text", text: "Thanks." } ] },
    ] });
  check.ok(followUp.type === "message" && followUp.content.length > 0, "tool_result turn accepted and answered");
  try {
    await client.messages.create({ ...req, messages: [...req.messages,
      { role: "user", content: [{ type: "tool_result", tool_use_id: "toolu_nobody", content: "x" }] }] });
    check.ok(false, "tool_result without its tool_use refused");
  } catch (e) {
    check.ok(e instanceof Anthropic.BadRequestError && /tool_use_id/.test(e.message), "orphan tool_result: BadRequestError");
  }
} finally {
  await stopServer(script);
}

process.exit(check.done());
