// One type's keywords: strings (lengths, patterns, formats), numbers and
// integers (bounds, multipleOf), arrays (items, tuples, uniqueItems) and
// objects (properties, required, additionalProperties, propertyNames).
#include <simdjson.h>

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <map>

#include "k3/core/error.h"
#include "k3/core/json_writer.h"
#include "regex.h"
#include "schema_compiler.h"

namespace k3::constrain {
namespace {

std::string PointerEscape(std::string_view token) {
  std::string out;
  for (char c : token) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
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

}  // namespace

std::vector<std::string> Compiler::TypeList(object o, const std::string& ptr) {
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

uint32_t Compiler::Count(object o, const char* key, const std::string& ptr, uint32_t dflt) {
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

bool Compiler::Number(object o, const char* key, const std::string& ptr, double& out) {
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

uint32_t Compiler::CompileTyped(object o, const std::string& type, const std::string& ptr, int depth) {
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
        one = CompilePattern(text, mn, mx, relax_, &left_out, &budget_);
        if (!left_out.empty())
          Relaxed("pattern", where, left_out, "left out of the pattern (a superset)");
        if (dfa) one = IntersectPatterns(*dfa, *one, mn, mx, &budget_);
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
  // The cap on declared properties, counted before their schemas compile:
  // past it the object is relaxed (or refused) whatever those schemas hold.
  if (std::count_if(props.begin(), props.end(), [](const auto& kv) {
        return !(kv.second.type() == element_type::BOOL && !bool(kv.second));
      }) > kMaxProperties) {
    Relaxed("properties", ptr, "more than " + std::to_string(kMaxProperties) + " properties",
            "any object");
    return AnyObject();
  }
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

std::string Compiler::KeyBytes(const std::string& key) {
  std::string q;
  AppendJsonString(q, key, InvalidUtf8::kPassThrough);
  return q.substr(1, q.size() - 2);
}

bool Compiler::ReadBound(object o, const char* key, const std::string& ptr, Bound& out) {
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

std::string Compiler::BoundText(const Bound& b) {
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

uint32_t Compiler::CompileNumber(object o, bool integer, const std::string& ptr) {
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

}  // namespace k3::constrain
