// Conversations as trees of messages, kept in localStorage, exported and
// imported as JSON (the format is docs/server.md "Export format").
//
// A conversation holds every message it ever had in `messages`, in creation
// order, each naming its `parent` (null for a first message). Editing a
// message or regenerating an answer adds a sibling, so no branch is lost;
// `selected` maps a parent id ("" for the top) to the child shown on the
// current path. Siblings are ordered by creation, which is array order.
const Store = (() => {
  const KEY = "k3.chats.v1";
  const OLD_KEY = "k3.convs";  // the single-branch list of the first page
  const FORMAT = "k3-chat-export";
  const VERSION = 1;
  const ROLES = new Set(["user", "assistant"]);

  function newId(prefix) {
    const r = crypto.getRandomValues(new Uint32Array(2));
    return prefix + Date.now().toString(36) + r[0].toString(36) + r[1].toString(36);
  }

  function defaultSettings() {
    return { system: "", thinking: true, effort: "max", max_tokens: null, temperature: null, top_p: null };
  }

  function newConversation(settings) {
    const now = Date.now();
    return {
      id: newId("c"), title: "", created: now, updated: now,
      settings: Object.assign(defaultSettings(), settings || {}), messages: [], selected: {},
    };
  }

  function byId(conv, id) { return conv.messages.find((m) => m.id === id) || null; }
  function children(conv, parentId) { return conv.messages.filter((m) => (m.parent || null) === (parentId || null)); }

  // The messages shown: from the top, each step the selected child (the
  // newest when none is selected).
  function path(conv) {
    const out = [];
    let parent = null;
    for (;;) {
      const kids = children(conv, parent);
      if (!kids.length) return out;
      const want = conv.selected[parent || ""];
      const next = kids.find((k) => k.id === want) || kids[kids.length - 1];
      out.push(next);
      parent = next.id;
    }
  }

  function addMessage(conv, parentId, fields) {
    const m = Object.assign({ id: newId("m"), parent: parentId || null, created: Date.now() }, fields);
    conv.messages.push(m);
    conv.selected[parentId || ""] = m.id;
    conv.updated = Date.now();
    return m;
  }

  // Position among siblings: {index (0-based), count, siblings}.
  function siblings(conv, m) {
    const sib = children(conv, m.parent);
    return { index: sib.findIndex((s) => s.id === m.id), count: sib.length, list: sib };
  }

  function select(conv, m) { conv.selected[m.parent || ""] = m.id; }

  // ---- validation of anything read back (storage or an imported file).
  class FormatError extends Error {}
  function fail(where, what) { throw new FormatError(where + ": " + what); }
  function isStr(v) { return typeof v === "string"; }
  function optStr(v) { return v === undefined || v === null || isStr(v); }
  function optNum(v) { return v === undefined || v === null || (typeof v === "number" && isFinite(v)); }

  function checkSettings(s, where) {
    const out = defaultSettings();
    if (s === undefined || s === null) return out;
    if (typeof s !== "object" || Array.isArray(s)) fail(where, "must be an object");
    if (!optStr(s.system)) fail(where + ".system", "must be a string");
    if (s.thinking !== undefined && typeof s.thinking !== "boolean") fail(where + ".thinking", "must be true or false");
    if (s.effort !== undefined && !["low", "high", "max"].includes(s.effort)) fail(where + ".effort", "must be low, high or max");
    for (const k of ["max_tokens", "temperature", "top_p"]) if (!optNum(s[k])) fail(where + "." + k, "must be a number or null");
    if (s.max_tokens != null && !(Number.isInteger(s.max_tokens) && s.max_tokens >= 1)) fail(where + ".max_tokens", "must be an integer >= 1");
    for (const k of Object.keys(out)) if (s[k] !== undefined) out[k] = s[k];
    return out;
  }

  function checkConversation(c, where) {
    if (!c || typeof c !== "object" || Array.isArray(c)) fail(where, "must be an object");
    if (!isStr(c.id) || !c.id) fail(where + ".id", "must be a non-empty string");
    if (!optStr(c.title)) fail(where + ".title", "must be a string");
    if (!Array.isArray(c.messages)) fail(where + ".messages", "must be an array");
    const seen = new Set();
    const messages = c.messages.map((m, k) => {
      const w = where + ".messages[" + k + "]";
      if (!m || typeof m !== "object") fail(w, "must be an object");
      if (!isStr(m.id) || !m.id) fail(w + ".id", "must be a non-empty string");
      if (seen.has(m.id)) fail(w + ".id", "'" + m.id + "' is used twice");
      if (m.parent !== null && m.parent !== undefined && !seen.has(m.parent)) {
        fail(w + ".parent", "'" + m.parent + "' is not an earlier message of this conversation");
      }
      if (!ROLES.has(m.role)) fail(w + ".role", "must be user or assistant");
      if (!isStr(m.content)) fail(w + ".content", "must be a string");
      for (const k of ["reasoning", "stats", "error"]) if (!optStr(m[k])) fail(w + "." + k, "must be a string");
      if (m.tool_calls !== undefined && m.tool_calls !== null) {
        if (!Array.isArray(m.tool_calls)) fail(w + ".tool_calls", "must be an array");
        m.tool_calls.forEach((t, j) => {
          const tw = w + ".tool_calls[" + j + "]";
          if (!t || typeof t !== "object" || !t.function || !isStr(t.function.name) || !isStr(t.function.arguments)) {
            fail(tw, "must be {id, type, function: {name, arguments}} with string name and arguments");
          }
        });
      }
      seen.add(m.id);
      const out = { id: m.id, parent: m.parent || null, role: m.role, content: m.content,
                    created: typeof m.created === "number" ? m.created : 0 };
      for (const k of ["reasoning", "stats", "error"]) if (m[k]) out[k] = m[k];
      if (m.tool_calls && m.tool_calls.length) {
        out.tool_calls = m.tool_calls.map((t) => ({ id: isStr(t.id) ? t.id : "", type: "function",
          function: { name: t.function.name, arguments: t.function.arguments } }));
      }
      if (m.usage && typeof m.usage === "object") out.usage = m.usage;
      return out;
    });
    const selected = {};
    if (c.selected !== undefined && c.selected !== null) {
      if (typeof c.selected !== "object" || Array.isArray(c.selected)) fail(where + ".selected", "must be an object");
      for (const [parent, child] of Object.entries(c.selected)) {
        const m = messages.find((x) => x.id === child);
        if (!m || (m.parent || "") !== parent) fail(where + ".selected['" + parent + "']", "names no child of that message");
        selected[parent] = child;
      }
    }
    return {
      id: c.id, title: c.title || "", created: optNum(c.created) && c.created ? c.created : Date.now(),
      updated: optNum(c.updated) && c.updated ? c.updated : Date.now(),
      settings: checkSettings(c.settings, where + ".settings"), messages, selected,
    };
  }

  // The first page kept one branch: [{id, title, messages: [{role, content, reasoning, stats, error}]}].
  function migrate(old) {
    if (!Array.isArray(old)) return [];
    return old.filter((c) => c && Array.isArray(c.messages)).map((c) => {
      const conv = newConversation();
      conv.title = isStr(c.title) ? c.title : "";
      let parent = null;
      for (const m of c.messages) {
        if (!m || !ROLES.has(m.role) || !isStr(m.content)) continue;
        const fields = { role: m.role, content: m.content };
        for (const k of ["reasoning", "stats", "error"]) if (isStr(m[k]) && m[k]) fields[k] = m[k];
        parent = addMessage(conv, parent, fields).id;
      }
      return conv;
    });
  }

  let lastError = null;
  return {
    FormatError, newConversation, defaultSettings, path, addMessage, siblings, select, byId, children,

    // Conversations newest first, or [] with lastError set when what is stored cannot be read.
    load() {
      lastError = null;
      try {
        const raw = localStorage.getItem(KEY);
        if (raw === null) {
          const old = localStorage.getItem(OLD_KEY);
          return old ? migrate(JSON.parse(old)) : [];
        }
        const list = JSON.parse(raw);
        if (!Array.isArray(list)) fail("stored conversations", "not a list");
        return list.map((c, k) => checkConversation(c, "stored conversation " + k));
      } catch (e) {
        lastError = "the conversations stored in this browser could not be read (" + e.message + ")";
        return [];
      }
    },
    get lastError() { return lastError; },

    // Returns null when saved, else the reason (storage full or refused).
    save(convs) {
      try {
        localStorage.setItem(KEY, JSON.stringify(convs));
        localStorage.removeItem(OLD_KEY);
        return null;
      } catch (e) {
        const full = e && (e.name === "QuotaExceededError" || e.name === "NS_ERROR_DOM_QUOTA_REACHED" || e.code === 22);
        return full ? "The browser's storage for this page is full: the latest changes are not saved. " +
                      "Export your conversations, then delete old ones."
                    : "The browser refused to save the conversations (" + (e && e.message) + ").";
      }
    },

    exportJson(convs) {
      return JSON.stringify({ format: FORMAT, version: VERSION, exported: new Date().toISOString(),
                              conversations: convs }, null, 1);
    },

    // Parses an export file; throws FormatError naming the first bad field.
    parseImport(text) {
      let doc;
      try { doc = JSON.parse(text); } catch (e) { throw new FormatError("not JSON: " + e.message); }
      if (!doc || doc.format !== FORMAT) fail("format", "is not '" + FORMAT + "'");
      if (doc.version !== VERSION) fail("version", "is " + JSON.stringify(doc.version) + "; this page reads " + VERSION);
      if (!Array.isArray(doc.conversations)) fail("conversations", "must be an array");
      return doc.conversations.map((c, k) => checkConversation(c, "conversations[" + k + "]"));
    },
  };
})();
