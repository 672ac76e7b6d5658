// The embedded web page in headless Chromium (Debian's `chromium`, driven by
// puppeteer-core) against `k3-run serve` on the tiny model, and against
// k3-script-serve for tool calls:
//   send, stream, Stop (button and Esc); the prefill progress bar during a
//   long prompt and the scripted source's slow prefill, gone after; the place
//   in line while another client's answer runs; the system prompt reaching the server
//   (prompt_tokens == `k3-run render` of the same conversation); edit a
//   question -> branch 2/2 -> back to 1/2 shows the old answer; arrow keys;
//   regenerate (cached_tokens > 0); an assistant edit with hostile Markdown
//   that never executes; code highlighting and copy; tool calls as blocks;
//   storage full; export -> both branches in the file -> import into a fresh
//   profile -> the same conversations; 390 px and dark screenshots.
// Screenshots and the export file go to OUT_DIR.
//
// usage: node webui_test.mjs NODE_MODULES K3_RUN MODEL_DIR OUT_DIR SCRIPT_SERVE
import { execFileSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Check, load, metric, startServer, stopServer, waitMetric } from "./lib.mjs";

const [modules, k3Run, modelDir, outDir, scriptServe] = process.argv.slice(2);
const { default: puppeteer } = await load(modules, "puppeteer-core");
const check = new Check();
rmSync(outDir, { recursive: true, force: true });
mkdirSync(outDir, { recursive: true });
const downloads = join(outDir, "downloads");
mkdirSync(downloads);
const t0 = Date.now();
const step = (what) => console.log(`[${((Date.now() - t0) / 1000).toFixed(1)} s] ${what}`);

// One request at a time: the page shows its place in the queue behind another.
const server = await startServer(k3Run, ["serve", modelDir, "--host", "127.0.0.1", "--port", "0", "--model-id", "k3-tiny", "--parallel", "1"]);
// The scripted source spends 3 s in "prefill", reporting progress with an ETA.
const script = await startServer(scriptServe, [modelDir, "--prefill-s", "3"]);
const profiles = [];
const browsers = [];

async function launch() {
  const profile = mkdtempSync(join(tmpdir(), "k3-chromium-"));
  profiles.push(profile);
  const browser = await puppeteer.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    downloadBehavior: { policy: "allow", downloadPath: downloads },
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           `--user-data-dir=${profile}`],
  });
  browsers.push(browser);
  return browser;
}

// A page on `port`; POST bodies are kept in `bodies`. The page sends no seed,
// so the server would draw one: the seed is pinned to 5. While `page.pinLong`
// is set the body also asks for ignore_eos (llama-server's field): the answer
// then runs to its 100,000-token limit whatever the kernels' rounding on this
// CPU makes of the seed, so the Stop test always has a running answer to stop
// (a seed probed to reach 1,500 tokens could end while the page was still
// drawing the stream: the server finished first and counted no cancel).
async function openPage(browser, port, errors, width = 1100, height = 760) {
  const page = await browser.newPage();
  await page.setViewport({ width, height });
  page.on("pageerror", (e) => errors.push(String(e)));
  page.bodies = [];
  await page.setRequestInterception(true);
  page.on("request", async (req) => {
    if (req.method() === "POST" && req.url().endsWith("/v1/chat/completions")) {
      const b = JSON.parse(req.postData() || "{}");
      if (b.seed === undefined) b.seed = 5;
      if (page.pinLong) b.ignore_eos = true;
      page.bodies.push(b);
      req.continue({ postData: JSON.stringify(b) });
    } else {
      req.continue();
    }
  });
  await page.goto(`http://127.0.0.1:${port}/`, { waitUntil: "load" });
  return page;
}

// Opens the narrow layout's sidebar and waits until its slide-in (a .15 s
// transform) has brought Import on screen: a click on a control still
// off-screen has no target.
async function openSide(page) {
  // A click lands on whatever is on top at the button's centre: first wait
  // until that is the button itself (a sidebar still sliding out after a
  // conversation was opened covers it; under load the click was lost).
  await page.waitForFunction(() => {
    const b = document.getElementById("open-side");
    const r = b.getBoundingClientRect();
    const top = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
    return top !== null && b.contains(top);
  });
  await page.click("#open-side");
  await page.waitForFunction(() => {
    const r = document.getElementById("import").getBoundingClientRect();
    return r.width > 0 && r.left >= 0 && r.right <= window.innerWidth;
  });
}

