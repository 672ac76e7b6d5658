// A small Markdown renderer that builds DOM nodes and never parses HTML:
// model text only ever becomes text nodes, so `<img onerror=...>` shows as
// the characters the model wrote. Links keep only http(s) and mailto targets
// and open with rel=noopener; images become links (nothing is loaded).
// Covers what chat answers use: fenced code (highlighted, with a copy
// button), headings, lists (nested by indent), block quotes, tables, rules,
// emphasis, strike, inline code, links and autolinks. An unclosed fence (an
// answer still streaming) renders as code up to the end.
const Md = (() => {
  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  // Only absolute http(s) and mailto targets; anything else (javascript:,
  // data:, relative paths) gives plain text. The string is set through the
  // DOM property, so no HTML entity decoding happens on the way.
  function safeHref(url) {
    const u = url.trim();
    return /^(https?:\/\/|mailto:)[^\s]*$/i.test(u) ? u : null;
  }

  // ---- code highlighting: comments, strings, numbers, keywords, literals.
  const KEYWORDS = new Set((
    "as async await break case catch class const continue def default defer del delete do elif else enum " +
    "export extends fn for from func function go if impl import in interface let loop match mod module mut " +
    "namespace new package pass pub raise return self static struct super switch template this throw try " +
    "type typedef typeof use using var void while with yield int char float double bool auto unsigned long " +
    "short signed string lambda local end then and or not is echo fi esac done select where insert update"
  ).split(" "));
  const LITERALS = new Set("true false null nil None True False undefined NaN nullptr".split(" "));
  const HASH_COMMENTS = new Set("py python sh bash shell zsh rb ruby yaml yml toml perl r make makefile cmake dockerfile ini conf".split(" "));
  const DASH_COMMENTS = new Set("sql lua haskell hs".split(" "));
  const NO_SLASH_COMMENTS = new Set([...HASH_COMMENTS, ...DASH_COMMENTS, "json", "text", "txt", "md", "markdown", "csv"]);

  function highlighter(lang) {
    const parts = [];
    if (!NO_SLASH_COMMENTS.has(lang)) parts.push("\\/\\/[^\\n]*|\\/\\*[\\s\\S]*?(?:\\*\\/|$)");
    if (HASH_COMMENTS.has(lang)) parts.push("#[^\\n]*");
    if (DASH_COMMENTS.has(lang)) parts.push("--[^\\n]*");
    const comment = parts.length ? "(" + parts.join("|") + ")" : "(\\b\\B)";
    const string = "(\"(?:[^\"\\\\\\n]|\\\\.)*\"?|'(?:[^'\\\\\\n]|\\\\.)*'?|`(?:[^`\\\\]|\\\\.)*`?)";
    const number = "(\\b(?:0[xX][0-9a-fA-F_]+|\\d[\\d_]*(?:\\.\\d+)?(?:[eE][+-]?\\d+)?)\\b)";
    const word = "([A-Za-z_$][\\w$]*)";
    return new RegExp(comment + "|" + string + "|" + number + "|" + word, "g");
  }

  function highlight(code, lang, target) {
    const re = highlighter(lang);
    let last = 0, plain = "";
    const flush = () => { if (plain) { target.appendChild(document.createTextNode(plain)); plain = ""; } };
    const span = (cls, text) => { flush(); target.appendChild(el("span", cls, text)); };
    let m;
    while ((m = re.exec(code)) !== null) {
      if (m[0] === "") { re.lastIndex++; continue; }
      plain += code.slice(last, m.index);
      if (m[1] !== undefined) span("tok-c", m[0]);
      else if (m[2] !== undefined) span("tok-s", m[0]);
      else if (m[3] !== undefined) span("tok-n", m[0]);
      else if (KEYWORDS.has(m[0])) span("tok-k", m[0]);
      else if (LITERALS.has(m[0])) span("tok-l", m[0]);
      else plain += m[0];
      last = re.lastIndex;
    }
    plain += code.slice(last);
    flush();
  }

  // ---- inline: escapes, code spans, emphasis, strike, links, autolinks.
  const PUNCT = "\\`*_{}[]()#+-.!|~<>\"'$";

  // The label is rendered without links (no link inside a link).
  function linkNode(label, href, plainLabel) {
    const safe = safeHref(href);
    if (!safe) return null;
    const a = el("a");
    a.href = safe;
    a.rel = "noopener noreferrer";
    a.target = "_blank";
    if (plainLabel) a.textContent = label; else inline(label || safe, a, true);
    return a;
  }

  // Finds `]` that closes the `[` at `open`, allowing nested brackets.
  function closeBracket(s, open) {
    let depth = 0;
    for (let i = open; i < s.length; ++i) {
      if (s[i] === "\\") { ++i; continue; }
      if (s[i] === "[") ++depth;
      else if (s[i] === "]" && --depth === 0) return i;
    }
    return -1;
  }

  // Finds `)` that closes the `(` at `open` (targets may hold parentheses).
  function closeParen(s, open) {
    let depth = 0;
    for (let i = open; i < s.length && s[i] !== "\n"; ++i) {
      if (s[i] === "(") ++depth;
      else if (s[i] === ")" && --depth === 0) return i;
    }
    return -1;
  }

  function inline(s, parent, inLink) {
    let text = "";
    const flush = () => { if (text) { parent.appendChild(document.createTextNode(text)); text = ""; } };
    const put = (node) => { flush(); parent.appendChild(node); };
    let i = 0;
    while (i < s.length) {
      const c = s[i];
      if (c === "\\" && i + 1 < s.length && PUNCT.includes(s[i + 1])) { text += s[i + 1]; i += 2; continue; }
      if (c === "\n") { put(el("br")); ++i; continue; }
      if (c === "`") {
        let n = 1;
        while (s[i + n] === "`") ++n;
        const fence = "`".repeat(n);
        const end = s.indexOf(fence, i + n);
        if (end > 0) {
          put(el("code", null, s.slice(i + n, end).replace(/^ (.*) $/, "$1")));
          i = end + n;
          continue;
        }
        text += fence; i += n; continue;
      }
      if (!inLink && (c === "!" && s[i + 1] === "[" || c === "[")) {
        const image = c === "!";
        const open = image ? i + 1 : i;
        const close = closeBracket(s, open);
        if (close > 0 && s[close + 1] === "(") {
          const end = closeParen(s, close + 1);
          if (end > 0) {
            const target = s.slice(close + 2, end).trim().replace(/\s+"[^"]*"$/, "").replace(/^<(.*)>$/, "$1");
            const label = s.slice(open + 1, close);
            const a = linkNode(image ? (label || "image") : label, target);
            if (a) { put(a); } else { flush(); inline(label, parent, true); }
            i = end + 1;
            continue;
          }
        }
      }
      if (c === "<" && !inLink) {
        const m = /^<((?:https?:\/\/|mailto:)[^\s<>]+)>/i.exec(s.slice(i));
        if (m) { put(linkNode(m[1], m[1], true)); i += m[0].length; continue; }
      }
      if (!inLink && (c === "h" || c === "H") && (i === 0 || /[\s(]/.test(s[i - 1]))) {
        const m = /^https?:\/\/[^\s<>()]+[^\s<>().,;:!?'"]/i.exec(s.slice(i));
        if (m) { put(linkNode(m[0], m[0], true)); i += m[0].length; continue; }
      }
      if (c === "~" && s[i + 1] === "~") {
        const end = s.indexOf("~~", i + 2);
        if (end > i + 2) { const d = el("del"); inline(s.slice(i + 2, end), d, inLink); put(d); i = end + 2; continue; }
      }
      if (c === "*" || c === "_") {
        const strong = s[i + 1] === c;
        const mark = strong ? c + c : c;
        const start = i + mark.length;
        const prevWord = i > 0 && /\w/.test(s[i - 1]);
        if (!(c === "_" && prevWord) && start < s.length && !/\s/.test(s[start])) {
          let end = s.indexOf(mark, start + 1);
          // A single mark must not be the start of a double one.
          while (!strong && end > 0 && s[end + 1] === c) end = s.indexOf(mark, end + 2);
          if (end > start && !/\s/.test(s[end - 1]) && !(c === "_" && /\w/.test(s[end + mark.length] || ""))) {
            const e = el(strong ? "strong" : "em");
            inline(s.slice(start, end), e, inLink);
            put(e);
            i = end + mark.length;
            continue;
          }
        }
      }
      text += c;
      ++i;
    }
    flush();
  }

  // ---- blocks.
  const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^\s`]*)/;
  const HEADING = /^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$/;
  const RULE = /^ {0,3}([-*_])(?:\s*\1){2,}\s*$/;
  const QUOTE = /^ {0,3}> ?/;
  const ITEM = /^( {0,12})([-*+]|\d{1,9}[.)])\s+(.*)$/;
  const TABLE_SEP = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;

  function splitRow(line) {
    let t = line.trim();
    if (t.startsWith("|")) t = t.slice(1);
    if (t.endsWith("|") && !t.endsWith("\\|")) t = t.slice(0, -1);
    const cells = [];
    let cur = "";
    for (let i = 0; i < t.length; ++i) {
      if (t[i] === "\\" && t[i + 1] === "|") { cur += "|"; ++i; continue; }
      if (t[i] === "|") { cells.push(cur.trim()); cur = ""; continue; }
      cur += t[i];
    }
    cells.push(cur.trim());
    return cells;
  }

  function codeBlock(code, lang, parent) {
    const wrap = el("div", "code");
    const head = el("div", "code-head");
    head.appendChild(el("span", null, lang || "code"));
    const copy = el("button", "small copy-code", "Copy");
    copy.type = "button";
    copy.setAttribute("aria-label", "Copy code");
    copy.addEventListener("click", () => Md.copyText(code, copy));
    head.appendChild(copy);
    wrap.appendChild(head);
    const pre = el("pre");
    const codeEl = el("code");
    if (lang) codeEl.dataset.lang = lang;
    highlight(code, lang.toLowerCase(), codeEl);
    pre.appendChild(codeEl);
    wrap.appendChild(pre);
    parent.appendChild(wrap);
  }

  function table(header, aligns, rows, parent) {
    const wrap = el("div", "table-wrap");
    const t = el("table");
    const thead = el("thead");
    const tr = el("tr");
    header.forEach((cell, k) => {
      const th = el("th");
      if (aligns[k]) th.style.textAlign = aligns[k];
      inline(cell, th);
      tr.appendChild(th);
    });
    thead.appendChild(tr);
    t.appendChild(thead);
    const tbody = el("tbody");
    for (const row of rows) {
      const r = el("tr");
      for (let k = 0; k < header.length; ++k) {
        const td = el("td");
        if (aligns[k]) td.style.textAlign = aligns[k];
        inline(row[k] || "", td);
        r.appendChild(td);
      }
      tbody.appendChild(r);
    }
    t.appendChild(tbody);
    wrap.appendChild(t);
    parent.appendChild(wrap);
  }

  function startsBlock(line, next) {
    return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line) || ITEM.test(line) ||
           (line.includes("|") && next !== undefined && TABLE_SEP.test(next) && next.includes("-"));
  }

  function blocks(lines, parent, depth) {
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      if (!line.trim()) { ++i; continue; }
      let m;
      if ((m = FENCE.exec(line))) {
        const fence = m[1];
        const body = [];
        ++i;
        while (i < lines.length && !(lines[i].trim().startsWith(fence) && lines[i].trim().replace(/[`~]/g, "") === "")) {
          body.push(lines[i]);
          ++i;
        }
        ++i;  // the closing fence (or the end of an answer still streaming)
        codeBlock(body.join("\n"), m[2] || "", parent);
        continue;
      }
      if ((m = HEADING.exec(line))) {
        const h = el("h" + m[1].length);
        inline(m[2], h);
        parent.appendChild(h);
        ++i;
        continue;
      }
      if (RULE.test(line)) { parent.appendChild(el("hr")); ++i; continue; }
      if (QUOTE.test(line)) {
        const inner = [];
        while (i < lines.length && lines[i].trim() && (QUOTE.test(lines[i]) || !startsBlock(lines[i], lines[i + 1]))) {
          inner.push(lines[i].replace(QUOTE, ""));
          ++i;
        }
        const q = el("blockquote");
        if (depth < 16) blocks(inner, q, depth + 1); else inline(inner.join("\n"), q);
        parent.appendChild(q);
        continue;
      }
      if ((m = ITEM.exec(line))) {
        const indent = m[1].length;
        const ordered = /\d/.test(m[2]);
        const list = el(ordered ? "ol" : "ul");
        if (ordered && parseInt(m[2], 10) !== 1) list.start = parseInt(m[2], 10);
        while (i < lines.length) {
          const im = ITEM.exec(lines[i]);
          if (!im || im[1].length !== indent || /\d/.test(im[2]) !== ordered) break;
          const item = [im[3]];
          ++i;
          // Continuation: indented deeper than the marker, or a lazy line.
          while (i < lines.length) {
            const l = lines[i];
            if (!l.trim()) {
              if (i + 1 < lines.length && /^\s+/.test(lines[i + 1]) &&
                  lines[i + 1].match(/^\s*/)[0].length > indent) { item.push(""); ++i; continue; }
              break;
            }
            const lead = l.match(/^\s*/)[0].length;
            if (lead > indent) { item.push(l.slice(Math.min(lead, indent + 2 + (im[2].length - 1)))); ++i; continue; }
            if (ITEM.test(l) || startsBlock(l, lines[i + 1])) break;
            item.push(l);
            ++i;
          }
          const li = el("li");
          if (item.length === 1 || depth >= 16) inline(item.join("\n"), li); else blocks(item, li, depth + 1);
          list.appendChild(li);
        }
        parent.appendChild(list);
        continue;
      }
      if (line.includes("|") && i + 1 < lines.length && TABLE_SEP.test(lines[i + 1]) && lines[i + 1].includes("-")) {
        const header = splitRow(line);
        const aligns = splitRow(lines[i + 1]).map((c) =>
          c.startsWith(":") && c.endsWith(":") ? "center" : c.endsWith(":") ? "right" : c.startsWith(":") ? "left" : "");
        i += 2;
        const rows = [];
        while (i < lines.length && lines[i].trim() && lines[i].includes("|")) { rows.push(splitRow(lines[i])); ++i; }
        table(header, aligns, rows, parent);
        continue;
      }
      const para = [line];
      ++i;
      while (i < lines.length && lines[i].trim() && !startsBlock(lines[i], lines[i + 1])) { para.push(lines[i]); ++i; }
      const p = el("p");
      inline(para.join("\n"), p);
      parent.appendChild(p);
    }
  }

  return {
    // Replaces target's children with the rendered text.
    render(target, text) {
      const frag = document.createDocumentFragment();
      blocks(String(text).replace(/\r\n?/g, "\n").split("\n"), frag, 0);
      target.replaceChildren(frag);
    },
    highlight,
    safeHref,
    // Copies with the Clipboard API, or a selected textarea where it is missing.
    async copyText(text, button) {
      let ok = false;
      try {
        await navigator.clipboard.writeText(text);
        ok = true;
      } catch (e) {
        const ta = el("textarea");
        ta.value = text;
        ta.style.position = "fixed";
        ta.style.opacity = "0";
        document.body.appendChild(ta);
        ta.select();
        try { ok = document.execCommand("copy"); } catch (e2) { ok = false; }
        ta.remove();
      }
      if (button) {
        const label = button.textContent;
        button.textContent = ok ? "Copied" : "Copy failed";
        setTimeout(() => { button.textContent = label; }, 1200);
      }
      return ok;
    },
  };
})();
