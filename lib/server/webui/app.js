// The page: conversations (Store), the chat stream, settings, keyboard.
// Everything the model writes reaches the page through Md.render or
// textContent only, never as live HTML.
const $ = (id) => document.getElementById(id);

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function button(text, label, onclick, cls) {
  const b = el("button", cls || "small", text);
  b.type = "button";
  if (label && label !== text) b.setAttribute("aria-label", label);
  b.addEventListener("click", onclick);
  return b;
}

let convs = Store.load();
let currentId = convs.length ? convs[0].id : null;
let gen = null;          // the running generation: {controller, convId, messageId}
let editing = null;      // id of the message being edited
let policy = null;       // the server's sampling policy (/v1/models data[0].k3), when it says
let searchText = "";

function current() { return convs.find((c) => c.id === currentId) || null; }

// ---- notices and storage ------------------------------------------------
function notice(text) {
  const n = $("notice");
  n.replaceChildren();
  n.hidden = !text;
  if (!text) return;
  n.appendChild(document.createTextNode(text));
  n.appendChild(button("Dismiss", "Dismiss message", () => notice(null)));
}

function persist() {
  const err = Store.save(convs);
  if (err) notice(err);
  return !err;
}

function status(text) { $("status").textContent = text; }

// With `k3-run serve --api-key`, /v1 needs the key; it stays in this browser.
function authHeaders(h) {
  const key = $("apikey").value;
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

// ---- the conversation list ----------------------------------------------
function matches(c) {
  if (!searchText) return true;
  const q = searchText.toLowerCase();
  return (c.title || "").toLowerCase().includes(q) || c.messages.some((m) => m.content.toLowerCase().includes(q));
}

function drawConvs() {
  const box = $("convs");
  box.replaceChildren();
  for (const c of convs.filter(matches)) {
    const li = el("li", c.id === currentId ? "active" : "");
    li.dataset.id = c.id;
    const title = c.title || "New chat";
    const open = button(title, null, () => { openConv(c.id); closeSidebar(); }, "conv-open");
    if (c.id === currentId) open.setAttribute("aria-current", "true");
    li.appendChild(open);
    if (c.id === currentId) {
      const actions = el("div", "conv-actions");
      actions.appendChild(button("Rename", "Rename conversation", () => startRename(li, c)));
      actions.appendChild(button("Export", "Export conversation", () => download([c], c.title)));
      actions.appendChild(button("Delete", "Delete conversation", () => deleteConv(c), "small danger"));
      li.appendChild(actions);
    }
    box.appendChild(li);
  }
  if (!box.children.length && searchText) box.appendChild(el("li", "empty", "No match"));
}

function startRename(li, c) {
  const input = el("input", "conv-rename");
  input.value = c.title;
  input.setAttribute("aria-label", "Conversation title");
  let done = false;
  const finish = (save) => {
    if (done) return;
    done = true;
    if (save && input.value.trim()) {
      c.title = input.value.trim();
      c.updated = Date.now();
      persist();
    }
    drawConvs();
    drawHeader();
  };
  input.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter") { ev.preventDefault(); finish(true); }
    if (ev.key === "Escape") { ev.preventDefault(); ev.stopPropagation(); finish(false); }
  });
  input.addEventListener("blur", () => finish(true));
  li.replaceChildren(input);
  input.focus();
  input.select();
}

function deleteConv(c) {
  if (!confirm("Delete the conversation \u201c" + (c.title || "New chat") + "\u201d? This cannot be undone.")) return;
  if (gen && gen.convId === c.id) gen.controller.abort();
  convs = convs.filter((x) => x !== c);
  if (currentId === c.id) currentId = convs.length ? convs[0].id : null;
  persist();
  drawAll();
}

function openConv(id) {
  currentId = id;
  editing = null;
  drawAll();
}

function newConv() {
  const prev = current();
  if (prev && !prev.messages.length) { $("input").focus(); return prev; }  // already a fresh one
  const c = Store.newConversation(prev ? prev.settings : null);
  convs.unshift(c);
  currentId = c.id;
  editing = null;
  drawAll();
  $("input").focus();
  return c;
}

