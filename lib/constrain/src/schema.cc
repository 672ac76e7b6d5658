// JSON Schema -> byte-automaton nodes (schema_internal.h). Every keyword is
// either compiled, ignored as an annotation, or refused with kUnsupported naming
// the keyword and its JSON pointer: a request is never silently unconstrained.
#include <simdjson.h>

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "k3/core/error.h"
#include "k3/core/json_writer.h"
#include "matcher.h"
#include "schema_internal.h"

namespace k3::constrain {
namespace {

using simdjson::dom::element;
using simdjson::dom::element_type;
using simdjson::dom::object;

// Keywords that only describe (JSON Schema annotations) or that validators do
// not assert by default (format): accepted and ignored.
const std::set<std::string_view> kAnnotations = {
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "$anchor",
    "deprecated", "readOnly", "writeOnly", "format", "contentEncoding", "contentMediaType",
    "$defs", "definitions", "nullable", "discriminator", "example",
};
// Keywords that constrain and are compiled here, grouped by the type they apply to.
const std::set<std::string_view> kObjectWords = {"properties", "required", "additionalProperties",
                                                 "minProperties", "maxProperties"};
const std::set<std::string_view> kArrayWords = {"items", "minItems", "maxItems", "uniqueItems"};
const std::set<std::string_view> kStringWords = {"minLength", "maxLength", "pattern"};
const std::set<std::string_view> kNumberWords = {"minimum", "maximum", "exclusiveMinimum",
                                                 "exclusiveMaximum"};
const std::set<std::string_view> kOtherWords = {"type", "enum", "const", "anyOf", "oneOf", "allOf",
                                                "$ref"};

std::string PointerEscape(std::string_view token) {
  std::string out;
  for (char c : token) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
}

std::string PointerUnescape(std::string_view token) {
  std::string out;
  for (size_t i = 0; i < token.size(); ++i) {
    if (token[i] == '~' && i + 1 < token.size() && (token[i + 1] == '0' || token[i + 1] == '1')) {
      out += token[i + 1] == '0' ? '~' : '/';
      ++i;
    } else {
      out += token[i];
    }
  }
  return out;
}

std::string Where(const std::string& ptr) { return ptr.empty() ? "/" : ptr; }

[[noreturn]] void Unsupported(const std::string& keyword, const std::string& ptr, const std::string& why) {
  throw Error(ErrorCode::kUnsupported, "schema keyword '" + keyword + "' at " + Where(ptr) + ": " + why,
              {}, Error::kNoOffset, keyword);
}
[[noreturn]] void Corrupt(const std::string& ptr, const std::string& why) {
  throw Error(ErrorCode::kCorrupt, "schema at " + Where(ptr) + ": " + why);
}
[[noreturn]] void Unsatisfiable(const std::string& ptr, const std::string& why) {
  throw Error(ErrorCode::kInvalidArgument, "schema at " + Where(ptr) + " can match nothing: " + why);
}

// JSON text of a value (enum/const literals): keys in document order, strings
// with the minimal escapes, numbers in the shortest round-trip form; compact, or
// with Python json.dumps's ", " and ": " separators.
void AppendValue(std::string& out, element e, bool python) {
  switch (e.type()) {
    case element_type::OBJECT: {
      out += '{';
      bool first = true;
      for (auto field : object(e)) {
        if (!first) out += python ? ", " : ",";
        first = false;
        AppendJsonString(out, field.key, InvalidUtf8::kPassThrough);
        out += python ? ": " : ":";
        AppendValue(out, field.value, python);
      }
      out += '}';
      break;
    }
    case element_type::ARRAY: {
      out += '[';
      bool first = true;
      for (element v : simdjson::dom::array(e)) {
        if (!first) out += python ? ", " : ",";
        first = false;
        AppendValue(out, v, python);
      }
      out += ']';
      break;
    }
    case element_type::STRING:
      AppendJsonString(out, std::string_view(e), InvalidUtf8::kPassThrough);
      break;
    case element_type::INT64: out += std::to_string(int64_t(e)); break;
    case element_type::UINT64: out += std::to_string(uint64_t(e)); break;
    case element_type::DOUBLE: {
      char buf[64];
      auto r = std::to_chars(buf, buf + sizeof buf, double(e));
      out.append(buf, r.ptr);
      break;
    }
    case element_type::BOOL: out += bool(e) ? "true" : "false"; break;
    case element_type::NULL_VALUE: out += "null"; break;
  }
}
void AppendCompact(std::string& out, element e) { AppendValue(out, e, false); }

// Which JSON type a compact literal text has ("integer" counts as "number" too).
bool LiteralHasType(const std::string& lit, std::string_view type) {
  char c = lit[0];
  if (type == "object") return c == '{';
  if (type == "array") return c == '[';
  if (type == "string") return c == '"';
  if (type == "boolean") return c == 't' || c == 'f';
  if (type == "null") return c == 'n';
  bool is_number = c == '-' || (c >= '0' && c <= '9');
  if (type == "number") return is_number;
  if (type == "integer") {
    if (!is_number) return false;
    double v = std::strtod(lit.c_str(), nullptr);
    return std::isfinite(v) && v == std::floor(v);
  }
  return false;
}

// Thrown where a recursive $ref would nest deeper than the unrolling allows:
// that copy of the reference is the schema false. Caught where false is
// harmless (an optional property, an anyOf alternative, array items with no
// minItems, additionalProperties); elsewhere it climbs to the next such place,
// and at the root it is kInvalidArgument (no finite value within the bound).
struct RecursionCut {};

class Compiler {
 public:
  // max_recursion: how many times a recursive $ref may be expanded inside itself.
  Compiler(element root, int max_recursion) : root_(root), max_recursion_(max_recursion) {}

  uint32_t CompileRoot() {
    // The root is the target of "#": a "#" inside it is a re-entry.
    if (Cyclic("#")) ++active_["#"];
    try {
      return Compile(root_, "", 0);
    } catch (const RecursionCut&) {
      Unsatisfiable("", "every value needs the recursive reference '" + cut_ref_ + "' nested inside itself more than " +
                            std::to_string(max_recursion_) + " times, the most k3 unrolls");
    }
  }
  std::vector<SchemaNode> TakeNodes() { return std::move(nodes_); }
  // A recursive $ref was unrolled (a smaller bound may fit the node cap).
  bool recursed() const { return recursed_; }

