// JSON Schema -> byte-automaton nodes (schema_internal.h). Every keyword is
// either compiled, ignored as an annotation, or refused with kUnsupported naming
// the keyword and its JSON pointer: a request is never silently unconstrained.
#include <simdjson.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <unordered_set>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "k3/core/error.h"
#include "k3/core/json_writer.h"
#include "matcher.h"
#include "schema_compiler.h"

namespace k3::constrain {
namespace {

// Keywords that constrain and are compiled here, grouped by the type they apply to.
const std::set<std::string_view> kObjectWords = {"properties",           "required",
                                                 "additionalProperties", "minProperties",
                                                 "maxProperties",        "propertyNames"};
const std::set<std::string_view> kArrayWords = {"items",       "minItems",    "maxItems",
                                                "uniqueItems", "prefixItems", "additionalItems"};
const std::set<std::string_view> kStringWords = {"minLength", "maxLength", "pattern"};
const std::set<std::string_view> kNumberWords = {"minimum", "maximum", "exclusiveMinimum",
                                                 "exclusiveMaximum", "multipleOf"};
const std::set<std::string_view> kOtherWords = {"type", "enum", "const", "anyOf", "oneOf", "allOf",
                                                "$ref"};

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

// Which JSON type a compact literal text has ("integer" counts as "number" too).
bool IsDigitChar(char c) { return c >= '0' && c <= '9'; }

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

}  // namespace

// Keywords that only describe (JSON Schema annotations) or that validators do
// not assert by default (format): accepted and ignored.
const std::set<std::string_view> kAnnotations = {
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "$anchor",
    "deprecated", "readOnly", "writeOnly", "format", "contentEncoding", "contentMediaType",
    "$defs", "definitions", "nullable", "discriminator", "example",
};

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

void AppendCompact(std::string& out, element e) { AppendValue(out, e, false); }

void CompileBudget::Charge(uint64_t work, uint64_t bytes) {
  work_ += work;
  bytes_ += bytes;
  if (!spent()) return;
  throw Error(ErrorCode::kInvalidArgument,
              "compiling the schemas needs more than the schema compile budget of " + std::to_string(max_work_) +
                  " steps and " + std::to_string(max_bytes_ >> 20) + " MiB of automata",
              {}, Error::kNoOffset, kBudgetObject);
}

size_t NodeBytes(const SchemaNode& n) {
  size_t b = sizeof(SchemaNode) + n.props.size() * sizeof(Property) + n.reserved.size() * sizeof(std::string) +
             n.prefix.size() * sizeof(uint32_t) + n.alts.size() * sizeof(uint32_t) +
             3 * n.literals.size() * sizeof(std::string);
  for (const Property& p : n.props) b += p.key.size();
  for (const std::string& r : n.reserved) b += r.size();
  for (const std::string& l : n.literals) b += 3 * l.size();
  return b;
}

void Compiler::Relaxed(const std::string& keyword, const std::string& ptr, const std::string& why,
                       const std::string& action) {
  if (!relax_) Unsupported(keyword, ptr, why);
  if (notes_.size() < 64) notes_.push_back({keyword, Where(ptr), action + ": " + why});
}

uint32_t Compiler::CompileRoot() {
  // The root is the target of "#": a "#" inside it is a re-entry.
  if (Cyclic("#")) ++active_["#"];
  try {
    return Compile(root_, "", 0);
  } catch (const RecursionCut&) {
    Unsatisfiable("", "every value needs the recursive reference '" + cut_ref_ + "' nested inside itself more than " +
                          std::to_string(max_recursion_) + " times, the most k3 unrolls");
  }
}

uint32_t Compiler::Add(SchemaNode n) {
  budget_.Charge(kNodeWork, NodeBytes(n));
  if (nodes_.size() >= size_t(kMaxNodes))
    throw Error(ErrorCode::kUnsupported, "schema compiles to more than " + std::to_string(kMaxNodes) + " nodes", {},
                Error::kNoOffset, "schema");
  nodes_.push_back(std::move(n));
  return uint32_t(nodes_.size() - 1);
}

uint32_t Compiler::AnyNode() {
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

uint32_t Compiler::AnyObject() {
  for (uint32_t a : nodes_[AnyNode()].alts)
    if (nodes_[a].kind == NodeKind::kObject) return a;
  throw Error(ErrorCode::kInternal, "the any-value union has no object");
}

uint32_t Compiler::StringNode(uint32_t min_len, uint32_t max_len) {
  SchemaNode s;
  s.kind = NodeKind::kString;
  s.min_len = min_len;
  s.max_len = max_len;
  s.first['"'] = true;
  return Add(std::move(s));
}

uint32_t Compiler::LiteralNode(std::vector<std::string> lits, const std::string& ptr,
                               const std::string& kw, const char* why_empty) {
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
    budget_.Charge(kNodeWork / 4 + l.size(), 0);  // parsed back for its other spellings
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

void Compiler::SetFirst(uint32_t idx) {
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

void Compiler::CheckDisjoint(const std::vector<uint32_t>& alts, const std::string& ptr) {
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
  // A literal set beside another alternative: disjoint when the other's
  // automaton refuses every literal, for literals whose acceptance k3 judges
  // as every validator does (printable-ASCII strings, true/false/null, short
  // integers) and an alternative k3 does not narrow (no `format` pattern).
  auto exact_literal = [](const std::string& l) {
    if (l == "true" || l == "false" || l == "null") return true;
    if (l[0] == '"') {
      for (char c : l)
        if (uint8_t(c) < 0x20 || uint8_t(c) > 0x7E) return false;
      return true;
    }
    if (l.size() > 16) return false;
    for (size_t i = 0; i < l.size(); ++i)
      if (!(IsDigitChar(l[i]) || (i == 0 && l[i] == '-'))) return false;
    return true;
  };
  auto literals_refused = [&](const SchemaNode& lits, uint32_t other) {
    const SchemaNode& x = nodes_[other];
    if (x.format_narrowed || x.kind == NodeKind::kUnion) return false;
    for (const std::string& l : lits.literals)
      if (!exact_literal(l) || AcceptsText(other, l)) return false;
    return true;
  };
  auto discriminated_idx = [&](uint32_t ia, uint32_t ib) {
    const SchemaNode &a = nodes_[ia], &b = nodes_[ib];
    if (a.kind == NodeKind::kLiterals && b.kind != NodeKind::kLiterals)
      return literals_refused(a, ib);
    if (b.kind == NodeKind::kLiterals && a.kind != NodeKind::kLiterals)
      return literals_refused(b, ia);
    return false;
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
      if (overlap(a, b) && !discriminated(a, b) && !discriminated_idx(alts[i], alts[j])) {
        Relaxed(
            "oneOf", ptr,
            "alternatives " + std::to_string(i) + " and " + std::to_string(j) +
                " could both match (they start alike, no required key with distinct const/enum "
                "values tells them apart, and they are not an enum beside a schema that refuses "
                "its values); anyOf is supported",
            "read as anyOf");
        return;
      }
    }
}

void Compiler::FillUnion(uint32_t u, const std::vector<uint32_t>& alts_in, const std::string& ptr,
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
  if (alts.size() > size_t(kMaxAlternatives)) {
    Relaxed(kw, ptr, "more than " + std::to_string(kMaxAlternatives) + " alternatives",
            "any value");
    alts = nodes_[AnyNode()].alts;
  }
  SchemaNode& un = nodes_[u];
  un.kind = NodeKind::kUnion;
  un.alts = alts;
  un.first.fill(false);
  for (uint32_t a : alts)
    for (int b = 0; b < 256; ++b) un.first[b] = un.first[b] || nodes_[a].first[b];
}

uint32_t Compiler::Compile(element e, const std::string& ptr, int depth, bool skip_literals) {
  budget_.Charge(kNodeWork, 0);
  if (depth >= kMaxDepth)
    throw Error(ErrorCode::kUnsupported, "schema at " + Where(ptr) + " nests deeper than " + std::to_string(kMaxDepth),
                {}, Error::kNoOffset, "schema");
  if (e.type() == element_type::BOOL) {
    if (bool(e)) return AnyNode();
    Unsatisfiable(ptr, "the schema is false");
  }
  if (e.type() != element_type::OBJECT) Corrupt(ptr, "a schema must be an object or a boolean");
  object o(e);

  // Sort the keywords: refuse (or, not strict, drop) what is not supported,
  // note what constrains.
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
        {"not", "negation is not supported"},
        {"if", "conditionals are not supported"},
        {"then", "conditionals are not supported"},
        {"else", "conditionals are not supported"},
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
    Relaxed(std::string(k), ptr, it != kWhy.end() ? std::string(it->second) : "unknown keyword",
            "dropped");
  }
  // Without patternProperties, additionalProperties would apply to the keys
  // it matched too: a non-strict compile drops both (any extra key).
  const bool pattern_props = o["patternProperties"].error() == simdjson::SUCCESS;
  if (pattern_props && constraints.erase("additionalProperties"))
    Relaxed("additionalProperties", ptr,
            "beside the dropped 'patternProperties' it would refuse the keys that matched",
            "dropped");

  if (constraints.count("uniqueItems")) {
    element v = o["uniqueItems"];
    if (v.type() != element_type::BOOL) Corrupt(ptr + "/uniqueItems", "must be a boolean");
    if (!bool(v)) constraints.erase("uniqueItems");  // true: compiled with the array below
  }

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
    if (lits.size() > size_t(kMaxLiterals) && relax_) {
      Relaxed(kw, ptr, "more than " + std::to_string(kMaxLiterals) + " values", "dropped");
      return Compile(e, ptr, depth, true);
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

  // allOf, and a combinator ($ref, anyOf, oneOf) beside other keywords, are
  // merged into one schema (MergeAllOf) and compiled as that. An allOf of
  // bare patterns (zod's two .regex()) stays: the string intersects them.
  if (constraints.count("allOf") && IsPatternList(o)) {
    constraints.erase("allOf");
    constraints.insert("pattern");
  }
  {
    size_t combinators = 0, rest = 0;
    for (auto& c : constraints) {
      if (c == "allOf" || c == "anyOf" || c == "oneOf" || c == "$ref")
        ++combinators;
      else
        ++rest;
    }
    if (constraints.count("allOf") || (combinators >= 1 && combinators + rest >= 2)) {
      element merged = MergeAllOf(o, ptr);
      return Compile(merged, ptr, depth + 1, skip_literals);
    }
  }

  if (constraints.count("$ref")) {
    element v = o["$ref"];
    if (v.type() != element_type::STRING) Corrupt(ptr + "/$ref", "must be a string");
    return CompileRef(std::string(std::string_view(v)), ptr, depth);
  }
  if (constraints.count("anyOf") || constraints.count("oneOf")) {
    std::string kw = constraints.count("anyOf") ? "anyOf" : "oneOf";
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
    // No type: the type-specific keywords present say which (JSON Schema
    // would accept other types too; generating only these still validates).
    auto has_any = [&](const std::set<std::string_view>& words) {
      for (auto& c : constraints)
        if (words.count(c)) return true;
      return false;
    };
    if (has_any(kObjectWords)) types.push_back("object");
    if (has_any(kArrayWords)) types.push_back("array");
    if (has_any(kStringWords)) types.push_back("string");
    if (has_any(kNumberWords)) types.push_back("number");
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

bool Compiler::AcceptsText(uint32_t node, const std::string& text) {
  std::vector<Frame> arena;
  Matcher m(nodes_, node, arena);
  std::vector<State> cur = {m.Start()}, next;
  for (char c : text) {
    next.clear();
    budget_.Charge(kMatchStepWork * cur.size(), 0);
    for (const State& st : cur) m.Step(st, uint8_t(c), next);
    m.Dedupe(next, 1024);
    if (next.empty()) return false;
    cur.swap(next);
  }
  for (const State& st : cur)
    if (m.Accepting(st)) return true;
  return false;
}

namespace {

CompiledSchema Finish(Compiler& c, uint32_t root) {
  auto impl = std::make_shared<CompiledSchema::Impl>();
  impl->nodes = c.TakeNodes();
  impl->root = root;
  impl->relaxations = c.TakeNotes();
  for (SchemaNode& n : impl->nodes)
    for (int b = 0; b < 256; ++b)
      if (n.first[size_t(b)]) n.first_bits[size_t(b / 64)] |= uint64_t{1} << (b % 64);
  // Nodes may share one pattern automaton (a propertyNames key node's copy).
  std::unordered_set<const PatternDfa*> patterns;
  impl->bytes = sizeof(CompiledSchema::Impl);
  for (const SchemaNode& n : impl->nodes) {
    impl->bytes += NodeBytes(n);
    if (n.pattern && patterns.insert(n.pattern.get()).second) impl->bytes += n.pattern->bytes();
  }
  for (const Relaxation& r : impl->relaxations)
    impl->bytes += sizeof(r) + r.keyword.size() + r.pointer.size() + r.what.size();
  return CompiledSchema(std::move(impl));
}

// After a refused compile that built much, the freed automata go back to the
// system: glibc keeps freed memory in its arenas, so without a trim a refused
// request's peak would stay in the server's RSS.
void GiveBackMemory(uint64_t bytes_built) {
  constexpr uint64_t kTrimAbove = uint64_t{8} << 20;
  if (bytes_built < kTrimAbove) return;
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

}  // namespace

CompiledSchema Schema::CompileOrThrow(std::string_view schema_json) {
  return CompileOrThrow(schema_json, {});
}

CompiledSchema Schema::CompileOrThrow(std::string_view schema_json, const CompileOptions& options) {
  if (schema_json.size() > kMaxSchemaBytes)
    throw Error(ErrorCode::kInvalidArgument, "schema text is " + std::to_string(schema_json.size()) +
                                                 " bytes, more than " + std::to_string(kMaxSchemaBytes));
  simdjson::dom::parser parser;
  simdjson::padded_string padded(schema_json);
  element doc;
  auto err = parser.parse(padded).get(doc);
  std::optional<Error> first;
  if (err)
    first = Error(ErrorCode::kCorrupt,
                  std::string("schema is not JSON: ") + simdjson::error_message(err));
  CompileBudget own;
  CompileBudget& budget = options.budget ? *options.budget : own;
  const uint64_t bytes_before = budget.bytes();
  // A recursive $ref unrolls kMaxRefRecursion levels; when that exceeds the
  // node cap (or the nesting cap), fewer levels are tried before giving up.
  for (int levels = kMaxRefRecursion; levels >= 0 && !err; --levels) {
    Compiler c(doc, levels, !options.strict, budget);
    try {
      uint32_t root = c.CompileRoot();
      return Finish(c, root);
    } catch (const Error& e) {
      const bool retry = c.recursed() && levels > 0 && e.code() == ErrorCode::kUnsupported && e.object() == "schema";
      if (!first) first = e;
      if (!retry) break;
    }
  }
  GiveBackMemory(budget.bytes() - bytes_before);
  if (options.strict || first->code() == ErrorCode::kInternal) throw *first;
  // Not strict: what still does not compile (not a schema, no value satisfies
  // it, past a cap) is any value, a superset of every schema.
  CompiledSchema any = AnyJson();
  auto impl = std::make_shared<CompiledSchema::Impl>(any.impl());
  impl->relaxations.push_back({"schema", "/", std::string("any value: ") + first->what()});
  return CompiledSchema(std::move(impl));
}

const std::vector<Relaxation>& CompiledSchema::relaxations() const { return impl_->relaxations; }

size_t CompiledSchema::bytes() const { return impl_->bytes; }

CompiledSchema Schema::JsonObject() {
  return CompileOrThrow(R"({"type":"object"})");
}

CompiledSchema Schema::AnyJson() { return CompileOrThrow("{}"); }

}  // namespace k3::constrain
