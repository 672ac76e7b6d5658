// The schema compile budget (constrain.h CompileBudget): hostile schemas that
// respect every per-pattern and per-schema cap, alone or spread over a
// request's tools and response_format, are refused (strict) or relaxed (not
// strict) after a bounded amount of CPU, and what the refused compile built is
// freed. Without the budget each of them costs seconds to minutes of one core
// and hundreds of MB to GB.
#include <doctest/doctest.h>
#include <time.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "k3/constrain/constrain.h"
#include "k3/core/error.h"

using k3::constrain::CompileBudget;
using k3::constrain::CompiledSchema;
using k3::constrain::Schema;

namespace {

// The shape of the report: a DFA of about 2^9 states per pattern, every cap
// of one pattern respected.
constexpr const char* kHeavy = "(a|b)*a(a|b){8}";

std::string Props(int count, const std::string& value_schema, const std::string& prefix = "p") {
  std::string s;
  for (int i = 0; i < count; ++i) {
    if (i) s += ',';
    s += "\"" + prefix + std::to_string(i) + "\":" + value_schema;
  }
  return s;
}

// kHeavy over another pair of letters: as costly (a text of its own for i < 12).
std::string HeavyVariant(int i) {
  const char x = char('a' + (2 * i) % 24), y = char(x + 1);
  return std::string("(") + x + "|" + y + ")*" + x + "(" + x + "|" + y + "){8}";
}

std::string PatternString(const std::string& pattern) {
  return "{\"type\":\"string\",\"pattern\":\"" + pattern + "\"}";
}

// objects x props string properties, each with `pattern`.
std::string Grid(int objects, int props, const std::string& pattern) {
  const std::string inner =
      "{\"type\":\"object\",\"properties\":{" + Props(props, PatternString(pattern)) + "}}";
  return "{\"type\":\"object\",\"properties\":{" + Props(objects, inner, "o") + "}}";
}

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

// Bytes malloc hands out now (what a refused compile must give back).
size_t HeapInUse() {
#if defined(__GLIBC__)
  return mallinfo2().uordblks;
#else
  return 0;
#endif
}

long RssKiB() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return 0;
}

// One compile's cost: CPU of this thread, heap growth left behind, and how it ended.
struct Cost {
  double cpu_s = 0;
  long heap_left = 0;  // bytes still in use after the compile (and its result) are gone
  bool refused = false;
  std::string error;
  std::vector<k3::constrain::Relaxation> relaxations;
};

Cost Measure(const std::vector<std::string>& schemas, bool strict, CompileBudget& budget) {
  Cost c;
  const size_t heap0 = HeapInUse();
  const double cpu0 = ThreadCpuSeconds();
  {
    std::vector<CompiledSchema> kept;
    for (const std::string& s : schemas) {
      try {
        kept.push_back(Schema::CompileOrThrow(s, {.strict = strict, .budget = &budget}));
        for (const auto& r : kept.back().relaxations()) c.relaxations.push_back(r);
      } catch (const k3::Error& e) {
        c.refused = true;
        c.error = e.what();
        CHECK(e.code() == k3::ErrorCode::kInvalidArgument);
        CHECK(e.object() == k3::constrain::kBudgetObject);
        break;
      }
    }
  }
  c.cpu_s = ThreadCpuSeconds() - cpu0;
  c.heap_left = long(HeapInUse()) - long(heap0);
  return c;
}

// What every hostile case must show: refused (strict) within a second or
// two of CPU, the error naming the budget, the work charged near the cap (one
// charge may pass it by at most one automaton's own cap), and the heap back.
void ExpectRefused(const std::vector<std::string>& schemas) {
  CompileBudget budget;
  const Cost c = Measure(schemas, true, budget);
  CHECK(c.refused);
  CHECK(c.error.find("schema compile budget") != std::string::npos);
  CHECK(budget.spent());
  CHECK(budget.work() <= budget.max_work() + (uint64_t{1} << 26));
  CHECK(c.cpu_s < 2.5);
  CHECK(c.heap_left < (1 << 20));
}

}  // namespace

TEST_CASE("budget: the reported request (64 objects x 64 patterned strings) is refused fast") {
  const std::string schema = Grid(64, 64, kHeavy);
  CHECK(schema.size() > 200000);
  const long rss0 = RssKiB();
  ExpectRefused({schema});
  // The refused automata went back to the system, not only to malloc.
  CHECK(RssKiB() - rss0 < 64 * 1024);
}

TEST_CASE("budget: a compile without a budget of its own gets the default one") {
  const double cpu0 = ThreadCpuSeconds();
  try {
    (void)Schema::CompileOrThrow(Grid(64, 64, kHeavy));
    FAIL("compiled");
  } catch (const k3::Error& e) {
    CHECK(e.object() == k3::constrain::kBudgetObject);
  }
  CHECK(ThreadCpuSeconds() - cpu0 < 2.5);
}