function openSidebar() { $("sidebar").classList.add("open"); $("open-side").setAttribute("aria-expanded", "true"); $("new").focus(); }
function closeSidebar() { $("sidebar").classList.remove("open"); $("open-side").setAttribute("aria-expanded", "false"); }

// ---- export / import ----------------------------------------------------
function download(list, name) {
  const blob = new Blob([Store.exportJson(list)], { type: "application/json" });
  const a = el("a");
  a.href = URL.createObjectURL(blob);
  const slug = (name || "all").replace(/[^\w-]+/g, "-").replace(/^-+|-+$/g, "").slice(0, 40) || "chat";
  a.download = "k3-chat-" + slug + "-" + new Date().toISOString().slice(0, 10) + ".json";
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 10000);
  closeSidebar();
  status("exported " + list.length + (list.length === 1 ? " conversation" : " conversations"));
}

async function importFile(file) {
  let list;
  try {
    list = Store.parseImport(await file.text());
  } catch (e) {
    closeSidebar();
    notice("Import failed: " + (e instanceof Store.FormatError ? e.message : String(e)) + ". Nothing was changed.");
    return;
  }
  let replaced = 0;
  for (const c of list) {
    const k = convs.findIndex((x) => x.id === c.id);
    if (k >= 0) { convs.splice(k, 1); ++replaced; }
  }
  convs = list.concat(convs);
  if (list.length) currentId = list[0].id;
  closeSidebar();
  persist();
  drawAll();
  status("imported " + list.length + " conversation" + (list.length === 1 ? "" : "s") +
         (replaced ? " (" + replaced + " replaced)" : ""));
}

// ---- settings -----------------------------------------------------------
function fmt(x) { return Number(x).toFixed(2).replace(/0$/, ""); }

// Temperature / top p: a list of the allowed values when the server locks
// them, a number field when it does not (or does not say).
function samplingControl(key, label) {
  const box = $(key + "-label");
  const old = $(key);
  if (old) old.remove();
  const p = policy && policy[key];
  let ctl;
  if (p && Array.isArray(p.allowed)) {
    ctl = el("select");
    ctl.appendChild(new Option("default (" + fmt(p.default) + ")", ""));
    for (const v of p.allowed) if (Math.abs(v - p.default) > 1e-6) ctl.appendChild(new Option(fmt(v), String(v)));
  } else {
    ctl = el("input");
    ctl.type = "number";
    ctl.step = "0.05";
    ctl.min = p && p.min !== undefined ? p.min : 0;
    ctl.max = p && p.max !== undefined ? p.max : key === "top_p" ? 1 : 2;
    ctl.placeholder = p ? "default (" + fmt(p.default) + ")" : "server default";
  }
  ctl.id = key;
  ctl.setAttribute("aria-label", label);
  ctl.addEventListener("change", () => {
    const c = current();
    if (!c) return;
    const v = ctl.value === "" ? null : Number(ctl.value);
    c.settings[key] = v !== null && isFinite(v) ? v : null;
    persist();
  });
  box.appendChild(ctl);
}

function drawSettings() {
  const c = current();
  const s = c ? c.settings : Store.defaultSettings();
  $("system").value = s.system;
  $("thinking").checked = s.thinking;
  $("effort").value = s.effort;
  $("effort").disabled = !s.thinking;
  $("maxtok").value = s.max_tokens === null ? "" : String(s.max_tokens);
  if (policy && policy.max_tokens) $("maxtok").placeholder = "server default (" + policy.max_tokens + ")";
  for (const key of ["temperature", "top_p"]) {
    const ctl = $(key);
    const v = s[key];
    if (ctl.tagName === "SELECT" && v !== null && ![...ctl.options].some((o) => o.value === String(v))) {
      ctl.appendChild(new Option(fmt(v) + " (not allowed by this server)", String(v)));
    }
    ctl.value = v === null ? "" : String(v);
  }
  const note = $("sampling-note");
  if (!policy) {
    note.textContent = "The server did not say which sampling values it allows; a refused value is reported when sent.";
  } else if (policy.sampling === "free") {
    note.textContent = "The server runs with --sampling free: any temperature in [0, 2] and top p in (0, 1].";
  } else {
    note.textContent = "Locked: temperature and top p stay at Kimi K3's values (the model's defaults and the " +
      "values Moonshot's API accepts) because the server runs with --sampling k3; start it with --sampling free " +
      "to set others.";
  }
}