  uint32_t Add(SchemaNode n) {
    if (nodes_.size() >= size_t(kMaxNodes))
      throw Error(ErrorCode::kUnsupported, "schema compiles to more than " + std::to_string(kMaxNodes) + " nodes", {},
                  Error::kNoOffset, "schema");
    nodes_.push_back(std::move(n));
    return uint32_t(nodes_.size() - 1);
  }

  // Nodes of "any JSON value", created once.
  uint32_t AnyNode() {
    if (any_ >= 0) return uint32_t(any_);
    SchemaNode u;
    u.kind = NodeKind::kUnion;
    any_ = int32_t(Add(std::move(u)));  // reserved first: the object and array refer to it
    SchemaNode obj;
    obj.kind = NodeKind::kObject;
    obj.map_value = any_;
    obj.key_node = StringNode(0, kUnbounded);
    uint32_t o = Add(std::move(obj));
    SchemaNode arr;
    arr.kind = NodeKind::kArray;
    arr.items = uint32_t(any_);
    uint32_t a = Add(std::move(arr));
    SchemaNode num;
    num.kind = NodeKind::kNumber;
    uint32_t n = Add(std::move(num));
    uint32_t s = StringNode(0, kUnbounded);
    uint32_t l = LiteralNode({"true", "false", "null"}, "", "");
    std::vector<uint32_t> alts = {o, a, s, n, l};
    for (uint32_t x : alts) SetFirst(x);
    FillUnion(uint32_t(any_), alts, "", "anyOf");
    return uint32_t(any_);
  }

  uint32_t StringNode(uint32_t min_len, uint32_t max_len) {
    SchemaNode s;
    s.kind = NodeKind::kString;
    s.min_len = min_len;
    s.max_len = max_len;
    s.first['"'] = true;
    return Add(std::move(s));
  }

  uint32_t LiteralNode(std::vector<std::string> lits, const std::string& ptr, const std::string& kw,
                       const char* why_empty = "has the schema's type") {
    if (lits.empty()) Unsatisfiable(ptr, "no value of '" + kw + "' " + why_empty);
    if (lits.size() > size_t(kMaxLiterals))
      Unsupported(kw, ptr, "more than " + std::to_string(kMaxLiterals) + " values");
    // Duplicates would make two candidates complete at once; keep one.
    std::vector<std::string> uniq;
    for (auto& l : lits)
      if (std::find(uniq.begin(), uniq.end(), l) == uniq.end()) uniq.push_back(l);
    SchemaNode n;
    n.kind = NodeKind::kLiterals;
    n.literals = std::move(uniq);
    n.raw_ok = true;
    for (auto& l : n.literals) {
      n.first[uint8_t(l[0])] = true;
      // The other spellings, from the compact text (valid JSON by construction).
      simdjson::padded_string padded(l);
      element v;
      if (literal_parser_.parse(padded).get(v) != simdjson::SUCCESS)
        throw Error(ErrorCode::kInternal, "literal does not parse: " + l);
      std::string py;
      AppendValue(py, v, true);
      n.literals_py.push_back(std::move(py));
      if (v.type() == element_type::STRING) {
        n.literals_raw.emplace_back(std::string_view(v));
      } else {
        n.literals_raw.emplace_back();
        n.raw_ok = false;
      }
    }
    return Add(std::move(n));
  }

  void SetFirst(uint32_t idx) {
    SchemaNode& n = nodes_[idx];
    switch (n.kind) {
      case NodeKind::kObject: n.first['{'] = true; break;
      case NodeKind::kArray: n.first['['] = true; break;
      case NodeKind::kString: n.first['"'] = true; break;
      case NodeKind::kNumber:
        n.first['-'] = true;
        for (char c = '0'; c <= '9'; ++c) n.first[uint8_t(c)] = true;
        break;
      default: break;  // literals and unions fill their own
    }
  }

  // oneOf needs exactly one alternative to match. Alternatives that start with
  // different bytes cannot both match; two object alternatives cannot either
  // when both require a key whose values are disjoint literal sets (a
  // discriminator). Anything else could produce a text matching two: refused.
  void CheckDisjoint(const std::vector<uint32_t>& alts, const std::string& ptr) {
    auto overlap = [&](const SchemaNode& a, const SchemaNode& b) {
      for (int i = 0; i < 256; ++i)
        if (a.first[i] && b.first[i]) return true;
      return false;
    };
    auto disjoint_literals = [&](const SchemaNode& a, const SchemaNode& b) {
      for (auto& la : a.literals)
        for (auto& lb : b.literals)
          if (la == lb) return false;
      return true;
    };
    auto discriminated = [&](const SchemaNode& a, const SchemaNode& b) {
      if (a.kind == NodeKind::kLiterals && b.kind == NodeKind::kLiterals) return disjoint_literals(a, b);
      if (a.kind != NodeKind::kObject || b.kind != NodeKind::kObject) return false;
      for (const Property& pa : a.props) {
        if (!pa.required || nodes_[pa.child].kind != NodeKind::kLiterals) continue;
        for (const Property& pb : b.props) {
          if (pb.key != pa.key || !pb.required || nodes_[pb.child].kind != NodeKind::kLiterals) continue;
          if (disjoint_literals(nodes_[pa.child], nodes_[pb.child])) return true;
        }
      }
      return false;
    };
    for (size_t i = 0; i < alts.size(); ++i)
      for (size_t j = i + 1; j < alts.size(); ++j) {
        const SchemaNode &a = nodes_[alts[i]], &b = nodes_[alts[j]];
        if (overlap(a, b) && !discriminated(a, b))
          Unsupported("oneOf", ptr, "alternatives " + std::to_string(i) + " and " + std::to_string(j) +
                                        " could both match (they start alike and no required key with "
                                        "distinct const/enum values tells them apart); anyOf is supported");
      }
  }