TEST_CASE("budget: non-strict schemas past the budget are relaxed to any value, as bounded") {
  CompileBudget budget;
  const Cost c = Measure(
      {Grid(64, 64, kHeavy), Grid(64, 64, kHeavy) + " ", "{\"type\":\"integer\"}"}, false, budget);
  CHECK_FALSE(c.refused);
  CHECK(budget.spent());
  int budget_notes = 0;
  for (const auto& r : c.relaxations)
    if (r.keyword == "schema" && r.what.find("schema compile budget") != std::string::npos)
      ++budget_notes;
  CHECK(budget_notes == 3);  // the third one too: a spent budget stays spent
  CHECK(c.cpu_s < 2.5);
  CHECK(c.heap_left < (1 << 20));
}

TEST_CASE("budget: nested alternations") {
  ExpectRefused({Grid(16, 64, "((a|b)|(c|(d|e)))*a((a|b)|(c|d)){7}")});
}

TEST_CASE("budget: many patterns spread over many tools share one budget") {
  std::vector<std::string> tools;
  for (int t = 0; t < 128; ++t) {
    std::string prefix = std::to_string(t);
    prefix.insert(prefix.begin(), 't');
    prefix += '_';
    std::string tool = "{\"type\":\"object\",\"properties\":{";
    tool += Props(8, PatternString(HeavyVariant(t)), prefix);
    tool += "}}";
    tools.push_back(std::move(tool));
  }
  ExpectRefused(tools);
}

TEST_CASE("budget: response_format after the tools draws on the same budget") {
  // Tools that fit on their own, then a response_format that would too.
  std::vector<std::string> request(3, Grid(1, 32, kHeavy));
  for (size_t i = 0; i < request.size(); ++i)
    request[i] += std::string(i, ' ');  // three distinct texts
  {
    CompileBudget alone;
    CHECK_NOTHROW((void)Schema::CompileOrThrow(request[0], {.budget = &alone}));
  }
  ExpectRefused(request);
}

TEST_CASE("budget: deep nesting, a patterned union at every level") {
  std::string alts;
  for (int i = 0; i < 8; ++i) alts += (i ? "," : "") + PatternString(HeavyVariant(i));
  std::string s = "{\"anyOf\":[" + alts + "]}";
  for (int d = 0; d < 60; ++d)
    s = "{\"type\":\"object\",\"properties\":{\"x\":" + s + ",\"y\":{\"anyOf\":[" + alts +
        "]}},\"required\":[\"x\"]}";
  ExpectRefused({s});
}

TEST_CASE("budget: mutually recursive $refs unrolled over patterned alternatives") {
  // Each reference expands up to kMaxRefRecursion times inside the others:
  // every combination of expansion counts compiles its patterns anew.
  std::string alts;
  for (int i = 0; i < 8; ++i) alts += PatternString(HeavyVariant(i + 8)) + ",";
  std::string defs;
  for (int d = 0; d < 3; ++d)
    defs += std::string(d ? "," : "") + "\"n" + std::to_string(d) + "\":{\"anyOf\":[" + alts +
            "{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#/$defs/n0\"},"
            "\"b\":{\"$ref\":\"#/$defs/n1\"},\"c\":{\"$ref\":\"#/$defs/n2\"}}}]}";
  ExpectRefused({"{\"$defs\":{" + defs + "},\"$ref\":\"#/$defs/n0\"}"});
}

TEST_CASE("budget: properties past the cap are counted before their schemas compile") {
  const std::string s =
      "{\"type\":\"object\",\"properties\":{" + Props(2000, PatternString(kHeavy)) + "}}";
  for (bool strict : {true, false}) {
    CompileBudget budget;
    const double cpu0 = ThreadCpuSeconds();
    try {
      CompiledSchema c = Schema::CompileOrThrow(s, {.strict = strict, .budget = &budget});
      CHECK_FALSE(strict);
      CHECK(c.relaxations().size() == 1);
      CHECK(c.relaxations()[0].keyword == "properties");
    } catch (const k3::Error& e) {
      CHECK(strict);
      CHECK(std::string(e.what()).find("more than 64 properties") != std::string::npos);
    }
    CHECK(budget.work() < (uint64_t{1} << 20));  // no pattern compiled
    CHECK(ThreadCpuSeconds() - cpu0 < 0.5);
  }
}

TEST_CASE("budget: ordinary schemas fit, and a compiled schema says what it holds") {
  CompileBudget budget;
  const CompiledSchema small = Schema::CompileOrThrow(
      R"({"type":"object","properties":{"a":{"type":"string"}}})", {.budget = &budget});
  CHECK_FALSE(budget.spent());
  CHECK(small.bytes() > 0);
  const CompiledSchema heavy = Schema::CompileOrThrow(PatternString(kHeavy), {.budget = &budget});
  // The pattern's automaton (about 2^9 states with their length table) is counted.
  CHECK(heavy.bytes() > small.bytes() + 16 * 1024);
  CHECK(budget.bytes() >= heavy.bytes() / 2);
}