const status = (page) => page.$eval("#status", (e) => e.textContent);
async function waitStatus(page, ...want) {
  try {
    await page.waitForFunction((w) => w.includes(document.getElementById("status").textContent), { timeout: 120000 }, want);
  } catch (e) {
    throw new Error(`status stayed "${await status(page)}", wanted ${want.join(" or ")}: ${e.message}`);
  }
  return status(page);
}
async function sendText(page, text) {
  await page.focus("#input");
  await page.keyboard.type(text);
  await page.keyboard.press("Enter");
}
async function setSetting(page, id, value) {
  await page.$eval(`#${id}`, (e, v) => {
    if (e.type === "checkbox") e.checked = v; else e.value = v;
    e.dispatchEvent(new Event("change"));
  }, value);
}
const lastAssistant = ".msg.assistant:last-of-type";
const contentOf = (page, sel) => page.$eval(sel, (e) => e.querySelector(".content").textContent);
const branchOf = (page, sel) => page.$eval(sel, (e) => (e.querySelector(".branch-pos") || {}).textContent || "");
const stored = (page) => page.evaluate(() => JSON.parse(localStorage.getItem("k3.chats.v1")));

function renderCount(request) {
  const path = join(outDir, "render-request.json");
  writeFileSync(path, JSON.stringify(request));
  return JSON.parse(execFileSync(k3Run, ["render", modelDir, "--request", path, "--bos", "--json"]).toString()).ids.length;
}

// Records, from inside the page, every state of the progress bar.
async function watchProgress(page) {
  await page.evaluate(() => {
    if (window.__progressObserver) window.__progressObserver.disconnect();
    window.__progress = [];
    const box = document.getElementById("progress");
    const bar = document.getElementById("progressbar");
    const note = () => window.__progress.push({ shown: !box.hidden && !bar.hidden, now: bar.getAttribute("aria-valuenow"),
                                               text: document.getElementById("progress-text").textContent });
    window.__progressObserver = new MutationObserver(note);
    window.__progressObserver.observe(box, { attributes: true, subtree: true, childList: true, characterData: true });
  });
}