function bindSetting(id, key, read) {
  $(id).addEventListener("change", () => {
    const value = read($(id));  // before newConv() redraws the controls
    const c = current() || newConv();
    c.settings[key] = value;
    c.updated = Date.now();
    $("effort").disabled = !c.settings.thinking;
    persist();
  });
}

// ---- messages -----------------------------------------------------------
function ancestors(conv, m) {
  const out = [];
  for (let x = m; x; x = x.parent ? Store.byId(conv, x.parent) : null) out.unshift(x);
  return out;
}

function drawToolCalls(box, calls) {
  box.replaceChildren();
  for (const t of calls || []) {
    const d = el("details", "tool");
    d.open = true;
    const sum = el("summary");
    sum.appendChild(document.createTextNode("tool call "));
    sum.appendChild(el("span", "tool-name", t.function.name || "…"));
    if (t.id) sum.appendChild(document.createTextNode(" \u00b7 " + t.id));
    d.appendChild(sum);
    let args = t.function.arguments;
    try { args = JSON.stringify(JSON.parse(args), null, 2); } catch (e) { /* partial or not JSON: as sent */ }
    const pre = el("pre");
    const code = el("code");
    Md.highlight(args, "json", code);
    pre.appendChild(code);
    d.appendChild(pre);
    box.appendChild(d);
  }
}

// Fills the parts of a message box that change while it streams.
function fillMessage(box, m) {
  const det = box.querySelector("details.reasoning");
  if (det) {
    box.querySelector(".reasoning-text").textContent = m.reasoning || "";
    det.hidden = !m.reasoning;
  }
  const content = box.querySelector(".content");
  if (content) Md.render(content, m.content || "");
  const tools = box.querySelector(".tools");
  if (tools) drawToolCalls(tools, m.tool_calls);
  box.querySelector(".stats").textContent = m.stats || "";
  box.querySelector(".stats").hidden = !m.stats;
  const err = box.querySelector(".error");
  err.textContent = m.error || "";
  err.hidden = !m.error;
}

function branchNav(conv, m) {
  const sib = Store.siblings(conv, m);
  if (sib.count < 2) return null;
  const nav = el("span", "branches");
  nav.setAttribute("role", "group");
  nav.setAttribute("aria-label", "Branch " + (sib.index + 1) + " of " + sib.count);
  const prev = button("\u2039", "Previous branch", () => moveBranch(conv, m, -1));
  prev.disabled = sib.index === 0 || !!gen;
  prev.dataset.nav = "prev";
  const next = button("\u203a", "Next branch", () => moveBranch(conv, m, +1));
  next.disabled = sib.index === sib.count - 1 || !!gen;
  next.dataset.nav = "next";
  nav.appendChild(prev);
  nav.appendChild(el("span", "branch-pos", sib.index + 1 + "/" + sib.count));
  nav.appendChild(next);
  return nav;
}

function moveBranch(conv, m, step) {
  if (gen) return;
  const sib = Store.siblings(conv, m);
  const to = sib.list[sib.index + step];
  if (!to) return;
  Store.select(conv, to);
  persist();
  drawLog();
  // Keep the keyboard where it was: on the same message's navigation.
  const box = document.querySelector('.msg[data-id="' + to.id + '"]');
  if (box) {
    const same = box.querySelector('.branches [data-nav="' + (step < 0 ? "prev" : "next") + '"]');
    (same && !same.disabled ? same : box).focus();
  }
}