  // Fills union node `u` from alternatives: nested unions are flattened and
  // literal alternatives merge into one literal set. The matcher follows every
  // alternative a byte allows in parallel, so alternatives may overlap.
  void FillUnion(uint32_t u, const std::vector<uint32_t>& alts_in, const std::string& ptr,
                 const std::string& kw) {
    std::vector<uint32_t> flat, alts;
    for (uint32_t a : alts_in) {
      if (nodes_[a].kind == NodeKind::kUnion) flat.insert(flat.end(), nodes_[a].alts.begin(), nodes_[a].alts.end());
      else flat.push_back(a);
    }
    std::vector<std::string> lits;
    bool any_lits = false;
    for (uint32_t a : flat) {
      if (nodes_[a].kind == NodeKind::kLiterals) {
        any_lits = true;
        for (auto& l : nodes_[a].literals) lits.push_back(l);
      } else if (std::find(alts.begin(), alts.end(), a) == alts.end()) {
        alts.push_back(a);
      }
    }
    if (any_lits) alts.push_back(LiteralNode(lits, ptr, kw));
    if (alts.size() > size_t(kMaxAlternatives))
      Unsupported(kw, ptr, "more than " + std::to_string(kMaxAlternatives) + " alternatives");
    SchemaNode& un = nodes_[u];
    un.kind = NodeKind::kUnion;
    un.alts = alts;
    un.first.fill(false);
    for (uint32_t a : alts)
      for (int b = 0; b < 256; ++b) un.first[b] = un.first[b] || nodes_[a].first[b];
  }

  // skip_literals: compile as if enum and const were absent (the filter of
  // their values by the other keywords).
  uint32_t Compile(element e, const std::string& ptr, int depth, bool skip_literals = false) {
    if (depth >= kMaxDepth)
      throw Error(ErrorCode::kUnsupported, "schema at " + Where(ptr) + " nests deeper than " + std::to_string(kMaxDepth),
                  {}, Error::kNoOffset, "schema");
    if (e.type() == element_type::BOOL) {
      if (bool(e)) return AnyNode();
      Unsatisfiable(ptr, "the schema is false");
    }
    if (e.type() != element_type::OBJECT) Corrupt(ptr, "a schema must be an object or a boolean");
    object o(e);

    // Sort the keywords: refuse what is not supported, note what constrains.
    std::set<std::string> constraints;
    for (auto field : o) {
      std::string_view k = field.key;
      if (kAnnotations.count(k) || k.substr(0, 2) == "x-") continue;
      if (skip_literals && (k == "enum" || k == "const")) continue;
      if (kObjectWords.count(k) || kArrayWords.count(k) || kStringWords.count(k) ||
          kNumberWords.count(k) || kOtherWords.count(k)) {
        constraints.insert(std::string(k));
        continue;
      }
      static const std::map<std::string_view, std::string_view> kWhy = {
          {"patternProperties", "regular expressions are not compiled into the automaton"},
          {"propertyNames", "key schemas are not supported"},
          {"multipleOf", "divisibility is not expressible per byte"},
          {"not", "negation is not supported"},
          {"if", "conditionals are not supported"},
          {"then", "conditionals are not supported"},
          {"else", "conditionals are not supported"},
          {"prefixItems", "tuples are not supported"},
          {"additionalItems", "tuples are not supported"},
          {"contains", "array 'contains' is not supported"},
          {"minContains", "array 'contains' is not supported"},
          {"maxContains", "array 'contains' is not supported"},
          {"dependentRequired", "dependencies are not supported"},
          {"dependentSchemas", "dependencies are not supported"},
          {"dependencies", "dependencies are not supported"},
          {"unevaluatedProperties", "unevaluated* is not supported"},
          {"unevaluatedItems", "unevaluated* is not supported"},
          {"$dynamicRef", "dynamic references are not supported"},
          {"$recursiveRef", "recursive references are not supported"},
      };
      auto it = kWhy.find(k);
      Unsupported(std::string(k), ptr, it != kWhy.end() ? std::string(it->second) : "unknown keyword");
    }

    if (constraints.count("uniqueItems")) {
      element v = o["uniqueItems"];
      if (v.type() != element_type::BOOL) Corrupt(ptr + "/uniqueItems", "must be a boolean");
      if (!bool(v)) constraints.erase("uniqueItems");  // true: compiled with the array below
    }

    auto only = [&](const std::string& kw) {
      for (auto& c : constraints)
        if (c != kw) Unsupported(c, ptr, "'" + c + "' together with '" + kw + "' is not supported");
    };

    if (constraints.count("enum") || constraints.count("const")) {
      std::vector<std::string> lits;  // compact texts
      std::string kw = constraints.count("enum") ? "enum" : "const";
      if (constraints.count("enum")) {
        element v = o["enum"];
        if (v.type() != element_type::ARRAY) Corrupt(ptr + "/enum", "must be an array");
        for (element x : simdjson::dom::array(v)) {
          std::string text;
          AppendCompact(text, x);
          lits.push_back(std::move(text));
        }
      }
      if (constraints.count("const")) {
        std::string text;
        element cv = o["const"];
        AppendCompact(text, cv);
        // With both, the value must be the const and in the enum.
        bool in_enum = !constraints.count("enum") || std::find(lits.begin(), lits.end(), text) != lits.end();
        lits.clear();
        if (in_enum) lits.push_back(std::move(text));
      }
      bool others = false;
      for (auto& c : constraints) others = others || (c != "enum" && c != "const" && c != "type");
      if (!others) {
        std::vector<std::string> types = TypeList(o, ptr);
        std::erase_if(lits, [&](const std::string& l) {
          bool ok = types.empty();
          for (auto& t : types) ok = ok || LiteralHasType(l, t);
          return !ok;
        });
        return LiteralNode(std::move(lits), ptr, kw);
      }
      // Other keywords too (bounds, lengths, a $ref, ...): compile the schema
      // without enum/const and keep the values its automaton accepts, so each
      // output validates against every keyword (a value the automaton would
      // not spell, e.g. 1e-07 under bounds, is dropped: that only narrows).
      uint32_t rest = Compile(e, ptr, depth, true);
      std::erase_if(lits, [&](const std::string& l) { return !AcceptsText(rest, l); });
      return LiteralNode(std::move(lits), ptr, kw, "satisfies the schema's other keywords");
    }

    if (constraints.count("$ref")) {
      only("$ref");
      element v = o["$ref"];
      if (v.type() != element_type::STRING) Corrupt(ptr + "/$ref", "must be a string");
      return CompileRef(std::string(std::string_view(v)), ptr, depth);
    }
    if (constraints.count("allOf")) {
      only("allOf");
      element v = o["allOf"];
      if (v.type() != element_type::ARRAY) Corrupt(ptr + "/allOf", "must be an array");
      simdjson::dom::array arr(v);
      if (arr.size() != 1) Unsupported("allOf", ptr, "only a single-schema allOf is supported");
      return Compile(arr.at(0), ptr + "/allOf/0", depth + 1);
    }
    if (constraints.count("anyOf") || constraints.count("oneOf")) {
      std::string kw = constraints.count("anyOf") ? "anyOf" : "oneOf";
      only(kw);
      element v = o[kw];
      if (v.type() != element_type::ARRAY) Corrupt(ptr + "/" + kw, "must be an array");
      simdjson::dom::array arr(v);
      if (arr.size() == 0) Corrupt(ptr + "/" + kw, "must not be empty");
      uint32_t u = Add(SchemaNode{});
      std::vector<uint32_t> alts;
      bool cut = false;
      size_t i = 0;
      for (element x : arr) {
        std::string p = ptr + "/" + kw + "/" + std::to_string(i++);
        if (x.type() == element_type::BOOL && !bool(x)) continue;  // false adds nothing
        try {
          alts.push_back(Compile(x, p, depth + 1));
        } catch (const RecursionCut&) {
          cut = true;  // a recursion's deepest copy: this alternative is false
        }
      }
      if (alts.empty() && cut) throw RecursionCut{};
      if (alts.empty()) Unsatisfiable(ptr, "every alternative is false");
      // oneOf is compiled as anyOf: an output may match several alternatives
      // (refused by a validator for oneOf) only when they overlap.
      if (kw == "oneOf") CheckDisjoint(alts, ptr);
      FillUnion(u, alts, ptr, kw);
      return u;
    }

    std::vector<std::string> types = TypeList(o, ptr);
    if (types.empty()) {
      // No type: the type-specific keywords present say which one (JSON Schema
      // would accept other types too; generating only this one still validates).
      auto has_any = [&](const std::set<std::string_view>& words) {
        for (auto& c : constraints)
          if (words.count(c)) return true;
        return false;
      };
      if (has_any(kObjectWords)) types.push_back("object");
      if (has_any(kArrayWords)) types.push_back("array");
      if (has_any(kStringWords)) types.push_back("string");
      if (has_any(kNumberWords)) types.push_back("number");
      if (types.size() > 1)
        Unsupported(*constraints.begin(), ptr, "keywords of several types without 'type'");
      if (types.empty()) return AnyNode();
    }
    if (types.size() == 1) return CompileTyped(o, types[0], ptr, depth);
    uint32_t u = Add(SchemaNode{});
    std::vector<uint32_t> alts;
    for (auto& t : types) {
      try {
        alts.push_back(CompileTyped(o, t, ptr, depth));
      } catch (const RecursionCut&) {
        // this type needs the recursion's deepest copy; the others remain
      }
    }
    if (alts.empty()) throw RecursionCut{};
    FillUnion(u, alts, ptr, "type");
    return u;
  }

