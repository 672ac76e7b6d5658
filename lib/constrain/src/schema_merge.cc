// allOf: a schema's members (and a combinator beside other keywords, and
// non-recursive $refs) merged into one schema's JSON text, which the compiler
// then parses and compiles like the root's (schema_compiler.h).
#include <simdjson.h>

#include <algorithm>
#include <cstdlib>

#include "k3/core/error.h"
#include "k3/core/json_writer.h"
#include "schema_compiler.h"

namespace k3::constrain {

Compiler::Keywords Compiler::KeywordsOf(object o) {
  Keywords k;
  for (auto f : o) {
    std::string text;
    AppendCompact(text, f.value);
    k.emplace_back(std::string(f.key), std::move(text));
  }
  return k;
}

const std::string* Compiler::Find(const Keywords& k, std::string_view key) {
  for (auto& [name, text] : k)
    if (name == key) return &text;
  return nullptr;
}

void Compiler::Erase(Keywords& k, std::string_view key) {
  std::erase_if(k, [&](const auto& kv) { return kv.first == key; });
}

void Compiler::Set(Keywords& k, const std::string& key, std::string text) {
  for (auto& [name, t] : k)
    if (name == key) {
      t = std::move(text);
      return;
    }
  k.emplace_back(key, std::move(text));
}

std::string Compiler::TextOf(const Keywords& k) {
  std::string out = "{";
  for (auto& [name, text] : k) {
    if (out.size() > 1) out += ',';
    AppendJsonString(out, name, InvalidUtf8::kPassThrough);
    out += ':';
    out += text;
  }
  return out + "}";
}

std::string Compiler::AllOfText(const std::string& a, const std::string& b) {
  if (a == "true" || a == "{}" || a == b) return b;
  if (b == "true" || b == "{}") return a;
  if (a == "false" || b == "false") return "false";
  return "{\"allOf\":[" + a + "," + b + "]}";
}

element Compiler::Own(const std::string& text, const std::string& ptr) {
  merged_bytes_ += text.size();
  // The text and its parsed document (simdjson's tape and string buffer).
  budget_.Charge(text.size() / 8 + 1, 4 * text.size() + 256);
  if (merged_bytes_ > kMaxSchemaBytes)
    throw Error(ErrorCode::kUnsupported,
                "allOf at " + Where(ptr) + " merges into more than " +
                    std::to_string(kMaxSchemaBytes) + " bytes of schema",
                {}, Error::kNoOffset, "schema");
  owned_.push_back(std::make_unique<simdjson::dom::parser>());
  element out;
  if (owned_.back()->parse(simdjson::padded_string(text)).get(out) != simdjson::SUCCESS)
    throw Error(ErrorCode::kInternal, "merged schema does not parse: " + text.substr(0, 200));
  return out;
}

bool Compiler::IsPatternList(object o) {
  element v;
  if (o["allOf"].get(v) != simdjson::SUCCESS || v.type() != element_type::ARRAY) return false;
  simdjson::dom::array arr(v);
  if (arr.size() == 0) return false;
  for (element x : arr) {
    if (x.type() != element_type::OBJECT) return false;
    bool has = false;
    for (auto f : object(x)) {
      if (f.key == "pattern" && f.value.type() == element_type::STRING)
        has = true;
      else if (!kAnnotations.count(f.key))
        return false;
    }
    if (!has) return false;
  }
  return true;
}

element Compiler::MergeAllOf(object o, const std::string& ptr) {
  std::vector<Keywords> parts;
  std::vector<Keywords> todo = {KeywordsOf(o)};
  size_t steps = 0;
  while (!todo.empty()) {
    Keywords k = std::move(todo.back());
    todo.pop_back();
    if (++steps > 256) {
      Relaxed("allOf", ptr, "more than 256 schemas to merge", "the rest dropped");
      break;
    }
    if (const std::string* all = Find(k, "allOf")) {
      element arr = Own(*all, ptr);
      if (arr.type() != element_type::ARRAY) Corrupt(ptr + "/allOf", "must be an array");
      Erase(k, "allOf");
      std::vector<Keywords> members;
      for (element x : simdjson::dom::array(arr)) {
        if (x.type() == element_type::BOOL) {
          if (!bool(x)) Unsatisfiable(ptr, "an allOf member is false");
          continue;
        }
        if (x.type() != element_type::OBJECT) Corrupt(ptr + "/allOf", "members must be schemas");
        members.push_back(KeywordsOf(object(x)));
      }
      for (auto it = members.rbegin(); it != members.rend(); ++it) todo.push_back(std::move(*it));
    }
    if (const std::string* ref = Find(k, "$ref")) {
      element r = Own(*ref, ptr);
      const bool others = std::any_of(k.begin(), k.end(), [](const auto& kv) {
        return kv.first != "$ref" && !kAnnotations.count(kv.first) &&
               kv.first.substr(0, 2) != "x-";
      });
      if (r.type() == element_type::STRING && !std::string_view(r).empty() &&
          std::string_view(r)[0] == '#' && !Cyclic(std::string(std::string_view(r))) &&
          (others || !parts.empty() || !todo.empty())) {
        element target = Resolve(std::string(std::string_view(r)), ptr);
        Erase(k, "$ref");
        if (target.type() == element_type::BOOL) {
          if (!bool(target)) Unsatisfiable(ptr, "'$ref' resolves to false");
        } else if (target.type() == element_type::OBJECT) {
          todo.push_back(KeywordsOf(object(target)));
        } else {
          Corrupt(ptr + "/$ref", "resolves to a value that is not a schema");
        }
      }
    }
    parts.push_back(std::move(k));
  }
  Keywords merged;
  for (Keywords& p : parts) merged = MergeTwo(std::move(merged), std::move(p), ptr);
  // A recursive $ref beside other keywords is not inlined.
  if (Find(merged, "$ref")) {
    Keywords rest;
    for (auto& kv : merged)
      if (kv.first != "$ref" && !kAnnotations.count(kv.first) && kv.first.substr(0, 2) != "x-")
        rest.push_back(kv);
    if (!rest.empty()) {
      Relaxed("$ref", ptr, "a recursive reference beside other keywords is not merged with them",
              "the other keywords dropped");
      for (auto& kv : rest) Erase(merged, kv.first);
    }
  }
  // anyOf / oneOf beside other keywords: each alternative gets the rest.
  for (const char* kw : {"anyOf", "oneOf"}) {
    const std::string* alts_text = Find(merged, kw);
    if (!alts_text) continue;
    Keywords rest;
    Keywords annotations;
    for (auto& kv : merged) {
      if (kv.first == kw) continue;
      if (kAnnotations.count(kv.first) || kv.first.substr(0, 2) == "x-")
        annotations.push_back(kv);
      else
        rest.push_back(kv);
    }
    if (rest.empty()) break;
    element alts = Own(*alts_text, ptr);
    if (alts.type() != element_type::ARRAY) Corrupt(ptr + "/" + kw, "must be an array");
    const std::string rest_text = TextOf(rest);
    std::string list = "[";
    for (element x : simdjson::dom::array(alts)) {
      std::string t;
      AppendCompact(t, x);
      if (list.size() > 1) list += ',';
      list += AllOfText(rest_text, t);
    }
    list += "]";
    annotations.emplace_back(kw, list);
    merged = std::move(annotations);
    break;
  }
  return Own(TextOf(merged), ptr);
}

Compiler::Keywords Compiler::MergeTwo(Keywords a, Keywords b, const std::string& ptr) {
  if (a.empty()) return b;
  auto conflict = [&](const std::string& kw, const std::string& why) {
    Relaxed("allOf", ptr, "'" + kw + "' in two merged schemas: " + why, "the first one kept");
  };
  // Object keywords go together: a key's value meets both schemas' property
  // (or additionalProperties) schema.
  const bool pa = Find(a, "patternProperties") != nullptr,
             pb = Find(b, "patternProperties") != nullptr;
  const bool props_a = Find(a, "properties") || Find(a, "additionalProperties");
  const bool props_b = Find(b, "properties") || Find(b, "additionalProperties");
  if (props_a && props_b && (pa || pb)) {
    conflict("patternProperties", "not merged with the other schema's properties");
  } else if (props_a && props_b) {
    Keywords pa_k, pb_k;
    if (const std::string* t = Find(a, "properties")) pa_k = KeywordsOf(object(Own(*t, ptr)));
    if (const std::string* t = Find(b, "properties")) pb_k = KeywordsOf(object(Own(*t, ptr)));
    const std::string* add_a = Find(a, "additionalProperties");
    const std::string* add_b = Find(b, "additionalProperties");
    Keywords props;
    for (auto& [key, sa] : pa_k) {
      const std::string* sb = Find(pb_k, key);
      props.emplace_back(key, AllOfText(sa, sb ? *sb : add_b ? *add_b : "true"));
    }
    for (auto& [key, sb] : pb_k)
      if (!Find(pa_k, key)) props.emplace_back(key, AllOfText(add_a ? *add_a : "true", sb));
    if (!props.empty()) Set(a, "properties", TextOf(props));
    if (add_a || add_b)
      Set(a, "additionalProperties", AllOfText(add_a ? *add_a : "true", add_b ? *add_b : "true"));
    Erase(b, "properties");
    Erase(b, "additionalProperties");
  }
  std::vector<std::string> patterns;
  for (auto& [key, tb] : b) {
    const std::string* ta = Find(a, key);
    if (!ta) {
      a.emplace_back(key, tb);
      continue;
    }
    if (*ta == tb || kAnnotations.count(key) || key.substr(0, 2) == "x-") continue;
    if (key == "type") {
      element x = Own(*ta, ptr), y = Own(tb, ptr);
      auto list = [](element v) {
        std::vector<std::string> out;
        if (v.type() == element_type::STRING) out.emplace_back(std::string_view(v));
        if (v.type() == element_type::ARRAY)
          for (element t : simdjson::dom::array(v))
            if (t.type() == element_type::STRING) out.emplace_back(std::string_view(t));
        return out;
      };
      std::vector<std::string> xa = list(x), yb = list(y), both;
      auto has = [](const std::vector<std::string>& v, const std::string& t) {
        return std::find(v.begin(), v.end(), t) != v.end();
      };
      for (auto& t : xa) {
        if (has(yb, t))
          both.push_back(t);
        else if (t == "integer" && has(yb, "number"))
          both.push_back(t);
        else if (t == "number" && has(yb, "integer"))
          both.push_back("integer");
      }
      std::string text = "[";
      for (auto& t : both) {
        if (text.size() > 1) text += ',';
        AppendJsonString(text, t, InvalidUtf8::kPassThrough);
      }
      Set(a, "type", text + "]");
    } else if (key == "required") {
      element x = Own(*ta, ptr), y = Own(tb, ptr);
      std::vector<std::string> all;
      for (element v : {x, y})
        if (v.type() == element_type::ARRAY)
          for (element r : simdjson::dom::array(v))
            if (r.type() == element_type::STRING &&
                std::find(all.begin(), all.end(), std::string_view(r)) == all.end())
              all.emplace_back(std::string_view(r));
      std::string text = "[";
      for (auto& r : all) {
        if (text.size() > 1) text += ',';
        AppendJsonString(text, r, InvalidUtf8::kPassThrough);
      }
      Set(a, "required", text + "]");
    } else if (key == "minimum" || key == "exclusiveMinimum" || key == "minLength" ||
               key == "minItems" || key == "minProperties") {
      if (NumberOfText(tb) > NumberOfText(*ta)) Set(a, key, tb);
    } else if (key == "maximum" || key == "exclusiveMaximum" || key == "maxLength" ||
               key == "maxItems" || key == "maxProperties") {
      if (NumberOfText(tb) < NumberOfText(*ta)) Set(a, key, tb);
    } else if (key == "uniqueItems") {
      Set(a, key, "true");
    } else if (key == "pattern") {
      patterns.push_back(tb);
    } else if (key == "items" || key == "propertyNames" || key == "additionalItems") {
      Set(a, key, AllOfText(*ta, tb));
    } else if (key == "enum" || key == "const") {
      // enum: the values in both; const: two different ones leave none.
      std::string text = "[";
      if (key == "enum") {
        element x = Own(*ta, ptr), y = Own(tb, ptr);
        std::vector<std::string> ys;
        if (y.type() == element_type::ARRAY)
          for (element v : simdjson::dom::array(y)) {
            std::string t;
            AppendCompact(t, v);
            ys.push_back(std::move(t));
          }
        if (x.type() == element_type::ARRAY)
          for (element v : simdjson::dom::array(x)) {
            std::string t;
            AppendCompact(t, v);
            if (std::find(ys.begin(), ys.end(), t) == ys.end()) continue;
            if (text.size() > 1) text += ',';
            text += t;
          }
      }
      Erase(a, key);
      Set(a, "enum", text + "]");
    } else if (key == "format") {
      // Validators do not assert format by default; the first is enforced.
    } else {
      conflict(key, "no exact merge");
    }
  }
  if (!patterns.empty()) {
    // a's allOf, if any, is the pattern list of an earlier merge (members are flattened).
    const std::string* earlier = Find(a, "allOf");
    std::string list = earlier ? earlier->substr(0, earlier->size() - 1) + "," : "[";
    list += "{\"pattern\":" + *Find(a, "pattern") + "}";
    for (auto& p : patterns) list += ",{\"pattern\":" + p + "}";
    Erase(a, "pattern");
    Set(a, "allOf", list + "]");
  }
  return a;
}

}  // namespace k3::constrain