function drawMessage(conv, m) {
  const box = el("article", "msg " + m.role);
  box.dataset.id = m.id;
  box.tabIndex = -1;
  box.appendChild(el("div", "role", m.role === "user" ? "You" : "k3"));
  if (editing === m.id) {
    const ta = el("textarea", "edit");
    ta.value = m.content;
    ta.setAttribute("aria-label", m.role === "user" ? "Edit message" : "Edit answer");
    box.appendChild(ta);
    const actions = el("div", "actions");
    const save = () => finishEdit(conv, m, ta.value);
    actions.appendChild(button(m.role === "user" ? "Send" : "Save", null, save, "small primary"));
    actions.appendChild(button("Cancel", "Cancel edit", () => { editing = null; drawLog(); }));
    box.appendChild(actions);
    ta.addEventListener("keydown", (ev) => {
      if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) { ev.preventDefault(); save(); }
      if (ev.key === "Escape") { ev.preventDefault(); ev.stopPropagation(); editing = null; drawLog(); }
    });
    setTimeout(() => ta.focus(), 0);
    return box;
  }
  if (m.role === "assistant") {
    const det = el("details", "reasoning");
    det.appendChild(el("summary", null, "Reasoning"));
    det.appendChild(el("div", "reasoning-text"));
    box.appendChild(det);
  }
  box.appendChild(el("div", "content md"));
  if (m.role === "assistant") box.appendChild(el("div", "tools"));
  box.appendChild(el("div", "stats"));
  box.appendChild(el("div", "error"));
  fillMessage(box, m);

  const actions = el("div", "actions");
  const nav = branchNav(conv, m);
  if (nav) actions.appendChild(nav);
  const busy = !!gen;
  actions.appendChild(button("Copy", null, (ev) => Md.copyText(m.content, ev.currentTarget)));
  const edit = button("Edit", null, () => { editing = m.id; drawLog(); });
  edit.disabled = busy;
  actions.appendChild(edit);
  if (m.role === "assistant") {
    const regen = button("Regenerate", null, () => regenerate(conv, m));
    regen.disabled = busy;
    actions.appendChild(regen);
  }
  box.appendChild(actions);
  box.addEventListener("keydown", (ev) => {
    if (ev.target.closest("textarea, input")) return;
    if (ev.key === "ArrowLeft" || ev.key === "ArrowRight") {
      if (Store.siblings(conv, m).count < 2) return;
      ev.preventDefault();
      moveBranch(conv, m, ev.key === "ArrowLeft" ? -1 : +1);
    }
  });
  return box;
}

function drawLog() {
  const log = $("log");
  const c = current();
  log.replaceChildren();
  if (!c || !c.messages.length) {
    log.appendChild(el("p", "empty", "Ask anything. Edit a message or regenerate an answer to branch the conversation."));
    return;
  }
  for (const m of Store.path(c)) log.appendChild(drawMessage(c, m));
  log.scrollTop = log.scrollHeight;
}

function drawHeader() {
  const c = current();
  $("title").textContent = (c && c.title) || "New chat";
  document.title = (c && c.title ? c.title + " \u00b7 " : "") + "k3 chat";
}

function drawAll() {
  drawConvs();
  drawHeader();
  drawSettings();
  drawLog();
}

// Streaming redraws: at most once per frame per message.
const pending = new Set();
function redraw(m) {
  if (pending.has(m)) return;
  pending.add(m);
  requestAnimationFrame(() => {
    pending.delete(m);
    const box = document.querySelector('.msg[data-id="' + m.id + '"]');
    if (!box) return;
    fillMessage(box, m);
    const log = $("log");
    if (log.scrollHeight - log.scrollTop - log.clientHeight < 120) log.scrollTop = log.scrollHeight;
  });
}

function finishEdit(conv, m, text) {
  editing = null;
  if (!text.trim() || text === m.content) { drawLog(); return; }
  if (m.role === "user") {
    const u = Store.addMessage(conv, m.parent, { role: "user", content: text });
    generate(conv, u);
  } else {
    const fields = { role: "assistant", content: text, stats: "edited" };
    if (m.reasoning) fields.reasoning = m.reasoning;
    Store.addMessage(conv, m.parent, fields);
    persist();
    drawLog();
  }
}