  std::vector<std::string> TypeList(object o, const std::string& ptr) {
    std::vector<std::string> types;
    element t;
    if (o["type"].get(t) != simdjson::SUCCESS) return types;
    static const std::set<std::string_view> kTypes = {"object", "array", "string", "number",
                                                      "integer", "boolean", "null"};
    auto add = [&](element x) {
      if (x.type() != element_type::STRING) Corrupt(ptr + "/type", "must be a string or an array of strings");
      std::string_view s(x);
      if (!kTypes.count(s)) Corrupt(ptr + "/type", "unknown type '" + std::string(s) + "'");
      if (std::find(types.begin(), types.end(), s) == types.end()) types.emplace_back(s);
    };
    if (t.type() == element_type::ARRAY) {
      for (element x : simdjson::dom::array(t)) add(x);
      if (types.empty()) Unsatisfiable(ptr, "'type' is an empty list");
    } else {
      add(t);
    }
    // integer is a subset of number: a list with both generates numbers.
    if (std::find(types.begin(), types.end(), "number") != types.end())
      std::erase(types, std::string("integer"));
    return types;
  }

  static uint32_t Count(object o, const char* key, const std::string& ptr, uint32_t dflt) {
    element v;
    if (o[key].get(v) != simdjson::SUCCESS) return dflt;
    double d;
    if (v.type() == element_type::INT64) d = double(int64_t(v));
    else if (v.type() == element_type::UINT64) d = double(uint64_t(v));
    else if (v.type() == element_type::DOUBLE) d = double(v);
    else Corrupt(ptr + "/" + key, "must be a non-negative integer");
    if (d < 0 || d != std::floor(d)) Corrupt(ptr + "/" + key, "must be a non-negative integer");
    return d >= double(kUnbounded) ? kUnbounded - 1 : uint32_t(d);
  }

  static bool Number(object o, const char* key, const std::string& ptr, double& out) {
    element v;
    if (o[key].get(v) != simdjson::SUCCESS) return false;
    if (v.type() == element_type::INT64) out = double(int64_t(v));
    else if (v.type() == element_type::UINT64) out = double(uint64_t(v));
    else if (v.type() == element_type::DOUBLE) out = double(v);
    else if (v.type() == element_type::BOOL)
      Unsupported(key, ptr, "the draft-4 boolean form is not supported (use a number)");
    else Corrupt(ptr + "/" + key, "must be a number");
    return true;
  }