try {
  const browser = await launch();
  const errors = [];
  const page = await openPage(browser, server.port, errors);
  await page.waitForFunction(() => document.getElementById("model").textContent === "k3-tiny");
  check.ok(true, "page loads and shows the served model id");

  // Every control the issue names has an accessible name.
  for (const name of ["New chat", "Import", "Export all conversations", "Settings", "Stop", "Send", "Message",
                      "Search conversations"]) {
    check.ok((await page.$(`aria/${name}`)) !== null, `a control named "${name}"`);
  }
  await page.click("#settings-btn");
  check.ok((await page.$("aria/System prompt")) !== null, 'the settings show a control named "System prompt"');
  const temps = await page.$$eval("#temperature option", (o) => o.map((x) => x.value));
  const note = await page.$eval("#sampling-note", (e) => e.textContent);
  check.ok([...temps].sort().join(",") === ",0,0.6" && /locked/i.test(note) && /--sampling free/.test(note),
           `locked sampling values offered with the reason (${temps.join(",")}; ${note.slice(0, 60)}...)`);

  await page.click("#settings-btn");  // closed again: the screenshots show the chat

  // 1. A long answer: it streams, Stop ends it (the server cancels).
  step("stream and Stop");
  const before = await metric(server.port, "k3_requests_cancelled_total");
  await setSetting(page, "maxtok", "100000");
  page.pinLong = true;
  await watchProgress(page);
  await sendText(page, "Tell me a long story <img src=x onerror=\"window.pwned=1\">");
  await page.waitForFunction((sel) => {
    const a = document.querySelector(sel);
    return a && (a.querySelector(".content").textContent.length + a.querySelector(".reasoning-text").textContent.length) > 20;
  }, {}, lastAssistant);
  check.ok(await page.$eval("#stop", (e) => !e.disabled), "text streams in while the request runs (Stop enabled)");
  const visible = await page.$eval(lastAssistant, (a) => {
    const d = a.querySelector("details");
    return a.querySelector(".content").textContent.length > 0 || (d.open && !d.hidden);
  });
  check.ok(visible, "the streaming text is visible (reasoning open while the model thinks)");
  const lenA = await page.$eval(lastAssistant, (a) => a.textContent.length);
  await page.waitForFunction((sel, n) => document.querySelector(sel).textContent.length > n, {}, lastAssistant, lenA);
  check.ok(true, "more text arrives over time");
  await page.screenshot({ path: join(outDir, "streaming.png") });
  await page.click("#stop");
  await waitStatus(page, "stopped");
  check.ok(await page.$eval("#send", (e) => !e.disabled), "Stop ends the answer and re-enables Send");
  await waitMetric(server.port, "k3_requests_cancelled_total", before + 1);
  check.ok(true, "Stop aborts the request and the server cancels it");
  check.ok(await page.evaluate(() => !document.querySelector("#log img") && !window.pwned), "user markup stays text");
  check.ok(await page.$eval(".msg.user", (e) => e.textContent.includes("<img src=x")), "the user's text is shown as typed");
  // Regenerate the stopped answer (same prompt and seed, EOS still masked: a
  // running answer) and stop it from the keyboard.
  await page.click(`${lastAssistant} ::-p-aria(Regenerate)`);
  await page.waitForFunction((sel) => document.querySelector(sel).textContent.length > 60, {}, lastAssistant);
  await page.keyboard.press("Escape");
  await waitStatus(page, "stopped");
  await waitMetric(server.port, "k3_requests_cancelled_total", before + 2);
  check.ok((await branchOf(page, lastAssistant)) === "2/2", "Esc stops the answer (the server cancels); regenerate made 2/2");
  page.pinLong = false;
  const seen = await page.evaluate(() => window.__progress);
  check.ok(seen.some((s) => /in the queue|queued behind/.test(s.text) || s.shown), "waiting / prefill state shown");

  // 2. The progress bar during a long prefill (about 6,500 prompt tokens in 13
  // windows, several seconds on the 2-core machine: the server writes its
  // first two reports at the start, then one per second), gone when text
  // arrives. Its own server reads prompts in windows of 512 tokens (K3_CHUNK;
  // results do not depend on it): the page shows tokens through the whole
  // stack, which a prompt read in one window keeps at 0 until its end.
  step("long prefill");
  const windowed = await startServer(k3Run, ["serve", modelDir, "--host", "127.0.0.1", "--port", "0", "--model-id",
                                             "k3-tiny"], { K3_CHUNK: "512" });
  const wpage = await openPage(browser, windowed.port, errors);
  await wpage.waitForFunction(() => document.getElementById("model").textContent === "k3-tiny");
  await watchProgress(wpage);
  const words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu ".repeat(240);
  await wpage.$eval("#input", (e, v) => { e.value = v; }, words + "\nSummarise.");
  await wpage.focus("#input");
  await wpage.keyboard.press("Enter");
  await wpage.waitForFunction(() => {
    const b = document.getElementById("progressbar");
    return !document.getElementById("progress").hidden && !b.hidden && Number(b.getAttribute("aria-valuenow")) >= 0 &&
           /tokens/.test(document.getElementById("progress-text").textContent);
  }, { timeout: 60000 });
  await wpage.screenshot({ path: join(outDir, "prefill.png") });
  await wpage.waitForFunction((sel) => document.querySelector(sel).textContent.length > 40, { timeout: 120000 }, lastAssistant);
  const prog = await wpage.evaluate(() => window.__progress);
  const shown = prog.filter((s) => s.shown);
  const values = shown.map((s) => Number(s.now));
  // Rising: seen at two values at least, never going back.
  check.ok(new Set(values).size >= 2 && values.every((v, k) => v >= 0 && v <= 100 && (k === 0 || v >= values[k - 1])),
           `role=progressbar shown with aria-valuenow rising in [0, 100] (${[...new Set(values)].join(" ")}) and ` +
           `tokens read (${shown.length ? shown[shown.length - 1].text : "-"})`);
  check.ok(await wpage.$eval("#progress", (e) => e.hidden), "the progress bar is gone once text arrives");
  await wpage.close();
  await stopServer(windowed);

  // 2b. Waiting behind another client's long answer: the place in line shows.
  step("queue position");
  await page.click("#new");
  await watchProgress(page);
  // An answer that cannot end soon: a JSON string of at least 60,000
  // characters, enforced by the decoder, until the test aborts it.
  const blocker = { model: "k3-tiny", messages: [{ role: "user", content: "Tell me a long story" }], stream: true,
                    max_tokens: 100000, thinking: { type: "disabled" }, seed: 1,
                    response_format: { type: "json_schema", json_schema: { name: "story", strict: true, schema: {
                      type: "object", properties: { story: { type: "string", minLength: 60000 } },
                      required: ["story"], additionalProperties: false } } } };
  const abortBlocker = new AbortController();
  const blockerRes = await fetch(`http://127.0.0.1:${server.port}/v1/chat/completions`, {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(blocker),
    signal: abortBlocker.signal,
  });
  const blockerReader = blockerRes.body.getReader();
  const decoder = new TextDecoder();
  let blockerText = "";
  while (!/"content":"[^"]/.test(blockerText)) blockerText += decoder.decode((await blockerReader.read()).value);
  const drained = (async () => { try { for (;;) if ((await blockerReader.read()).done) break; } catch (e) { /* aborted */ } })();
  await sendText(page, "Hi");
  try {
    await page.waitForFunction(() => document.getElementById("progress-text").textContent === "position 1 in the queue" &&
                               !document.getElementById("progress").hidden, { timeout: 30000 });
  } catch (e) {
    const seen = await page.evaluate(() => JSON.stringify(window.__progress.slice(-5)));
    throw new Error(`no "position 1 in the queue" (status "${await status(page)}", progress ${seen}): ${e.message}`);
  }
  check.ok(await status(page) === "waiting in the queue" && await page.$eval("#progressbar", (e) => e.hidden),
           'behind a running answer the page says "position 1 in the queue" (no bar while waiting)');
  await page.screenshot({ path: join(outDir, "queued.png") });
  abortBlocker.abort();
  await drained;
  await page.waitForFunction((sel) => document.querySelector(sel).textContent.length > 0, { timeout: 60000 }, lastAssistant);
  if ((await status(page)) === "generating") await page.click("#stop");
  await waitStatus(page, "stopped", "done");

  // 3. A system prompt reaches the server: prompt_tokens == k3-run render's count.
  step("system prompt");
  await page.click("#new");
  const system = "You are a terse assistant. Answer in one word.";
  await setSetting(page, "system", system);
  await setSetting(page, "thinking", false);
  await setSetting(page, "maxtok", "8");
  await sendText(page, "Say hi");
  await waitStatus(page, "done");
  const sent = page.bodies[page.bodies.length - 1];
  check.ok(sent.messages[0].role === "system" && sent.messages[0].content === system,
           "the request carries the system prompt first");
  let conv = (await stored(page))[0];
  const answer1 = conv.messages.find((m) => m.role === "assistant");
  const withSystem = renderCount({ messages: sent.messages, options: { thinking: false } });
  const without = renderCount({ messages: sent.messages.slice(1), options: { thinking: false } });
  check.ok(answer1.usage && answer1.usage.prompt_tokens === withSystem && withSystem > without,
           `prompt_tokens ${answer1.usage && answer1.usage.prompt_tokens} == render with the system prompt ` +
           `(${withSystem}; ${without} without)`);
  const stats = await page.$eval(`${lastAssistant} .stats`, (e) => e.textContent);
  check.ok(/TTFT [0-9.]+ s/.test(stats) && /tok\/s/.test(stats) && /cached \d+\/\d+/.test(stats), `stats shown: ${stats}`);
  const oldAnswer = await contentOf(page, lastAssistant);

  // 4. Edit the question: a second branch; back to the first shows the old answer.
  step("edit and branches");
  await page.click(".msg.user ::-p-aria(Edit)");
  await page.waitForSelector(".msg.user textarea.edit");
  await page.$eval(".msg.user textarea.edit", (e) => { e.value = ""; });
  await page.type(".msg.user textarea.edit", "Say hello");
  await page.keyboard.press("Enter");
  await waitStatus(page, "done");
  check.ok((await branchOf(page, ".msg.user")) === "2/2" &&
           (await contentOf(page, ".msg.user")) === "Say hello", "the edit is branch 2/2 with the new text");
  await page.click(".msg.user ::-p-aria(Previous branch)");
  check.ok((await branchOf(page, ".msg.user")) === "1/2" && (await contentOf(page, ".msg.user")) === "Say hi" &&
           (await contentOf(page, lastAssistant)) === oldAnswer, "back to 1/2 shows the old question and answer");
  await page.focus(".msg.user ::-p-aria(Next branch)");
  await page.keyboard.press("ArrowRight");
  check.ok((await branchOf(page, ".msg.user")) === "2/2", "ArrowRight moves to the next branch");
  await page.keyboard.press("ArrowLeft");
  check.ok((await branchOf(page, ".msg.user")) === "1/2", "ArrowLeft moves back");

  // 5. Regenerate: a new answer branch that resumes from the server's state.
  step("regenerate");
  await page.click(`${lastAssistant} ::-p-aria(Regenerate)`);
  await waitStatus(page, "done");
  const regen = await page.$eval(`${lastAssistant} .stats`, (e) => e.textContent);
  const cached = /cached (\d+)\/(\d+)/.exec(regen);
  check.ok((await branchOf(page, lastAssistant)) === "2/2" && cached && Number(cached[1]) > 0,
           `regenerate adds answer 2/2 and reuses the prompt (${cached ? cached[0] : regen})`);

  await page.setViewport({ width: 1000, height: 560 });
  await page.screenshot({ path: join(outDir, "readme.png") });
  await page.setViewport({ width: 1100, height: 760 });

  // 6. Edit the answer with hostile Markdown: rendered, never executed.
  step("hostile markdown");
  const hostile = [
    "# Result", "<img src=x onerror=\"window.pwned=1\"> and <script>window.pwned=2</script>",
    "[click me](javascript:window.pwned=3) [data](data:text/html,<b>x</b>) [safe](https://example.com/a)",
    "![pic](javascript:window.pwned=4)", "", "| a | b |", "|---|---|", "| 1 | **2** |", "",
    "```js", "const x = \"s\"; // note", "```",
  ].join("\n");
  await page.click(`${lastAssistant} ::-p-aria(Edit)`);
  await page.$eval(`${lastAssistant} textarea.edit`, (e, v) => { e.value = v; }, hostile);
  await page.click(`${lastAssistant} ::-p-aria(Save)`);
  await page.waitForFunction((sel) => document.querySelector(sel + " h1"), {}, lastAssistant);
  const md = await page.$eval(lastAssistant, (a) => ({
    imgs: a.querySelectorAll("img, script, iframe").length,
    hrefs: [...a.querySelectorAll("a")].map((x) => x.getAttribute("href")),
    rels: [...a.querySelectorAll("a")].map((x) => x.rel),
    table: a.querySelectorAll("table td").length, kw: a.querySelectorAll("code .tok-k").length,
    str: a.querySelectorAll("code .tok-s").length, text: a.querySelector(".content").textContent,
    branch: a.querySelector(".branch-pos").textContent,
  }));
  check.ok(md.branch === "3/3", `an edited answer is a new branch (${md.branch})`);
  check.ok(md.imgs === 0 && md.text.includes("<img src=x") && md.text.includes("<script>"), "HTML in Markdown stays text");
  check.ok(md.hrefs.length === 1 && md.hrefs[0] === "https://example.com/a" && /noopener/.test(md.rels[0]),
           `only the https link is a link, rel=noopener (${md.hrefs.join(" ")})`);
  check.ok(md.table === 2 && md.kw >= 1 && md.str >= 1, "tables and highlighted code render");
  for (const label of await page.$$(`${lastAssistant} .content p`)) await label.click();
  check.ok(await page.evaluate(() => window.pwned === undefined), "nothing hostile ran");
  await browser.defaultBrowserContext().overridePermissions(`http://127.0.0.1:${server.port}`,
                                                              ["clipboard-read", "clipboard-write", "clipboard-sanitized-write"]);
  await page.click(`${lastAssistant} ::-p-aria(Copy code)`);
  const clip = await page.evaluate(() => navigator.clipboard.readText());
  check.ok(clip === "const x = \"s\"; // note", `the code block's Copy puts the code on the clipboard (${clip})`);

  // 7. Storage full: a clear message, the page keeps working.
  step("storage full");
  await page.evaluate(() => {
    window.__setItem = Storage.prototype.setItem;
    Storage.prototype.setItem = function () { throw new DOMException("full", "QuotaExceededError"); };
  });
  await page.click("#convs li.active ::-p-aria(Rename conversation)");
  await page.keyboard.press("End");
  await page.keyboard.type(" renamed");
  await page.keyboard.press("Enter");
  const full = await page.$eval("#notice", (e) => !e.hidden && e.textContent);
  check.ok(/storage for this page is full/.test(full || ""), `storage full is reported (${full})`);
  await page.evaluate(() => { Storage.prototype.setItem = window.__setItem; });
  await page.click("#notice ::-p-aria(Dismiss message)");
  await page.click("#convs li.active ::-p-aria(Rename conversation)");
  await page.keyboard.press("End");
  await page.keyboard.type(" again");
  await page.keyboard.press("Enter");
  conv = (await stored(page))[0];
  check.ok(conv.title === "Say hi renamed again", `rename is kept (${conv.title})`);

  // 8. Tool calls from the scripted source are structured blocks.
  step("tool calls");
  const toolErrors = [];
  const tools = await openPage(browser, script.port, toolErrors);
  await tools.waitForFunction(() => document.getElementById("model").textContent === "k3-script");
  await watchProgress(tools);
  await sendText(tools, "Weather and time in Beijing?");
  await tools.waitForFunction(() => /left/.test(document.getElementById("progress-text").textContent));
  await tools.screenshot({ path: join(outDir, "prefill-eta.png") });
  await waitStatus(tools, "done");
  const steps = (await tools.evaluate(() => window.__progress)).filter((p) => p.shown);
  const pcts = steps.map((p) => Number(p.now));
  // One progress chunk per heartbeat period (1 s): 2-4 in a 3 s prefill.
  check.ok(new Set(pcts).size >= 2 && pcts.every((v, k) => k === 0 || v >= pcts[k - 1]) &&
           steps.some((p) => /tokens .* left/.test(p.text)) && (await tools.$eval("#progress", (e) => e.hidden)),
           `prompt_progress drives the bar (${[...new Set(pcts)].join(" ")}; ${steps.length ? steps[steps.length - 1].text : "-"}), gone after`);
  const blocks = await tools.$$eval(".tool", (ts) => ts.map((t) => ({
    name: t.querySelector(".tool-name").textContent, args: t.querySelector("pre").textContent })));
  check.ok(blocks.length === 2 && blocks[0].name === "get_weather" && blocks[1].name === "get_time" &&
           JSON.parse(blocks[0].args).city === "北京 (Beijing)" && JSON.parse(blocks[1].args).tz === "Asia/Shanghai",
           `two tool-call blocks with their arguments (${JSON.stringify(blocks)})`);
  check.ok((await tools.$eval(".reasoning-text", (e) => e.textContent)).includes("北京"), "reasoning kept in its block");
  await tools.screenshot({ path: join(outDir, "tools.png") });
  await tools.close();
  check.ok(toolErrors.length === 0, `no page errors on the scripted server (${toolErrors.join("; ")})`);

  // 9. Export all: the file holds every conversation with both branches.
  step("export and import");
  const exportedConvs = await stored(page);
  await page.click("#export-all");
  let file = null;
  for (let i = 0; i < 200 && !file; ++i) {
    const f = readdirSync(downloads).find((n) => n.endsWith(".json"));
    if (f) file = join(downloads, f); else await new Promise((r) => setTimeout(r, 50));
  }
  const doc = JSON.parse(readFileSync(file, "utf8"));
  const saidHi = doc.conversations.find((c) => c.title.startsWith("Say hi"));
  const users = saidHi ? saidHi.messages.filter((m) => m.role === "user") : [];
  check.ok(doc.format === "k3-chat-export" && doc.version === 1 && doc.conversations.length === exportedConvs.length &&
           users.length === 2 && users[0].parent === users[1].parent &&
           users.map((u) => u.content).sort().join("|") === "Say hello|Say hi",
           `the export holds ${doc.conversations.length} conversations, both branches of the edited question`);
  const transcript = await page.$$eval(".msg .content", (cs) => cs.map((c) => c.textContent));
  await page.screenshot({ path: join(outDir, "done.png") });
  check.ok(errors.length === 0, `no page errors (${errors.join("; ")})`);

  // 10. Import into a fresh profile: the same conversations, the same view.
  const fresh = await launch();
  const errors2 = [];
  const page2 = await openPage(fresh, server.port, errors2, 390, 844);
  check.ok((await page2.$$("#convs li")).length === 0, "a fresh profile starts empty");
  await openSide(page2);
  const [chooser] = await Promise.all([page2.waitForFileChooser(), page2.click("#import")]);
  await chooser.accept([file]);
  await page2.waitForFunction((n) => document.querySelectorAll("#convs li").length === n, {}, doc.conversations.length);
  const imported = await stored(page2);
  const essence = (list) => JSON.stringify(list.map((c) => [c.id, c.title, c.settings, c.selected, c.messages.map((m) =>
    [m.id, m.parent, m.role, m.content, m.reasoning || "", m.stats || "", JSON.stringify(m.tool_calls || [])])]));
  check.ok(essence(imported) === essence(exportedConvs), "the imported conversations equal the exported ones");
  await page2.evaluate((t) => {
    const c = JSON.parse(localStorage.getItem("k3.chats.v1")).find((x) => x.title === t);
    document.querySelector(`#convs li[data-id="${c.id}"] .conv-open`).click();
  }, saidHi.title);
  const transcript2 = await page2.$$eval(".msg .content", (cs) => cs.map((c) => c.textContent));
  check.ok(JSON.stringify(transcript2) === JSON.stringify(transcript), "the imported conversation shows the same branch");
  const bad = join(outDir, "bad-import.json");
  writeFileSync(bad, JSON.stringify({ format: "k3-chat-export", version: 1, conversations: [{ id: "x", messages: [
    { id: "a", parent: "nope", role: "user", content: "hi" }] }] }));
  await openSide(page2);
  const [chooser2] = await Promise.all([page2.waitForFileChooser(), page2.click("#import")]);
  await chooser2.accept([bad]);
  await page2.waitForFunction(() => !document.getElementById("notice").hidden);
  const refusal = await page2.$eval("#notice", (e) => e.textContent);
  check.ok(/conversations\[0\]\.messages\[0\]\.parent/.test(refusal) && (await stored(page2)).length === doc.conversations.length,
           `a bad file is refused naming the field, nothing changed (${refusal.slice(0, 90)})`);
  await page2.click("#notice ::-p-aria(Dismiss message)");
  await page2.keyboard.press("Escape");

  // 11. 390 px wide and dark: nothing overflows, the composer is on screen.
  step("screenshots");
  const narrow = await page2.evaluate(() => {
    const send = document.getElementById("send").getBoundingClientRect();
    return { width: document.documentElement.scrollWidth, sendRight: send.right, sendBottom: send.bottom };
  });
  check.ok(narrow.width <= 390 && narrow.sendRight <= 390 && narrow.sendBottom <= 844,
           `usable at 390 px (page ${narrow.width} px wide, Send at ${narrow.sendRight},${narrow.sendBottom})`);
  await page2.screenshot({ path: join(outDir, "narrow-390.png") });
  await openSide(page2);
  await page2.screenshot({ path: join(outDir, "narrow-390-list.png") });
  await page2.keyboard.press("Escape");
  await page2.emulateMediaFeatures([{ name: "prefers-color-scheme", value: "dark" }]);
  const bg = await page2.evaluate(() => getComputedStyle(document.body).backgroundColor);
  const rgb = bg.match(/\d+/g).map(Number);
  check.ok(rgb[0] + rgb[1] + rgb[2] < 150, `dark theme from prefers-color-scheme (${bg})`);
  await page2.setViewport({ width: 1100, height: 760 });
  await page2.screenshot({ path: join(outDir, "dark.png") });
  check.ok(errors2.length === 0, `no page errors in the fresh profile (${errors2.join("; ")})`);
  console.log("screenshots and export in", outDir);
} finally {
  for (const b of browsers) await b.close();
  for (const p of profiles) rmSync(p, { recursive: true, force: true });
  await stopServer(server);
  await stopServer(script);
}
step("end");
process.exit(check.done());
