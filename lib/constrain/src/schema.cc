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

// `format` values enforced as patterns (of the regex subset; each accepts a
// subset of what the format allows, e.g. ipv6 only in its full 8-group form,
// dates only with days every month has). Validators do not assert format by
// default, so this narrows what k3 generates and never widens it.
const char* FormatPattern(std::string_view format) {
  static const std::map<std::string_view, const char*> kFormats = {
      {"date",
       "^[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-"
       "9]|30)|"
       "02-(?:0[1-9]|1[0-9]|2[0-8]))$"},
      {"time",
       "^(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,6})?(?:Z|[+-](?:[01][0-9]|2[0-3]):"
       "[0-5][0-9])$"},
      {"date-time",
       "^[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-"
       "9]|30)|"
       "02-(?:0[1-9]|1[0-9]|2[0-8]))T(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,6})?"
       "(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])$"},
      {"email",
       "^[A-Za-z0-9_+-]+(?:\\.[A-Za-z0-9_+-]+)*@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
       "(?:\\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*\\.[A-Za-z]{2,24}$"},
      {"uuid", "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"},
      {"uri", "^[A-Za-z][A-Za-z0-9+.-]*:(?:[A-Za-z0-9._~:/?#@!$&'()*+,;=-]|%[0-9A-Fa-f]{2})+$"},
      {"ipv4",
       "^(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}(?:25[0-5]|2[0-4][0-9]|1[0-9][0-"
       "9]|[1-9]?[0-9])$"},
      {"ipv6", "^(?:[0-9a-fA-F]{1,4}:){7}[0-9a-fA-F]{1,4}$"},
  };
  auto it = kFormats.find(format);
  return it == kFormats.end() ? nullptr : it->second;
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
  // relax: a non-strict compile (CompileOptions::strict false).
  Compiler(element root, int max_recursion, bool relax)
      : root_(root), max_recursion_(max_recursion), relax_(relax) {}

  // A keyword the subset cannot enforce as written: strict, kUnsupported
  // naming it; otherwise noted, and the caller relaxes it as `action` says.
  void Relaxed(const std::string& keyword, const std::string& ptr, const std::string& why,
               const std::string& action) {
    if (!relax_) Unsupported(keyword, ptr, why);
    if (notes_.size() < 64) notes_.push_back({keyword, Where(ptr), action + ": " + why});
  }
  std::vector<Relaxation> TakeNotes() { return std::move(notes_); }

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

  // Any JSON object (the object alternative of AnyNode).
  uint32_t AnyObject() {
    for (uint32_t a : nodes_[AnyNode()].alts)
      if (nodes_[a].kind == NodeKind::kObject) return a;
    throw Error(ErrorCode::kInternal, "the any-value union has no object");
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

  // ---- allOf: merging schemas into one (JSON text, parsed and compiled) ----
  // A schema object as its keywords and their compact JSON texts, in order.
  using Keywords = std::vector<std::pair<std::string, std::string>>;

  static Keywords KeywordsOf(object o) {
    Keywords k;
    for (auto f : o) {
      std::string text;
      AppendCompact(text, f.value);
      k.emplace_back(std::string(f.key), std::move(text));
    }
    return k;
  }
  static const std::string* Find(const Keywords& k, std::string_view key) {
    for (auto& [name, text] : k)
      if (name == key) return &text;
    return nullptr;
  }
  static void Erase(Keywords& k, std::string_view key) {
    std::erase_if(k, [&](const auto& kv) { return kv.first == key; });
  }
  static void Set(Keywords& k, const std::string& key, std::string text) {
    for (auto& [name, t] : k)
      if (name == key) {
        t = std::move(text);
        return;
      }
    k.emplace_back(key, std::move(text));
  }
  static std::string TextOf(const Keywords& k) {
    std::string out = "{";
    for (auto& [name, text] : k) {
      if (out.size() > 1) out += ',';
      AppendJsonString(out, name, InvalidUtf8::kPassThrough);
      out += ':';
      out += text;
    }
    return out + "}";
  }
  static std::string AllOfText(const std::string& a, const std::string& b) {
    if (a == "true" || a == "{}" || a == b) return b;
    if (b == "true" || b == "{}") return a;
    if (a == "false" || b == "false") return "false";
    return "{\"allOf\":[" + a + "," + b + "]}";
  }

  // Parses merged text into a document this compiler keeps (elements point into it).
  element Own(const std::string& text, const std::string& ptr) {
    merged_bytes_ += text.size();
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

  // Whether every allOf member only holds `pattern` (and annotations): zod's
  // two .regex() on one string, intersected by the string node.
  static bool IsPatternList(object o) {
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

  // One schema equivalent to `o` (allOf members, a combinator beside other
  // keywords): keywords merged by MergeTwo, non-recursive $refs inlined, and
  // an anyOf/oneOf left at the end distributed over its alternatives
  // ({"anyOf":[{"allOf":[rest, alt]}...]}). Strict: a keyword pair that cannot
  // be merged exactly is refused ('allOf'); not strict: the first is kept
  // (the merged schema is then a superset).
  element MergeAllOf(object o, const std::string& ptr) {
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

  // Numbers of two texts (bounds and counts).
  static double NumberOfText(const std::string& t) { return std::strtod(t.c_str(), nullptr); }

  // Merges schema b into a (both plain keyword lists: no allOf left).
  Keywords MergeTwo(Keywords a, Keywords b, const std::string& ptr) {
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

  bool Number(object o, const char* key, const std::string& ptr, double& out) {
    element v;
    if (o[key].get(v) != simdjson::SUCCESS) return false;
    if (v.type() == element_type::INT64) out = double(int64_t(v));
    else if (v.type() == element_type::UINT64) out = double(uint64_t(v));
    else if (v.type() == element_type::DOUBLE) out = double(v);
    else if (v.type() == element_type::BOOL) {
      Relaxed(key, ptr, "the draft-4 boolean form is not supported (use a number)", "dropped");
      return false;
    } else
      Corrupt(ptr + "/" + key, "must be a number");
    return true;
  }

  uint32_t CompileTyped(object o, const std::string& type, const std::string& ptr, int depth) {
    if (type == "boolean") return LiteralNode({"true", "false"}, ptr, "type");
    if (type == "null") return LiteralNode({"null"}, ptr, "type");
    if (type == "string") {
      uint32_t mn = Count(o, "minLength", ptr, 0), mx = Count(o, "maxLength", ptr, kUnbounded);
      if (mn > mx) Unsatisfiable(ptr, "minLength > maxLength");
      uint32_t idx = StringNode(mn, mx);
      // Every pattern a value must match: `pattern`, an allOf of bare
      // patterns, and a known `format`'s; their DFAs are intersected.
      std::vector<std::pair<std::string, std::string>> pats;  // pattern, pointer of its schema
      element pat;
      if (o["pattern"].get(pat) == simdjson::SUCCESS) {
        if (pat.type() != element_type::STRING) Corrupt(ptr + "/pattern", "must be a string");
        pats.emplace_back(std::string_view(pat), ptr);
      }
      if (IsPatternList(o)) {
        size_t i = 0;
        element all = o["allOf"];
        for (element x : simdjson::dom::array(all)) {
          pats.emplace_back(std::string_view(x["pattern"]), ptr + "/allOf/" + std::to_string(i++));
        }
      }
      element fmt;
      size_t format_at = pats.size();
      if (o["format"].get(fmt) == simdjson::SUCCESS && fmt.type() == element_type::STRING)
        if (const char* f = FormatPattern(std::string_view(fmt)))
          pats.emplace_back(f, ptr + "/format");
      std::shared_ptr<const PatternDfa> dfa;
      for (size_t i = 0; i < pats.size(); ++i) {
        const auto& [text, where] = pats[i];
        std::shared_ptr<const PatternDfa> one;
        try {
          std::string left_out;
          one = CompilePattern(text, mn, mx, relax_, &left_out);
          if (!left_out.empty())
            Relaxed("pattern", where, left_out, "left out of the pattern (a superset)");
          if (dfa) one = IntersectPatterns(*dfa, *one, mn, mx);
        } catch (const PatternRefused& r) {
          // A format is k3's own narrowing (validators do not assert it): past
          // a cap it is simply not enforced.
          if (i < format_at) Relaxed("pattern", where, r.why, "dropped");
          continue;
        }
        if (!one->Viable(0, 0)) {
          if (i < format_at)
            Unsatisfiable(ptr, "no string matches 'pattern' within minLength/maxLength");
          continue;  // a format that the patterns leave no room for: not enforced
        }
        dfa = std::move(one);
        if (i >= format_at) nodes_[idx].format_narrowed = true;
      }
      nodes_[idx].pattern = std::move(dfa);
      return idx;
    }
    if (type == "number" || type == "integer") return CompileNumber(o, type == "integer", ptr);
    if (type == "array") {
      SchemaNode n;
      n.kind = NodeKind::kArray;
      n.min_items = Count(o, "minItems", ptr, 0);
      n.max_items = Count(o, "maxItems", ptr, kUnbounded);
      if (n.min_items > n.max_items) Unsatisfiable(ptr, "minItems > maxItems");
      // A tuple: prefixItems (2020-12) or items as an array (draft 7), each
      // position its own schema; the rest follow items (2020-12) or
      // additionalItems (draft 7). additionalItems without a tuple is ignored.
      element items, tuple, rest;
      bool has_tuple = false, has_rest = false;
      std::string tuple_ptr, rest_ptr;
      const bool has_items = o["items"].get(items) == simdjson::SUCCESS;
      if (o["prefixItems"].get(tuple) == simdjson::SUCCESS) {
        if (tuple.type() != element_type::ARRAY)
          Corrupt(ptr + "/prefixItems", "must be an array of schemas");
        has_tuple = true;
        tuple_ptr = ptr + "/prefixItems/";
        if (has_items) {
          rest = items;
          has_rest = true;
          rest_ptr = ptr + "/items";
        }
      } else if (has_items && items.type() == element_type::ARRAY) {
        tuple = items;
        has_tuple = true;
        tuple_ptr = ptr + "/items/";
        if (o["additionalItems"].get(rest) == simdjson::SUCCESS) {
          has_rest = true;
          rest_ptr = ptr + "/additionalItems";
        }
      } else if (has_items) {
        rest = items;
        has_rest = true;
        rest_ptr = ptr + "/items";
      }
      // Positions that may hold a value: a false position (or a recursion's
      // deepest copy) ends the array before it.
      uint32_t reachable = kUnbounded;
      if (has_tuple) {
        for (element x : simdjson::dom::array(tuple)) {
          if (n.prefix.size() == size_t(kMaxProperties)) {
            Relaxed("prefixItems", ptr,
                    "more than " + std::to_string(kMaxProperties) + " tuple positions",
                    "later positions take any value");
            has_rest = false;
            break;
          }
          if (x.type() == element_type::BOOL && !bool(x)) {
            reachable = uint32_t(n.prefix.size());
            break;
          }
          try {
            n.prefix.push_back(Compile(x, tuple_ptr + std::to_string(n.prefix.size()), depth + 1));
          } catch (const RecursionCut&) {
            if (n.min_items > n.prefix.size()) throw;  // the position is needed
            reachable = uint32_t(n.prefix.size());
            break;
          }
        }
      }
      n.items = AnyNode();
      if (has_rest && rest.type() == element_type::BOOL && !bool(rest)) {
        reachable = std::min<uint32_t>(reachable, uint32_t(n.prefix.size()));
      } else if (has_rest && reachable == kUnbounded) {
        try {
          n.items = Compile(rest, rest_ptr, depth + 1);
        } catch (const RecursionCut&) {
          if (n.min_items > n.prefix.size()) throw;  // an item is needed
          reachable = uint32_t(n.prefix.size());     // a recursion's deepest copy: no more items
        }
      }
      if (reachable < n.max_items) {
        if (n.min_items > reachable)
          Unsatisfiable(ptr, "minItems needs more items than the schema allows");
        n.max_items = reachable;
      }
      element uniq;
      if (o["uniqueItems"].get(uniq) == simdjson::SUCCESS && uniq.type() == element_type::BOOL && bool(uniq)) {
        // Enforced for enum/const items: the array remembers which values it
        // used. Object values are not: two key orders are one value.
        const SchemaNode& it = nodes_[n.items];
        const bool objects =
            std::any_of(it.literals.begin(), it.literals.end(),
                        [](const std::string& l) { return l.find('{') != std::string::npos; });
        if (it.kind != NodeKind::kLiterals || !n.prefix.empty()) {
          Relaxed("uniqueItems", ptr, "enforced only when items is an enum or const (and no tuple)",
                  "dropped");
        } else if (objects) {
          Relaxed("uniqueItems", ptr, "enforced only for enum values that contain no objects",
                  "dropped");
        } else {
          if (n.min_items > it.literals.size())
            Unsatisfiable(ptr, "minItems exceeds the distinct values of items");
          n.unique = true;
        }
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
    // Beside a patternProperties (dropped when not strict), additionalProperties
    // is dropped too (Compile notes both).
    const bool pattern_props = o["patternProperties"].error() == simdjson::SUCCESS;
    bool has_add = !pattern_props && o["additionalProperties"].get(add_el) == simdjson::SUCCESS;
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
    // Free keys, with values of additionalProperties (any value when absent or
    // true): when it is a schema, or when nothing is declared. Declared
    // properties with additionalProperties absent or true generate only the
    // declared keys. Free keys never equal a key of properties.
    bool free_keys = !add_false && (add_schema || n.props.empty());
    // propertyNames: declared keys it refuses cannot appear; free keys are
    // strings of its schema, or, for an enum of strings, its values become
    // optional declared keys.
    int32_t key_schema = kNoNode;
    element pn;
    if (o["propertyNames"].get(pn) == simdjson::SUCCESS) {
      const std::string pn_ptr = ptr + "/propertyNames";
      uint32_t k = 0;
      bool have = false;
      if (pn.type() == element_type::BOOL && !bool(pn)) {
        if (!required.empty()) Unsatisfiable(ptr, "propertyNames is false but keys are required");
        n.props.clear();
        free_keys = false;
      } else if (pn.type() != element_type::BOOL) {
        try {
          k = Compile(pn, pn_ptr, depth + 1);
          have = true;
        } catch (const RecursionCut&) {
          Relaxed("propertyNames", ptr, "a recursive key schema", "dropped");
        }
      }
      if (have) {
        std::vector<Property> kept;
        for (Property& pr : n.props) {
          if (AcceptsText(k, "\"" + pr.key + "\"")) {
            kept.push_back(std::move(pr));
          } else if (pr.required) {
            Unsatisfiable(ptr,
                          "the required key '" + pr.key + "' is not a name propertyNames allows");
          }
        }
        n.props = std::move(kept);
        const NodeKind kind = nodes_[k].kind;
        if (kind == NodeKind::kString) {
          key_schema = int32_t(k);
        } else if (kind == NodeKind::kLiterals && nodes_[k].raw_ok && free_keys) {
          const std::vector<std::string> names = nodes_[k].literals_raw;
          for (const std::string& name : names) {
            const std::string key = KeyBytes(name);
            if (std::any_of(n.props.begin(), n.props.end(),
                            [&](const Property& p) { return p.key == key; }))
              continue;
            if (std::find(reserved.begin(), reserved.end(), key) != reserved.end())
              continue;  // declared false
            const int32_t v = additional();
            if (v == kNoNode) break;
            Property pr;
            pr.key = key;
            pr.child = uint32_t(v);
            n.props.push_back(std::move(pr));
          }
          free_keys = false;
        } else if (free_keys) {
          Relaxed("propertyNames", ptr,
                  "on free keys only a string schema or an enum of strings is enforced",
                  "not enforced on free keys");
        }
      }
    }
    if (n.props.size() > size_t(kMaxProperties) ||
        (free_keys && reserved.size() > size_t(kMaxProperties))) {
      Relaxed("properties", ptr, "more than " + std::to_string(kMaxProperties) + " properties",
              "any object");
      return AnyObject();
    }
    for (size_t i = 0; i < n.props.size(); ++i)
      if (n.props[i].required) n.required_mask |= uint64_t{1} << i;
    if (free_keys) {
      int32_t v = additional();
      if (v != kNoNode) {
        n.map_value = v;
        if (key_schema >= 0) {
          SchemaNode key = nodes_[size_t(key_schema)];
          if (key.pattern && !reserved.empty()) {
            // The free-key frame's state holds either the pattern's DFA or the
            // declared keys it still equals, not both.
            Relaxed("propertyNames", ptr, "a key pattern beside declared properties",
                    "the pattern not enforced on free keys");
            key.pattern = nullptr;
          }
          key.key_of = kNoNode;
          n.key_node = Add(std::move(key));
        } else {
          n.key_node = StringNode(0, kUnbounded);
        }
      }
    }
    if (n.map_value >= 0 && !reserved.empty()) n.reserved = std::move(reserved);
    n.min_props = Count(o, "minProperties", ptr, 0);
    n.max_props = Count(o, "maxProperties", ptr, kUnbounded);
    if (n.min_props > n.max_props) Unsatisfiable(ptr, "minProperties > maxProperties");
    if (size_t(std::popcount(n.required_mask)) > n.max_props) Unsatisfiable(ptr, "more required properties than maxProperties");
    // minProperties counts distinct keys. Free keys may repeat, and a parser
    // keeps one of each: only one free key can be promised.
    if (n.min_props > n.props.size() + (n.map_value >= 0 ? 1 : 0)) {
      if (n.map_value >= 0) {
        Relaxed("minProperties", ptr,
                "counts at most one free key (free keys may repeat): above the declared "
                "properties + 1 it is not supported",
                "dropped");
        n.min_props = 0;
      } else {
        if (add_cut) throw RecursionCut{};
        Unsatisfiable(ptr, "minProperties exceeds the properties that may appear");
      }
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
  bool ReadBound(object o, const char* key, const std::string& ptr, Bound& out) {
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
    // multipleOf: an integer m makes every value an integer multiple of m
    // (for "number" too: integers are a subset). A fraction is not enforced:
    // validators divide in binary floating point (python-jsonschema and ajv
    // both refuse 0.3 as a multiple of 0.1, and 3 as one of 0.1), so no
    // decimal rule agrees with them.
    double mult = 0;
    if (Number(o, "multipleOf", ptr, mult)) {
      if (!(mult > 0)) Corrupt(ptr + "/multipleOf", "must be a number above 0");
      if (mult == std::floor(mult) && mult <= 9007199254740992.0) {
        integer = n.integer = true;
        if (mult > 1) n.multiple = int64_t(mult);
      } else {
        Relaxed(
            "multipleOf", ptr,
            "a fraction (or beyond 2^53): validators divide in binary floating point (0.3 / 0.1 = "
            "2.9999999999999996), so k3 enforces only integer multiples",
            "dropped");
      }
    }
    n.bounded = any || n.multiple > 1;
    if (!n.bounded) {
      uint32_t idx = Add(std::move(n));
      SetFirst(idx);
      return idx;
    }
    // (Integers compare their bounds exactly below, not as doubles.)
    if (!integer && (n.lo > n.hi || (n.lo == n.hi && (n.lo_excl || n.hi_excl))))
      Unsatisfiable(ptr, "minimum above maximum");
    bool dropped = false;  // not strict: bounds beyond what is generated are left out
    auto beyond = [&](const std::string& kw, const Bound& bound, const std::string& limit,
                      const std::string& why) {
      if (dropped) return;
      Relaxed(kw, ptr, "the bound " + BoundText(bound) + " lies beyond " + limit + " (" + why + ")",
              "the bounds dropped");
      dropped = true;
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
      if (n.multiple > 1) {
        // The first and last multiples within the bounds.
        const __int128 m = n.multiple;
        __int128 r = lo % m;
        if (r < 0) r += m;
        if (r) lo += m - r;
        r = hi % m;
        if (r < 0) r += m;
        hi -= r;
        if (lo > hi) Unsatisfiable(ptr, "no multiple of 'multipleOf' lies within the bounds");
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
    if (dropped) {
      SchemaNode u;
      u.kind = NodeKind::kNumber;
      u.integer = n.integer;
      u.multiple = n.multiple;
      u.bounded = u.multiple > 1;
      n = std::move(u);
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
    if (ref.empty() || ref[0] != '#') {
      Relaxed("$ref", ptr, "only local references ('#/...') are supported", "any value");
      return AnyNode();
    }
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
  bool relax_ = false;
  std::vector<Relaxation> notes_;
  // Documents of merged allOf schemas (their elements are compiled like the root's).
  std::vector<std::unique_ptr<simdjson::dom::parser>> owned_;
  size_t merged_bytes_ = 0;
};

CompiledSchema Finish(Compiler& c, uint32_t root) {
  auto impl = std::make_shared<CompiledSchema::Impl>();
  impl->nodes = c.TakeNodes();
  impl->root = root;
  impl->relaxations = c.TakeNotes();
  for (SchemaNode& n : impl->nodes)
    for (int b = 0; b < 256; ++b)
      if (n.first[size_t(b)]) n.first_bits[size_t(b / 64)] |= uint64_t{1} << (b % 64);
  return CompiledSchema(std::move(impl));
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
  // A recursive $ref unrolls kMaxRefRecursion levels; when that exceeds the
  // node cap (or the nesting cap), fewer levels are tried before giving up.
  for (int levels = kMaxRefRecursion; levels >= 0 && !err; --levels) {
    Compiler c(doc, levels, !options.strict);
    try {
      uint32_t root = c.CompileRoot();
      return Finish(c, root);
    } catch (const Error& e) {
      const bool retry = c.recursed() && levels > 0 && e.code() == ErrorCode::kUnsupported && e.object() == "schema";
      if (!first) first = e;
      if (!retry) break;
    }
  }
  if (options.strict || first->code() == ErrorCode::kInternal) throw *first;
  // Not strict: what still does not compile (not a schema, no value satisfies
  // it, past a cap) is any value, a superset of every schema.
  CompiledSchema any = AnyJson();
  auto impl = std::make_shared<CompiledSchema::Impl>(any.impl());
  impl->relaxations.push_back({"schema", "/", std::string("any value: ") + first->what()});
  return CompiledSchema(std::move(impl));
}

const std::vector<Relaxation>& CompiledSchema::relaxations() const { return impl_->relaxations; }

CompiledSchema Schema::JsonObject() {
  return CompileOrThrow(R"({"type":"object"})");
}

CompiledSchema Schema::AnyJson() { return CompileOrThrow("{}"); }

}  // namespace k3::constrain