  uint32_t CompileTyped(object o, const std::string& type, const std::string& ptr, int depth) {
    if (type == "boolean") return LiteralNode({"true", "false"}, ptr, "type");
    if (type == "null") return LiteralNode({"null"}, ptr, "type");
    if (type == "string") {
      uint32_t mn = Count(o, "minLength", ptr, 0), mx = Count(o, "maxLength", ptr, kUnbounded);
      if (mn > mx) Unsatisfiable(ptr, "minLength > maxLength");
      uint32_t idx = StringNode(mn, mx);
      element pat;
      if (o["pattern"].get(pat) == simdjson::SUCCESS) {
        if (pat.type() != element_type::STRING) Corrupt(ptr + "/pattern", "must be a string");
        std::shared_ptr<const PatternDfa> dfa;
        try {
          dfa = CompilePattern(std::string_view(pat), mn, mx);
        } catch (const PatternRefused& r) {
          Unsupported("pattern", ptr, r.why);
        }
        if (!dfa->Viable(0, 0))
          Unsatisfiable(ptr, "no string matches 'pattern' within minLength/maxLength");
        nodes_[idx].pattern = std::move(dfa);
      }
      return idx;
    }
    if (type == "number" || type == "integer") return CompileNumber(o, type == "integer", ptr);
    if (type == "array") {
      SchemaNode n;
      n.kind = NodeKind::kArray;
      n.min_items = Count(o, "minItems", ptr, 0);
      n.max_items = Count(o, "maxItems", ptr, kUnbounded);
      if (n.min_items > n.max_items) Unsatisfiable(ptr, "minItems > maxItems");
      element items;
      bool has_items = o["items"].get(items) == simdjson::SUCCESS;
      if (has_items && items.type() == element_type::ARRAY)
        Unsupported("items", ptr, "items as an array (a tuple) is not supported");
      if (has_items && items.type() == element_type::BOOL && !bool(items)) {
        if (n.min_items > 0) Unsatisfiable(ptr, "items is false but minItems > 0");
        n.max_items = 0;
        n.items = AnyNode();
      } else if (has_items) {
        try {
          n.items = Compile(items, ptr + "/items", depth + 1);
        } catch (const RecursionCut&) {
          if (n.min_items > 0) throw;  // an item is needed
          n.max_items = 0;             // a recursion's deepest copy: only []
          n.items = AnyNode();
        }
      } else {
        n.items = AnyNode();
      }
      element uniq;
      if (o["uniqueItems"].get(uniq) == simdjson::SUCCESS && uniq.type() == element_type::BOOL && bool(uniq)) {
        // Enforced for enum/const items: the array remembers which values it
        // used. Object values are refused: two key orders are one value.
        const SchemaNode& it = nodes_[n.items];
        if (it.kind != NodeKind::kLiterals)
          Unsupported("uniqueItems", ptr, "enforced only when items is an enum or const");
        for (const std::string& l : it.literals)
          if (l.find('{') != std::string::npos)
            Unsupported("uniqueItems", ptr, "enforced only for enum values that contain no objects");
        if (n.min_items > it.literals.size()) Unsatisfiable(ptr, "minItems exceeds the distinct values of items");
        n.unique = true;
      }
      uint32_t idx = Add(std::move(n));
      SetFirst(idx);
      return idx;
    }
    // object
    SchemaNode n;
    n.kind = NodeKind::kObject;
    element props_el, req_el, add_el;
    std::vector<std::pair<std::string, element>> props;  // raw key, schema
    std::vector<std::string> props_ptr;
    if (o["properties"].get(props_el) == simdjson::SUCCESS) {
      if (props_el.type() != element_type::OBJECT) Corrupt(ptr + "/properties", "must be an object");
      for (auto f : object(props_el)) props.emplace_back(std::string(f.key), f.value);
    }
    std::vector<std::string> required;
    if (o["required"].get(req_el) == simdjson::SUCCESS) {
      if (req_el.type() != element_type::ARRAY) Corrupt(ptr + "/required", "must be an array of strings");
      for (element r : simdjson::dom::array(req_el)) {
        if (r.type() != element_type::STRING) Corrupt(ptr + "/required", "must be an array of strings");
        required.emplace_back(std::string_view(r));
      }
    }
    bool has_add = o["additionalProperties"].get(add_el) == simdjson::SUCCESS;
    bool add_false = has_add && add_el.type() == element_type::BOOL && !bool(add_el);
    bool add_schema = has_add && add_el.type() == element_type::OBJECT;
    if (has_add && !add_false && !add_schema && add_el.type() != element_type::BOOL)
      Corrupt(ptr + "/additionalProperties", "must be a boolean or a schema");

    auto is_required = [&](const std::string& k) {
      return std::find(required.begin(), required.end(), k) != required.end();
    };
    // The additionalProperties schema, compiled once (its node is shared);
    // kNoNode when it is a recursion's deepest copy (then it acts as false).
    int32_t add_node = kNoNode;
    bool add_cut = false;
    auto additional = [&]() -> int32_t {
      if (!add_schema) return int32_t(AnyNode());
      if (add_node == kNoNode && !add_cut) {
        try {
          add_node = int32_t(Compile(add_el, ptr + "/additionalProperties", depth + 1));
        } catch (const RecursionCut&) {
          add_cut = true;
        }
      }
      return add_node;
    };
    std::vector<std::string> reserved;  // every key of properties, as generated
    for (auto& [key, schema] : props) {
      std::string p = ptr + "/properties/" + PointerEscape(key);
      reserved.push_back(KeyBytes(key));
      if (schema.type() == element_type::BOOL && !bool(schema)) {
        if (is_required(key)) Unsatisfiable(p, "a required property has the schema false");
        continue;  // the property may never appear
      }
      Property pr;
      pr.key = KeyBytes(key);
      pr.required = is_required(key);
      try {
        pr.child = Compile(schema, p, depth + 1);
      } catch (const RecursionCut&) {
        if (pr.required) throw;
        continue;  // a recursion's deepest copy: the optional property is not offered
      }
      n.props.push_back(std::move(pr));
    }
    for (auto& r : required) {
      bool declared = std::any_of(props.begin(), props.end(), [&](auto& kv) { return kv.first == r; });
      if (declared) continue;
      if (add_false) Unsatisfiable(ptr, "required '" + r + "' is not in properties and additionalProperties is false");
      Property pr;
      pr.key = KeyBytes(r);
      int32_t child = additional();
      if (child == kNoNode) throw RecursionCut{};
      pr.child = uint32_t(child);
      pr.required = true;
      reserved.push_back(pr.key);
      n.props.push_back(std::move(pr));
    }
    if (n.props.size() > size_t(kMaxProperties))
      Unsupported("properties", ptr, "more than " + std::to_string(kMaxProperties) + " properties");
    for (size_t i = 0; i < n.props.size(); ++i)
      if (n.props[i].required) n.required_mask |= uint64_t{1} << i;
    // Free keys, with values of additionalProperties (any value when absent or
    // true): when it is a schema, or when nothing is declared. Declared
    // properties with additionalProperties absent or true generate only the
    // declared keys. Free keys never equal a key of properties.
    if (!add_false && (add_schema || n.props.empty())) {
      int32_t v = additional();
      if (v != kNoNode) {
        n.map_value = v;
        n.key_node = StringNode(0, kUnbounded);
      }
    }
    if (n.map_value >= 0 && !reserved.empty()) {
      if (reserved.size() > size_t(kMaxProperties))
        Unsupported("properties", ptr, "more than " + std::to_string(kMaxProperties) +
                                           " properties beside additionalProperties");
      n.reserved = std::move(reserved);
    }
    n.min_props = Count(o, "minProperties", ptr, 0);
    n.max_props = Count(o, "maxProperties", ptr, kUnbounded);
    if (n.min_props > n.max_props) Unsatisfiable(ptr, "minProperties > maxProperties");
    if (size_t(std::popcount(n.required_mask)) > n.max_props) Unsatisfiable(ptr, "more required properties than maxProperties");
    // minProperties counts distinct keys. Free keys may repeat, and a parser
    // keeps one of each: only one free key can be promised.
    if (n.min_props > n.props.size() + (n.map_value >= 0 ? 1 : 0)) {
      if (n.map_value >= 0)
        Unsupported("minProperties", ptr, "counts at most one free key (free keys may repeat): above the declared "
                                          "properties + 1 it is not supported");
      if (add_cut) throw RecursionCut{};
      Unsatisfiable(ptr, "minProperties exceeds the properties that may appear");
    }
    uint32_t idx = Add(std::move(n));
    SetFirst(idx);
    if (!nodes_[idx].reserved.empty()) nodes_[nodes_[idx].key_node].key_of = int32_t(idx);
    return idx;
  }