function regenerate(conv, m) {
  const parent = Store.byId(conv, m.parent);
  if (parent && !gen) generate(conv, parent);
}

// ---- progress -----------------------------------------------------------
function showProgress(p) {
  const box = $("progress");
  if (!p) { box.hidden = true; return; }
  box.hidden = false;
  const bar = $("progressbar");
  if (p.queued) {
    $("progress-label").textContent = "Waiting for the model";
    bar.hidden = true;
    $("progress-text").textContent = p.position ? "position " + p.position + " in the queue" : "queued behind other requests";
    return;
  }
  bar.hidden = false;
  $("progress-label").textContent = "Reading the prompt";
  const pct = p.total > 0 ? Math.max(0, Math.min(100, Math.round((100 * p.done) / p.total))) : 0;
  bar.setAttribute("aria-valuenow", String(pct));
  bar.setAttribute("aria-valuetext", p.done + " of " + p.total + " tokens");
  bar.firstElementChild.style.width = pct + "%";
  let text = p.done.toLocaleString("en") + " / " + p.total.toLocaleString("en") + " tokens";
  if (p.cache > 0) text += " (" + p.cache.toLocaleString("en") + " cached)";
  if (p.eta_ms !== undefined && p.eta_ms !== null && p.eta_ms >= 0) text += " \u00b7 about " + eta(p.eta_ms) + " left";
  $("progress-text").textContent = text;
}

function eta(ms) {
  const s = Math.round(ms / 1000);
  if (s < 60) return s + " s";
  const m = Math.floor(s / 60);
  return m < 60 ? m + " min " + (s % 60) + " s" : Math.floor(m / 60) + " h " + (m % 60) + " min";
}

// llama-server's prompt_progress {total, cache, processed, time_ms} (+ k3's
// eta_ms): `processed` counts the cached tokens too, the bar shows the
// tokens actually read.
function fromPromptProgress(pp) {
  const cache = Number(pp.cache) || 0;
  const total = Math.max(0, (Number(pp.total) || 0) - cache);
  const done = Math.max(0, Math.min(total, (Number(pp.processed) || 0) - cache));
  return { done, total, cache, eta_ms: pp.eta_ms };
}

// The SSE comment heartbeats every client gets: ": queued", ": prefill D/T".
function fromHeartbeat(text) {
  if (/^\s*queued/.test(text)) {
    const pos = /position\D*(\d+)/.exec(text);
    return { queued: true, position: pos ? Number(pos[1]) : null };
  }
  const m = /^\s*prefill (\d+)\/(\d+)/.exec(text);
  return m ? { done: Number(m[1]), total: Number(m[2]), cache: 0 } : null;
}

// ---- generation ---------------------------------------------------------
function requestBody(conv, upTo) {
  const s = conv.settings;
  const messages = [];
  if (s.system.trim()) messages.push({ role: "system", content: s.system });
  for (const m of ancestors(conv, upTo)) {
    // An answer that failed or was stopped before any output is no turn.
    if (m.role === "assistant" && !m.content && !m.reasoning && !(m.tool_calls && m.tool_calls.length)) continue;
    const o = { role: m.role, content: m.content };
    if (m.role === "assistant" && m.reasoning) o.reasoning_content = m.reasoning;
    if (m.role === "assistant" && m.tool_calls && m.tool_calls.length) o.tool_calls = m.tool_calls;
    messages.push(o);
  }
  const body = {
    model: $("model").textContent, messages, stream: true, stream_options: { include_usage: true },
    return_progress: true,
    thinking: s.thinking ? { type: "enabled", effort: s.effort } : { type: "disabled" },
  };
  if (s.max_tokens) body.max_tokens = s.max_tokens;
  if (s.temperature !== null) body.temperature = s.temperature;
  if (s.top_p !== null) body.top_p = s.top_p;
  return body;
}

