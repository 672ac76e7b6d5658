// $ref: local JSON-pointer references resolved, their cycles found, and each
// reference inlined (compiled once when it reaches no cycle, unrolled to a
// bound when it does).
#include <simdjson.h>

#include <cstdlib>
#include <map>

#include "k3/core/error.h"
#include "schema_compiler.h"

namespace k3::constrain {
namespace {

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

}  // namespace

element Compiler::Resolve(const std::string& ref, const std::string& ptr) {
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

const std::vector<std::string>& Compiler::RefsBelow(const std::string& ref) {
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
    budget_.Charge(1, 0);
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

bool Compiler::Cyclic(const std::string& ref) {
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

uint32_t Compiler::CompileRef(const std::string& ref, const std::string& ptr, int depth) {
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

}  // namespace k3::constrain