  static std::string KeyBytes(const std::string& key) {
    std::string q;
    AppendJsonString(q, key, InvalidUtf8::kPassThrough);
    return q.substr(1, q.size() - 2);
  }

  // A bound as written: JSON integers exactly (int64 / uint64 text), other
  // numbers as the double every parser reads.
  struct Bound {
    double d = 0;
    bool exact_int = false;
    __int128 i = 0;
  };
  static bool ReadBound(object o, const char* key, const std::string& ptr, Bound& out) {
    element v;
    if (o[key].get(v) != simdjson::SUCCESS) return false;
    double d;
    if (!Number(o, key, ptr, d)) return false;
    out.d = d;
    out.exact_int = v.type() == element_type::INT64 || v.type() == element_type::UINT64;
    if (v.type() == element_type::INT64) out.i = int64_t(v);
    if (v.type() == element_type::UINT64) out.i = uint64_t(v);
    return true;
  }

  static std::string BoundText(const Bound& b) {
    if (b.exact_int) {
      __int128 x = b.i < 0 ? -b.i : b.i;
      std::string t;
      do { t.insert(t.begin(), char('0' + int(x % 10))); x /= 10; } while (x);
      return b.i < 0 ? "-" + t : t;
    }
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof buf, b.d);
    return std::string(buf, r.ptr);
  }