function statsLine(t0, tFirst, usage, k3) {
  const total = (performance.now() - t0) / 1000;
  const ttft = tFirst === null ? total : (tFirst - t0) / 1000;
  let line = "TTFT " + ttft.toFixed(2) + " s";
  if (usage) {
    const rate = k3 && k3.decode_tok_per_s ? k3.decode_tok_per_s : usage.completion_tokens / Math.max(1e-6, total - ttft);
    line += " \u00b7 " + rate.toFixed(1) + " tok/s \u00b7 " + usage.completion_tokens + " tokens";
    const cached = usage.prompt_tokens_details ? usage.prompt_tokens_details.cached_tokens : 0;
    line += " \u00b7 cached " + cached + "/" + usage.prompt_tokens + " prompt tokens";
    if (k3 && k3.expert_hit_rate !== undefined) line += " \u00b7 expert hits " + (100 * k3.expert_hit_rate).toFixed(1) + "%";
  }
  return line;
}

async function generate(conv, userMsg) {
  if (gen) return;
  if (!conv.title) conv.title = userMsg.content.replace(/\s+/g, " ").trim().slice(0, 48);
  const answer = Store.addMessage(conv, userMsg.id, { role: "assistant", content: "", reasoning: "" });
  const body = requestBody(conv, userMsg);
  gen = { controller: new AbortController(), convId: conv.id, messageId: answer.id };
  persist();
  drawConvs();
  drawHeader();
  drawLog();
  $("send").disabled = true;
  $("stop").disabled = false;
  status("waiting");
  showProgress({ queued: true });
  const t0 = performance.now();
  let tFirst = null, usage = null, k3 = null;
  const first = () => { if (tFirst === null) { tFirst = performance.now(); showProgress(null); status("generating"); } };
  try {
    const res = await fetch("/v1/chat/completions", {
      method: "POST", headers: authHeaders({ "Content-Type": "application/json" }),
      body: JSON.stringify(body), signal: gen.controller.signal,
    });
    if (!res.ok) {
      let msg = res.status + " " + res.statusText;
      try { msg = (await res.json()).error.message; } catch (e) { /* not JSON: the status line */ }
      throw new Error(msg);
    }
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true }).replace(/\r\n/g, "\n");
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const event = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        for (const line of event.split("\n")) {
          if (line.startsWith(":")) {
            const p = tFirst === null ? fromHeartbeat(line.slice(1)) : null;
            if (p) { showProgress(p); status(p.queued ? "waiting in the queue" : "reading the prompt"); }
            continue;
          }
          if (!line.startsWith("data:")) continue;
          const data = line.slice(5).trim();
          if (data === "[DONE]") continue;
          const chunk = JSON.parse(data);
          if (chunk.error) throw new Error(chunk.error.message);
          if (chunk.prompt_progress && tFirst === null) {
            showProgress(fromPromptProgress(chunk.prompt_progress));
            status("reading the prompt");
          }
          if (chunk.usage) { usage = chunk.usage; k3 = chunk.k3 || null; }
          for (const choice of chunk.choices || []) {
            const d = choice.delta || {};
            if (d.reasoning_content) {
              first();
              answer.reasoning += d.reasoning_content;
              const box = document.querySelector('.msg[data-id="' + answer.id + '"] details.reasoning');
              if (box && !answer.content) box.open = true;  // watch it think; folded once the answer starts
            }
            if (d.content) {
              first();
              if (!answer.content) {
                const box = document.querySelector('.msg[data-id="' + answer.id + '"] details.reasoning');
                if (box) box.open = false;
              }
              answer.content += d.content;
            }
            for (const tc of d.tool_calls || []) {
              first();
              answer.tool_calls = answer.tool_calls || [];
              const k = tc.index || 0;
              const t = answer.tool_calls[k] ||
                        (answer.tool_calls[k] = { id: "", type: "function", function: { name: "", arguments: "" } });
              if (tc.id) t.id = tc.id;
              if (tc.function && tc.function.name) t.function.name += tc.function.name;
              if (tc.function && tc.function.arguments) t.function.arguments += tc.function.arguments;
            }
          }
          redraw(answer);
        }
      }
    }
    answer.stats = statsLine(t0, tFirst, usage, k3);
    if (usage) answer.usage = usage;
    status("done");
  } catch (e) {
    if (e.name === "AbortError") {
      answer.stats = "stopped";
      status("stopped");
    } else {
      answer.error = String(e.message || e);
      status("error");
    }
  } finally {
    if (answer.tool_calls) answer.tool_calls = answer.tool_calls.filter(Boolean);
    gen = null;
    showProgress(null);
    $("send").disabled = false;
    $("stop").disabled = true;
    conv.updated = Date.now();
    persist();
    if (currentId === conv.id) drawLog();
    refreshHitRate();
  }
}