  uint32_t CompileNumber(object o, bool integer, const std::string& ptr) {
    SchemaNode n;
    n.kind = NodeKind::kNumber;
    n.integer = integer;
    Bound b;
    bool any = false;
    std::string lo_kw, hi_kw;
    Bound lo_b, hi_b;
    if (ReadBound(o, "minimum", ptr, b)) { n.lo = b.d; lo_kw = "minimum"; lo_b = b; any = true; }
    if (ReadBound(o, "exclusiveMinimum", ptr, b)) {
      if (b.d >= n.lo) { n.lo = b.d; n.lo_excl = true; lo_kw = "exclusiveMinimum"; lo_b = b; }
      any = true;
    }
    if (ReadBound(o, "maximum", ptr, b)) { n.hi = b.d; hi_kw = "maximum"; hi_b = b; any = true; }
    if (ReadBound(o, "exclusiveMaximum", ptr, b)) {
      if (b.d <= n.hi) { n.hi = b.d; n.hi_excl = true; hi_kw = "exclusiveMaximum"; hi_b = b; }
      any = true;
    }
    n.bounded = any;
    if (!any) {
      uint32_t idx = Add(std::move(n));
      SetFirst(idx);
      return idx;
    }
    // (Integers compare their bounds exactly below, not as doubles.)
    if (!integer && (n.lo > n.hi || (n.lo == n.hi && (n.lo_excl || n.hi_excl))))
      Unsatisfiable(ptr, "minimum above maximum");
    auto beyond = [&](const std::string& kw, const Bound& bound, const std::string& limit, const std::string& why) {
      Unsupported(kw, ptr, "the bound " + BoundText(bound) + " lies beyond " + limit + " (" + why + ")");
    };
    if (integer) {
      // Exact integer bounds: JSON integers as written (__int128 holds any
      // int64 / uint64), other bounds rounded inward from the double; beyond
      // +-1e30 a double bound is only "far".
      constexpr __int128 kFar = __int128(1) << 100;
      auto inward = [&](const Bound& x, bool lower, bool excl) -> __int128 {
        if (x.exact_int) return lower ? (excl ? x.i + 1 : x.i) : (excl ? x.i - 1 : x.i);
        if (x.d >= 1e30) return kFar;
        if (x.d <= -1e30) return -kFar;
        if (lower) return __int128(excl ? std::floor(x.d) + 1 : std::ceil(x.d));
        return __int128(excl ? std::ceil(x.d) - 1 : std::floor(x.d));
      };
      __int128 lo = -kFar, hi = kFar;
      lo_kw.clear();
      hi_kw.clear();
      for (const char* kw : {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"}) {
        if (!ReadBound(o, kw, ptr, b)) continue;
        const std::string k = kw;
        const bool lower = k.find("inimum") != std::string::npos, excl = k[0] == 'e';
        const __int128 x = inward(b, lower, excl);
        if (lower && x > lo) { lo = x; lo_kw = k; lo_b = b; }
        if (!lower && x < hi) { hi = x; hi_kw = k; hi_b = b; }
      }
      if (lo > hi) Unsatisfiable(ptr, "no integer lies within the bounds");
      // The fewest digits (at least kMaxIntDigits) that reach an integer within the bounds.
      __int128 reach = 1;
      for (int d = 1; d <= kMaxBoundIntDigits; ++d) {
        reach *= 10;
        if (d < kMaxIntDigits) continue;
        if (lo <= reach - 1 && hi >= -(reach - 1)) { n.int_digits = uint8_t(d); break; }
        if (d == kMaxBoundIntDigits) {
          const bool low_side = lo > reach - 1;
          beyond(low_side ? lo_kw : hi_kw, low_side ? lo_b : hi_b, "+-(1e18 - 1)",
                 "integers are generated with at most 18 digits, exact in int64, and none of them meets it");
        }
      }
      const __int128 lim = __int128(std::numeric_limits<int64_t>::max());
      n.ilo = int64_t(std::max(lo, -lim - 1));
      n.ihi = int64_t(std::min(hi, lim));
    } else {
      // Bounded numbers have at most 15 significant digits, so they lie within
      // +-(1e15 - 1); a bound further out is exact (every such value meets it)
      // unless it leaves none of them.
      constexpr double kReach = 1e15 - 1;
      if (n.lo > kReach || (n.lo == kReach && n.lo_excl))
        beyond(lo_kw, lo_b, "+-1e15", "numbers under bounds have at most 15 digits; use \"type\": \"integer\" for larger whole numbers");
      if (n.hi < -kReach || (n.hi == -kReach && n.hi_excl))
        beyond(hi_kw, hi_b, "+-1e15", "numbers under bounds have at most 15 digits; use \"type\": \"integer\" for larger whole numbers");
    }
    uint32_t idx = Add(std::move(n));
    SetFirst(idx);
    return idx;
  }

  // The element a local reference points to; kCorrupt when it resolves to nothing.
  element Resolve(const std::string& ref, const std::string& ptr) {
    element target = root_;
    std::string_view rest = std::string_view(ref).substr(1);
    while (!rest.empty()) {
      if (rest[0] != '/') Unsupported("$ref", ptr, "only JSON-pointer references are supported: '" + ref + "'");
      rest.remove_prefix(1);
      size_t slash = rest.find('/');
      std::string tokn = PointerUnescape(rest.substr(0, slash));
      rest = slash == std::string_view::npos ? std::string_view{} : rest.substr(slash);
      element next;
      if (target.type() == element_type::OBJECT) {
        if (object(target)[tokn].get(next) != simdjson::SUCCESS) Corrupt(ptr + "/$ref", "'" + ref + "' resolves to nothing");
      } else if (target.type() == element_type::ARRAY) {
        char* end = nullptr;
        unsigned long i = std::strtoul(tokn.c_str(), &end, 10);
        if (tokn.empty() || *end || simdjson::dom::array(target).at(i).get(next) != simdjson::SUCCESS)
          Corrupt(ptr + "/$ref", "'" + ref + "' resolves to nothing");
      } else {
        Corrupt(ptr + "/$ref", "'" + ref + "' resolves to nothing");
      }
      target = next;
    }
    return target;
  }

  // The local references anywhere below a reference's target (every "$ref"
  // string, wherever it sits: more edges than the schema uses only makes
  // Cyclic() more cautious). Unresolvable ones are left to Compile.
  const std::vector<std::string>& RefsBelow(const std::string& ref) {
    auto it = refs_below_.find(ref);
    if (it != refs_below_.end()) return it->second;
    std::vector<std::string> found;
    element target;
    bool ok = true;
    try {
      target = Resolve(ref, "");
    } catch (const Error&) {
      ok = false;
    }
    std::vector<element> todo;
    if (ok) todo.push_back(target);
    while (!todo.empty()) {
      element e = todo.back();
      todo.pop_back();
      // Targets may overlap (every one lies inside "#"): bound the total work.
      if (++walked_ > kMaxRefWalk)
        Unsupported("$ref", "", "too many reference targets to search for recursion (" +
                                    std::to_string(kMaxRefWalk) + " schema values)");
      if (e.type() == element_type::ARRAY) {
        for (element x : simdjson::dom::array(e)) todo.push_back(x);
      } else if (e.type() == element_type::OBJECT) {
        for (auto f : object(e)) {
          if (f.key == "$ref" && f.value.type() == element_type::STRING) {
            std::string_view r(f.value);
            if (!r.empty() && r[0] == '#') found.emplace_back(r);
          }
          todo.push_back(f.value);
        }
      }
    }
    return refs_below_.emplace(ref, std::move(found)).first->second;
  }

  // Whether a cycle of references can be reached from `ref` (depth-first
  // search for a back edge). References that reach none compile to the same
  // nodes wherever they are used: compiled once and shared.
  bool Cyclic(const std::string& ref) {
    auto known = cyclic_.find(ref);
    if (known != cyclic_.end()) return known->second;
    std::map<std::string, int> color;  // 1 on the stack, 2 done
    std::vector<std::pair<std::string, size_t>> stack = {{ref, 0}};
    color[ref] = 1;
    bool found = false;
    while (!stack.empty() && !found) {
      auto& [at, next] = stack.back();
      const std::vector<std::string>& out = RefsBelow(at);
      if (next == out.size()) {
        color[at] = 2;
        stack.pop_back();
        continue;
      }
      std::string to = out[next++];
      auto k = cyclic_.find(to);
      int c = color[to];
      if (c == 1 || (k != cyclic_.end() && k->second)) {
        found = true;
      } else if (c == 0 && k == cyclic_.end()) {
        color[to] = 1;
        stack.emplace_back(to, 0);
      }
    }
    // Every reference finished without a back edge reaches no cycle; those
    // still on the stack reach the one found.
    for (auto& [r, c] : color)
      if (c == 2) cyclic_[r] = false;
    for (auto& [r, next] : stack) cyclic_[r] = true;
    cyclic_[ref] = found;
    return found;
  }

  // Local references are inlined. One that reaches no cycle compiles once and
  // is shared. A recursive one is unrolled: it may be expanded inside its own
  // expansion max_recursion_ times; one more is false (RecursionCut). Its
  // nodes depend on how often each reference is being expanded, so they are
  // shared only between uses with the same counts.
  uint32_t CompileRef(const std::string& ref, const std::string& ptr, int depth) {
    if (ref.empty() || ref[0] != '#') Unsupported("$ref", ptr, "only local references ('#/...') are supported");
    if (!Cyclic(ref)) {
      auto it = refs_.find(ref);
      if (it != refs_.end()) return it->second;
      uint32_t idx = Compile(Resolve(ref, ptr), ref.substr(1), depth + 1);
      refs_[ref] = idx;
      return idx;
    }
    element target = Resolve(ref, ptr);
    auto found = active_.find(ref);
    const int expanded = found == active_.end() ? 0 : found->second;
    if (expanded > 0) recursed_ = true;
    if (expanded > max_recursion_) {
      cut_ref_ = ref;
      throw RecursionCut{};
    }
    std::string key = ref;
    for (auto& [r, count] : active_) key += '\0' + r + '\0' + std::to_string(count);
    if (auto it = unrolled_.find(key); it != unrolled_.end()) {
      if (it->second < 0) throw RecursionCut{};
      return uint32_t(it->second);
    }
    // Every expansion compiles its target again (even one that ends cut and
    // adds no nodes): bound them as the node cap bounds the nodes.
    if (++expansions_ > kMaxExpansions)
      throw Error(ErrorCode::kUnsupported, "recursive references at " + Where(ptr) + " expand more than " +
                                               std::to_string(kMaxExpansions) + " times",
                  {}, Error::kNoOffset, "schema");
    ++active_[ref];
    auto restore = [&]() {
      if (--active_[ref] == 0) active_.erase(ref);
    };
    uint32_t idx;
    try {
      idx = Compile(target, ref.substr(1), depth + 1);
    } catch (const RecursionCut&) {
      restore();
      unrolled_[key] = -1;
      throw;
    } catch (...) {
      restore();
      throw;
    }
    restore();
    unrolled_[key] = int64_t(idx);
    return idx;
  }

  // Whether the automaton of `node` accepts `text` as a complete value
  // (compact spelling): the filter of enum/const values by other keywords.
  bool AcceptsText(uint32_t node, const std::string& text) {
    std::vector<Frame> arena;
    Matcher m(nodes_, node, arena);
    std::vector<State> cur = {m.Start()}, next;
    for (char c : text) {
      next.clear();
      for (const State& st : cur) m.Step(st, uint8_t(c), next);
      m.Dedupe(next, 1024);
      if (next.empty()) return false;
      cur.swap(next);
    }
    for (const State& st : cur)
      if (m.Accepting(st)) return true;
    return false;
  }

 private:
  element root_;
  int max_recursion_;
  std::vector<SchemaNode> nodes_;
  int32_t any_ = -1;
  std::map<std::string, uint32_t> refs_;                     // acyclic references, compiled once
  std::map<std::string, std::vector<std::string>> refs_below_;
  std::map<std::string, bool> cyclic_;
  static constexpr size_t kMaxRefWalk = size_t{1} << 23;
  size_t walked_ = 0;
  static constexpr int kMaxExpansions = 1 << 16;
  int expansions_ = 0;
  std::map<std::string, int> active_;                        // cyclic references being expanded, and how often
  std::map<std::string, int64_t> unrolled_;                  // (ref, active) -> node, -1: cut
  std::string cut_ref_;
  bool recursed_ = false;
  simdjson::dom::parser literal_parser_;
};

CompiledSchema Finish(Compiler& c, uint32_t root) {
  auto impl = std::make_shared<CompiledSchema::Impl>();
  impl->nodes = c.TakeNodes();
  impl->root = root;
  for (SchemaNode& n : impl->nodes)
    for (int b = 0; b < 256; ++b)
      if (n.first[size_t(b)]) n.first_bits[size_t(b / 64)] |= uint64_t{1} << (b % 64);
  return CompiledSchema(std::move(impl));
}

}  // namespace

CompiledSchema Schema::CompileOrThrow(std::string_view schema_json) {
  if (schema_json.size() > kMaxSchemaBytes)
    throw Error(ErrorCode::kInvalidArgument, "schema text is " + std::to_string(schema_json.size()) +
                                                 " bytes, more than " + std::to_string(kMaxSchemaBytes));
  simdjson::dom::parser parser;
  simdjson::padded_string padded(schema_json);
  element doc;
  auto err = parser.parse(padded).get(doc);
  if (err) throw Error(ErrorCode::kCorrupt, std::string("schema is not JSON: ") + simdjson::error_message(err));
  // A recursive $ref unrolls kMaxRefRecursion levels; when that exceeds the
  // node cap (or the nesting cap), fewer levels are tried before giving up.
  std::optional<Error> first;
  for (int levels = kMaxRefRecursion; levels >= 0; --levels) {
    Compiler c(doc, levels);
    try {
      uint32_t root = c.CompileRoot();
      return Finish(c, root);
    } catch (const Error& e) {
      const bool retry = c.recursed() && levels > 0 && e.code() == ErrorCode::kUnsupported && e.object() == "schema";
      if (!first) first = e;
      if (!retry) throw *first;
    }
  }
  throw *first;
}

CompiledSchema Schema::JsonObject() {
  return CompileOrThrow(R"({"type":"object"})");
}

CompiledSchema Schema::AnyJson() { return CompileOrThrow("{}"); }

}  // namespace k3::constrain