function send(text) {
  if (gen) return;
  const c = current() || newConv();
  const path = Store.path(c);
  const last = path.length ? path[path.length - 1] : null;
  // After an answer that failed to start, the new message follows the question.
  const u = Store.addMessage(c, last ? last.id : null, { role: "user", content: text });
  generate(c, u);
}

async function refreshHitRate() {
  try {
    const text = await (await fetch("/metrics")).text();
    const m = text.match(/^k3_expert_cache_hit_rate ([0-9.eE+-]+)$/m);
    if (m) $("hitrate").textContent = (100 * parseFloat(m[1])).toFixed(1) + "%";
  } catch (e) { /* the page works without metrics */ }
}

async function loadModel() {
  try {
    const r = await fetch("/v1/models", { headers: authHeaders({}) });
    if (r.status === 401) { notice("This server needs an API key: open Settings and enter it."); return; }
    const j = await r.json();
    const m = j.data && j.data[0];
    if (!m) return;
    $("model").textContent = m.id;
    policy = m.k3 && m.k3.sampling ? m.k3 : null;
    samplingControl("temperature", "Temperature");
    samplingControl("top_p", "Top p");
    drawSettings();
  } catch (e) {
    notice("Could not reach the server (" + e.message + ").");
  }
}

// ---- wiring -------------------------------------------------------------
$("form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const text = $("input").value;
  if (!text.trim() || gen) return;
  $("input").value = "";
  send(text);
});
$("input").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) { ev.preventDefault(); $("form").requestSubmit(); }
});
$("stop").addEventListener("click", () => { if (gen) gen.controller.abort(); });
document.addEventListener("keydown", (ev) => {
  if (ev.key !== "Escape") return;
  if (gen) { ev.preventDefault(); gen.controller.abort(); return; }
  if ($("sidebar").classList.contains("open")) { closeSidebar(); $("open-side").focus(); }
});
$("new").addEventListener("click", () => { newConv(); closeSidebar(); });
$("open-side").addEventListener("click", openSidebar);
$("close-side").addEventListener("click", () => { closeSidebar(); $("open-side").focus(); });
$("search").addEventListener("input", () => { searchText = $("search").value.trim(); drawConvs(); });
$("export-all").addEventListener("click", () => download(convs, "all"));
$("import").addEventListener("click", () => $("import-file").click());
$("import-file").addEventListener("change", () => {
  const f = $("import-file").files[0];
  $("import-file").value = "";
  if (f) importFile(f);
});
$("settings-btn").addEventListener("click", () => {
  const open = $("settings").hidden;
  $("settings").hidden = !open;
  $("settings-btn").setAttribute("aria-expanded", String(open));
  if (open) $("system").focus();
});
bindSetting("system", "system", (e) => e.value);
bindSetting("thinking", "thinking", (e) => e.checked);
bindSetting("effort", "effort", (e) => e.value);
bindSetting("maxtok", "max_tokens", (e) => { const n = parseInt(e.value, 10); return n >= 1 ? n : null; });
$("apikey").value = localStorage.getItem("k3.key") || "";
$("apikey").addEventListener("change", () => {
  const key = $("apikey").value;
  if (key) localStorage.setItem("k3.key", key); else localStorage.removeItem("k3.key");
  loadModel();
});

samplingControl("temperature", "Temperature");
samplingControl("top_p", "Top p");
if (Store.lastError) notice("Note: " + Store.lastError + ".");
drawAll();
loadModel();
refreshHitRate();
