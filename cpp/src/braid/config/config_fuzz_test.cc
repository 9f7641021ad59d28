// Seeded mutation fuzzing of the config parser (ParseConfig) and the state loader
// (PlannerStateFromJson): documents from the seed corpus (testdata/fuzz_corpus/) are
// mutated structurally (keys deleted, duplicated, renamed, retyped; values swapped, set
// to extremes, nested, lengthened) and as bytes (truncated, flipped, spliced), and every
// outcome must pass fuzz_check.h. Plus regression cases for what the harness found.
//
// BRAID_FUZZ_CASES (default 10000) sets the cases per document kind, BRAID_FUZZ_SEED the
// base seed; case i's input depends only on (seed, i), and a failure prints both.
// BRAID_FUZZ_VERBOSE=1 prints every case slower than 50 ms.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "braid/config/config.h"
#include "braid/config/fuzz_check.h"
#include "braid/plan/step_plan.h"
#include "braid/testing/temp_dir.h"

namespace braid {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using Clock = std::chrono::steady_clock;

// A case slower than this fails the test (a sanitized build parses a case in ~1 ms).
constexpr double kCaseSeconds = 5.0;
// A case still running after this is a hang: the watchdog prints it and aborts.
constexpr double kHangSeconds = 60.0;
// The whole run of one document kind must finish within this.
constexpr double kRunSeconds = 300.0;
// Mutated documents are cut to this size (the built deep-nesting ones are larger).
constexpr size_t kMaxCaseBytes = 256 << 10;

int64_t EnvInt(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtoll(v, nullptr, 10) : fallback;
}

std::string ReadFile(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::filesystem::path CorpusDir() {
  return std::filesystem::path(BRAID_SOURCE_DIR) /
         "cpp/src/braid/config/testdata/fuzz_corpus";
}

std::vector<std::pair<std::string, std::string>> LoadCorpus(const std::string& kind) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& e : std::filesystem::directory_iterator(CorpusDir() / kind)) {
    out.emplace_back(e.path().filename().string(), ReadFile(e.path()));
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Aborts the process, naming the case, if a case runs past kHangSeconds: a hang must
// not stall CI silently.
class Watchdog {
 public:
  Watchdog() : thread_([this] { Run(); }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void Arm(std::string what) {
    std::lock_guard<std::mutex> lock(mu_);
    what_ = std::move(what);
    since_ = Clock::now();
    armed_ = true;
  }
  void Disarm() {
    std::lock_guard<std::mutex> lock(mu_);
    armed_ = false;
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      cv_.wait_for(lock, std::chrono::milliseconds(100));
      if (armed_ && std::chrono::duration<double>(Clock::now() - since_).count() >
                        kHangSeconds) {
        std::fprintf(stderr, "fuzz: hang (> %.0f s) in %s\n", kHangSeconds,
                     what_.c_str());
        std::abort();
      }
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false, armed_ = false;
  std::string what_;
  Clock::time_point since_;
  std::thread thread_;
};

// The document tree the structural mutations work on.
struct Tree {
  enum Kind { kScalar, kMap, kSeq } kind = kScalar;
  std::string scalar;   // kScalar: the text
  bool quoted = false;  // kScalar: a string (emitted quoted), else plain (numbers, bools)
  std::vector<std::pair<std::string, Tree>> map;
  std::vector<Tree> seq;
};

Tree FromYaml(const YAML::Node& n) {
  Tree t;
  if (n.IsMap()) {
    t.kind = Tree::kMap;
    for (const auto& kv : n) t.map.emplace_back(kv.first.Scalar(), FromYaml(kv.second));
  } else if (n.IsSequence()) {
    t.kind = Tree::kSeq;
    for (const auto& v : n) t.seq.push_back(FromYaml(v));
  } else {
    t.scalar = n.IsNull() ? "null" : n.Scalar();
    t.quoted = n.Tag() == "!";
  }
  return t;
}

Tree FromJson(const nlohmann::ordered_json& j) {
  Tree t;
  if (j.is_object()) {
    t.kind = Tree::kMap;
    for (const auto& [k, v] : j.items()) t.map.emplace_back(k, FromJson(v));
  } else if (j.is_array()) {
    t.kind = Tree::kSeq;
    for (const auto& v : j) t.seq.push_back(FromJson(v));
  } else if (j.is_string()) {
    t.scalar = j.get<std::string>();
    t.quoted = true;
  } else {
    t.scalar = j.dump();
  }
  return t;
}

bool NeedsQuotes(const std::string& s) {
  if (s.empty() || s.front() == ' ' || s.back() == ' ') return true;
  return s.find_first_of(":#[]{},&*!|>'\"%@`\n\r\t\\-?") != std::string::npos;
}

// `s` double-quoted; bytes >= 0x80 stay raw (invalid UTF-8 reaches the parser).
std::string Quote(const std::string& s, bool json) {
  std::string out = "\"";
  for (char ch : s) {
    const auto u = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (u < 0x20 || u == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), json ? "\\u%04x" : "\\x%02x", u);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::string Key(const std::string& k, bool json) {
  return json || NeedsQuotes(k) ? Quote(k, json) : k;
}

std::string Scalar(const Tree& t, bool json) {
  return t.quoted || (!json && NeedsQuotes(t.scalar)) ? Quote(t.scalar, json) : t.scalar;
}

// Flow style; JSON when `json` (quoted keys, \u escapes).
void EmitFlow(const Tree& t, bool json, std::string* out) {
  if (t.kind == Tree::kScalar) {
    *out += Scalar(t, json);
  } else if (t.kind == Tree::kSeq) {
    *out += '[';
    for (size_t i = 0; i < t.seq.size(); ++i) {
      if (i > 0) *out += ", ";
      EmitFlow(t.seq[i], json, out);
    }
    *out += ']';
  } else {
    *out += '{';
    for (size_t i = 0; i < t.map.size(); ++i) {
      if (i > 0) *out += ", ";
      *out += Key(t.map[i].first, json) + ": ";
      EmitFlow(t.map[i].second, json, out);
    }
    *out += '}';
  }
}

// Block style (indented); small or scalar children inline in flow style.
void EmitBlock(const Tree& t, size_t indent, std::string* out) {
  const std::string pad(indent, ' ');
  auto child = [&](const Tree& c) {
    if (c.kind == Tree::kScalar || (c.kind == Tree::kMap && c.map.empty()) ||
        (c.kind == Tree::kSeq && c.seq.empty())) {
      *out += ' ';
      EmitFlow(c, false, out);
      *out += '\n';
    } else {
      *out += '\n';
      EmitBlock(c, indent + 2, out);
    }
  };
  if (t.kind == Tree::kMap && !t.map.empty()) {
    for (const auto& [k, v] : t.map) {
      *out += pad + Key(k, false) + ':';
      child(v);
    }
  } else if (t.kind == Tree::kSeq && !t.seq.empty()) {
    for (const Tree& v : t.seq) {
      *out += pad + '-';
      child(v);
    }
  } else {
    *out += pad;
    EmitFlow(t, false, out);
    *out += '\n';
  }
}

void Collect(Tree* t, std::vector<Tree*>* all) {
  all->push_back(t);
  for (auto& kv : t->map) Collect(&kv.second, all);
  for (auto& v : t->seq) Collect(&v, all);
}

class Mutator {
 public:
  Mutator(uint64_t seed, fuzz::Doc doc) : rng_(seed), doc_(doc) {}

  size_t Below(size_t n) {
    return n == 0 ? 0 : std::uniform_int_distribution<size_t>(0, n - 1)(rng_);
  }
  bool OneIn(size_t n) { return Below(n) == 0; }

  const std::string& Pick(const std::vector<std::string>& v) {
    return v[Below(v.size())];
  }

  std::string KeyName() {
    const auto& names =
        doc_ == fuzz::Doc::kConfig ? fuzz::ConfigKeyNames() : fuzz::StateKeyNames();
    if (!OneIn(4)) {
      auto it = names.begin();
      std::advance(it, Below(names.size()));
      return *it;
    }
    return Pick({"", "unknown_key", "Batch", "a.b", "[0]", "\"q\"", "key with spaces",
                 "\xff\xfe", "caf\xc3\xa9", std::string(300, 'k'), "<<", "~", "null",
                 "0", "-1", "weights", "web", "code"});
  }

  std::string Extreme() {
    return Pick({"0", "-0", "1", "-1", "2", "3", "1024", "4096", "-4096",
                 "2147483647", "2147483648", "-2147483649", "4294967296",
                 "4611686018427387904", "4611686018427387905",
                 "9223372036854775807", "-9223372036854775808", "9223372036854775808",
                 "18446744073709551615", "18446744073709551616",
                 "99999999999999999999999999999", "1e308", "-1e308", "1e999", "-1e999",
                 "1e-320", "4.9e-324", "0.5", "0.49999999999", "1.5", "-0.0", ".nan",
                 ".NaN", ".inf", "-.inf", "NaN", "nan", "inf", "Infinity",
                 "0x7fffffffffffffff",
                 "0x8000000000000000", "0o777", "1_000", "+12", "1e3", "true", "false",
                 "yes", "off", "null", "~", "", "split", "skip", "world", "dp", "tp",
                 "[]", "{}"});
  }

  std::string Bytes(size_t n) {
    std::string s;
    for (size_t i = 0; i < n; ++i) {
      switch (Below(4)) {
        case 0: s += static_cast<char>(Below(256)); break;
        case 1:
          s += Pick({"\xff", "\xc3\x28", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xc0\xaf",
                     "\xe2\x82", "\xf0\x9f\x98\x80", "\xef\xbb\xbf"});
          break;
        default: s += static_cast<char>('a' + Below(26)); break;
      }
    }
    return s;
  }

  Tree RandomScalar() {
    Tree t;
    t.scalar = OneIn(3) ? Bytes(1 + Below(12)) : Extreme();
    t.quoted = OneIn(3);
    return t;
  }

  void Mutate(Tree* root) {
    std::vector<Tree*> all;
    Collect(root, &all);
    Tree* t = all[Below(all.size())];
    switch (Below(14)) {
      case 0:  // delete a key or an element
        if (t->kind == Tree::kMap && !t->map.empty()) {
          t->map.erase(t->map.begin() + static_cast<ptrdiff_t>(Below(t->map.size())));
        } else if (t->kind == Tree::kSeq && !t->seq.empty()) {
          t->seq.erase(t->seq.begin() + static_cast<ptrdiff_t>(Below(t->seq.size())));
        }
        break;
      case 1:  // duplicate a key (or an element)
        if (t->kind == Tree::kMap && !t->map.empty()) {
          auto kv = t->map[Below(t->map.size())];
          t->map.insert(t->map.begin() + static_cast<ptrdiff_t>(Below(t->map.size() + 1)),
                        std::move(kv));
        } else if (t->kind == Tree::kSeq && !t->seq.empty()) {
          t->seq.push_back(t->seq[Below(t->seq.size())]);
        }
        break;
      case 2:  // rename a key
        if (t->kind == Tree::kMap && !t->map.empty()) {
          t->map[Below(t->map.size())].first = KeyName();
        }
        break;
      case 3:  // add a (known or unknown) key
        if (t->kind == Tree::kMap) t->map.emplace_back(KeyName(), RandomScalar());
        break;
      case 4: {  // retype
        Tree old = *t;
        Tree n;
        switch (Below(5)) {
          case 0: n = RandomScalar(); break;
          case 1: n.kind = Tree::kMap; break;
          case 2: n.kind = Tree::kSeq; break;
          case 3: n.kind = Tree::kSeq; n.seq.push_back(std::move(old)); break;
          default:
            n.kind = Tree::kMap;
            n.map.emplace_back(KeyName(), std::move(old));
            break;
        }
        *t = std::move(n);
        break;
      }
      case 5:
      case 6: {  // an extreme scalar
        Tree n;
        n.scalar = Extreme();
        n.quoted = OneIn(6);
        *t = std::move(n);
        break;
      }
      case 7: {  // swap: a copy of another node here
        Tree copy = *all[Below(all.size())];
        *t = std::move(copy);
        break;
      }
      case 8: {  // nest a few levels, sometimes past the depth limit
        const size_t levels = OneIn(20) ? 60 + Below(10) : 1 + Below(4);
        for (size_t i = 0; i < levels; ++i) {
          Tree n;
          n.kind = OneIn(2) ? Tree::kSeq : Tree::kMap;
          if (n.kind == Tree::kSeq) {
            n.seq.push_back(std::move(*t));
          } else {
            n.map.emplace_back(KeyName(), std::move(*t));
          }
          *t = std::move(n);
        }
        break;
      }
      case 9: {  // a long string
        Tree n;
        n.quoted = !OneIn(4);
        n.scalar =
            OneIn(2) ? std::string(1000 + Below(20000), 'x') : Bytes(100 + Below(2000));
        *t = std::move(n);
        break;
      }
      case 10:  // invalid UTF-8 in a scalar or a key
        if (t->kind == Tree::kScalar) {
          t->scalar.insert(Below(t->scalar.size() + 1), Bytes(1 + Below(3)));
        } else if (t->kind == Tree::kMap && !t->map.empty()) {
          t->map[Below(t->map.size())].first += Bytes(2);
        }
        break;
      case 11:  // grow a list (many sources, long schedules)
        if (t->kind == Tree::kSeq && !t->seq.empty()) {
          const size_t n = OneIn(10) ? 200 + Below(800) : 1 + Below(8);
          const Tree proto = t->seq[Below(t->seq.size())];
          for (size_t i = 0; i < n; ++i) t->seq.push_back(proto);
        }
        break;
      case 12:  // a string where a number was, or the reverse
        if (t->kind == Tree::kScalar) t->quoted = !t->quoted;
        break;
      default:  // a value from elsewhere in the document
        if (t->kind == Tree::kScalar) *t = RandomScalar();
        break;
    }
  }

  // Byte-level damage after emission.
  void Damage(std::string* s) {
    if (s->empty()) return;
    switch (Below(7)) {
      case 0: s->resize(Below(s->size())); break;  // truncate
      case 1: (*s)[Below(s->size())] ^= static_cast<char>(1u << Below(8)); break;
      case 2: (*s)[Below(s->size())] = static_cast<char>(Below(256)); break;
      case 3:
        s->insert(Below(s->size() + 1),
                  Pick({": ", "- ", "[", "]", "{", "}", ",", "&a ", "*a", "*a ", "!!str ",
                        "!!binary ", "!!map ", "!<tag:x> ", "? ", "|\n", ">-\n", " # c\n",
                        "'", "\"", "\t", "\r", std::string(1, '\0'), "\n---\n", "\n...\n",
                        "%YAML 1.2\n---\n", "\xef\xbb\xbf", "<<: *a\n", "\\", "\n  ",
                        "\n- ", "&a [1, 2]", "*undefined"}));
        break;
      case 4: {  // delete a range
        const size_t at = Below(s->size());
        s->erase(at, 1 + Below(std::min<size_t>(64, s->size() - at)));
        break;
      }
      case 5: {  // duplicate a range
        const size_t at = Below(s->size());
        const std::string piece = s->substr(at, 1 + Below(64));
        s->insert(Below(s->size() + 1), piece);
        break;
      }
      default: s->insert(Below(s->size() + 1), Bytes(1 + Below(4))); break;
    }
  }

  std::mt19937_64& rng() { return rng_; }

 private:
  std::mt19937_64 rng_;
  fuzz::Doc doc_;
};

// A config with `sources` sources and `phases` phases whose weights are all one aliased
// mapping of every source: the parser would visit sources * phases weights.
std::string PhaseWeightAliases(size_t sources, size_t phases) {
  std::string s = "batch: {global_tokens: 4096, seq_len: 1024}\nsources:\n";
  for (size_t i = 0; i < sources; ++i) {
    s += "  - {name: s" + std::to_string(i) + ", path: p, tokens_column: ids}\n";
  }
  s += "phases:\n  - {until_step: 1, weights: &w {";
  for (size_t i = 0; i < sources; ++i) s += (i ? ", s" : "s") + std::to_string(i) + ": 1";
  s += "}}\n";
  for (size_t p = 1; p < phases; ++p) {
    s += "  - {until_step: " + std::to_string(p + 1) + ", weights: *w}\n";
  }
  return s;
}

// Billion laughs: each level lists ten aliases of the level below (10^levels leaves).
std::string BillionLaughs(int levels) {
  std::string s = "l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n";
  for (int i = 1; i < levels; ++i) {
    s += "l" + std::to_string(i) + ": &l" + std::to_string(i) + " [";
    for (int k = 0; k < 10; ++k) s += (k ? ", *l" : "*l") + std::to_string(i - 1);
    s += "]\n";
  }
  return s;
}

// Documents built to hit the limits: deep nesting, alias bombs.
std::string Special(Mutator& m, fuzz::Doc doc) {
  const std::vector<size_t> depths = {8, 60, 63, 64, 65, 100, 1999, 2000, 5000, 100000};
  const size_t n = depths[m.Below(depths.size())];
  const bool state = doc == fuzz::Doc::kState;
  std::string s;
  switch (m.Below(state ? 3 : 7)) {
    case 0:  // flow brackets
      s = std::string(n, '[') + std::string(n, ']');
      if (state) s = "{\"version\": 1, \"x\": " + s + "}";
      break;
    case 1:  // flow mappings, as a value
      for (size_t i = 0; i < n; ++i) s += state ? "{\"a\": " : "{a: ";
      s = (state ? "" : "batch: ") + s + "1" + std::string(n, '}');
      break;
    case 2:  // unclosed
      s = (state ? "{\"sources\": " : "sources: ") +
          std::string(n, m.OneIn(2) ? '[' : '{');
      break;
    case 3:  // block mappings by indentation
      for (size_t i = 0; i < std::min<size_t>(n, 200); ++i) {
        s += std::string(i, ' ') + "a:\n";
      }
      s += std::string(std::min<size_t>(n, 200), ' ') + "b: 1\n";
      break;
    case 4:  // compact block sequences
      for (size_t i = 0; i < n; ++i) s += "- ";
      s += "x\n";
      break;
    case 5:
      s = BillionLaughs(9);
      break;
    default:
      s = PhaseWeightAliases(m.OneIn(2) ? 10 : 60, m.OneIn(2) ? 5 : 60);
      break;
  }
  return s;
}

std::string Describe(const std::string& text) {
  return EscapeForMessage(text, 600);
}

struct RunStats {
  int64_t cases = 0, accepted = 0;
  double seconds = 0, slowest = 0;
};

// Runs `cases` mutated documents of kind `doc` through `check`.
template <typename Check>
RunStats RunFuzz(fuzz::Doc doc,
                 const std::vector<std::pair<std::string, std::string>>& seeds,
                 int64_t cases, uint64_t base_seed, Check check) {
  std::vector<Tree> trees;
  for (const auto& [name, text] : seeds) {
    trees.push_back(doc == fuzz::Doc::kConfig
                        ? FromYaml(YAML::Load(text))
                        : FromJson(nlohmann::ordered_json::parse(text)));
  }
  Watchdog watchdog;
  RunStats stats;
  const auto start = Clock::now();
  int failures = 0;
  for (int64_t i = 0; i < cases; ++i) {
    const uint64_t seed = base_seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(i);
    Mutator m(seed, doc);
    std::string text;
    if (m.OneIn(40)) {
      text = Special(m, doc);
    } else {
      const size_t k = m.Below(seeds.size());
      Tree t = trees[k];
      const size_t mutations = 1 + m.Below(4);
      for (size_t j = 0; j < mutations; ++j) m.Mutate(&t);
      const bool json = doc == fuzz::Doc::kState || m.OneIn(3);
      if (json || m.OneIn(2)) {
        EmitFlow(t, json, &text);
      } else {
        EmitBlock(t, 0, &text);
      }
      // Copies of copies of long strings can reach megabytes: keep cases quick.
      if (text.size() > kMaxCaseBytes) text.resize(kMaxCaseBytes);
      if (m.OneIn(3)) {
        const size_t damage = 1 + m.Below(3);
        for (size_t j = 0; j < damage; ++j) m.Damage(&text);
      }
    }
    const std::string label = "case " + std::to_string(i) + " (BRAID_FUZZ_SEED=" +
                              std::to_string(base_seed) + ")";
    watchdog.Arm(label + ": " + Describe(text));
    const auto t0 = Clock::now();
    std::pair<std::string, bool> outcome;
    try {
      outcome = check(text, i);
    } catch (const std::exception& e) {
      outcome = {std::string("threw: ") + e.what(), false};
    }
    const auto& [violation, accepted] = outcome;
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    watchdog.Disarm();
    stats.slowest = std::max(stats.slowest, secs);
    if (secs > 0.05 && std::getenv("BRAID_FUZZ_VERBOSE") != nullptr) {
      std::printf("%s: %.1f ms, %zu bytes: %s\n", label.c_str(), secs * 1e3, text.size(),
                  EscapeForMessage(text, 120).c_str());
    }
    stats.accepted += accepted ? 1 : 0;
    ++stats.cases;
    if ((!violation.empty() || secs > kCaseSeconds) && failures < 20) {
      ++failures;
      ADD_FAILURE() << label << ": "
                    << (violation.empty() ? "took " + std::to_string(secs) + " s"
                                          : violation)
                    << "\ninput (" << text.size() << " bytes): " << Describe(text);
    }
  }
  stats.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_LT(stats.seconds, kRunSeconds) << "the fuzz run took too long";
  return stats;
}

int64_t Cases() { return std::max<int64_t>(1, EnvInt("BRAID_FUZZ_CASES", 10000)); }
uint64_t BaseSeed() { return static_cast<uint64_t>(EnvInt("BRAID_FUZZ_SEED", 20250611)); }

TEST(ConfigFuzz, SeedCorpusIsValid) {
  const auto configs = LoadCorpus("config");
  ASSERT_GE(configs.size(), 8u);
  for (const auto& [name, text] : configs) {
    auto c = ParseConfig(text, fuzz::kBaseDir);
    EXPECT_TRUE(c.ok()) << name << ": " << c.status().ToString();
    EXPECT_EQ(fuzz::CheckConfigText(text), "") << name;
  }
  auto config = ParseConfig(fuzz::kStateConfig, fuzz::kBaseDir);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  const auto states = LoadCorpus("state");
  ASSERT_GE(states.size(), 3u);
  for (const auto& [name, text] : states) {
    const std::string expanded = fuzz::ExpandState(text, *config);
    EXPECT_TRUE(PlannerStateFromJson(expanded, *config).ok()) << name;
    EXPECT_EQ(fuzz::CheckStateText(expanded, *config), "") << name;
  }
}

TEST(ConfigFuzz, MutatedConfigs) {
  const int64_t cases = Cases();
  testing::ScopedTempDir tmp;
  const RunStats s = RunFuzz(
      fuzz::Doc::kConfig, LoadCorpus("config"), cases, BaseSeed(),
      [&](const std::string& text, int64_t i) -> std::pair<std::string, bool> {
        bool ok = false;
        std::string v = fuzz::CheckConfigText(text, &ok);
        // Every 500th case also through a file: the error gains the file's name.
        if (v.empty() && i % 500 == 0) {
          const std::string path = tmp.Sub("case.yaml");
          std::ofstream(path, std::ios::binary) << text;
          auto c = LoadConfigFile(path);
          if (c.ok() != ok) v = "LoadConfigFile and ParseConfig disagree";
          if (!c.ok() && c.status().message().rfind(path + ": ", 0) != 0) {
            v = "LoadConfigFile's message does not start with the file: " +
                c.status().message();
          }
        }
        return {v, ok};
      });
  std::printf("config fuzz: %lld cases (%lld accepted) in %.2f s, slowest %.1f ms\n",
              static_cast<long long>(s.cases), static_cast<long long>(s.accepted),
              s.seconds, s.slowest * 1e3);
  EXPECT_EQ(s.cases, cases);
  // The mutations must not be so destructive that nothing parses (or so mild that
  // everything does): both outcomes are exercised.
  if (cases >= 1000) {
    EXPECT_GT(s.accepted, cases / 50);
    EXPECT_LT(s.accepted, cases / 2);
  }
}

TEST(ConfigFuzz, MutatedStates) {
  const int64_t cases = Cases();
  auto config = ParseConfig(fuzz::kStateConfig, fuzz::kBaseDir);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  const RunStats s = RunFuzz(
      fuzz::Doc::kState, LoadCorpus("state"), cases, BaseSeed(),
      [&](const std::string& text, int64_t) -> std::pair<std::string, bool> {
        const std::string expanded = fuzz::ExpandState(text, *config);
        bool ok = false;
        std::string v = fuzz::CheckStateText(expanded, *config, &ok);
        return {v, ok};
      });
  std::printf("state fuzz: %lld cases (%lld accepted) in %.2f s, slowest %.1f ms\n",
              static_cast<long long>(s.cases), static_cast<long long>(s.accepted),
              s.seconds, s.slowest * 1e3);
  EXPECT_EQ(s.cases, cases);
  if (cases >= 1000) {
    EXPECT_GT(s.accepted, cases / 50);
    EXPECT_LT(s.accepted, cases / 2);
  }
}

// The check itself: it must reject what is not a key path.
TEST(ConfigFuzz, CheckRejectsMessagesWithoutKeyPaths) {
  using fuzz::CheckError;
  using fuzz::Doc;
  EXPECT_EQ(CheckError(ConfigError("sources[1].weight", "must be >= 0"), Doc::kConfig),
            "");
  EXPECT_EQ(CheckError(ConfigError("phases[0].weights.web.schedule[1][0]", "bad"),
                       Doc::kConfig),
            "");
  EXPECT_EQ(CheckError(ConfigError("batch[\"x y\"]", "unknown key (known: a)"),
                       Doc::kConfig),
            "");
  EXPECT_EQ(CheckError(ConfigError("config", "not valid YAML at line 2, column 3: x"),
                       Doc::kConfig),
            "");
  EXPECT_EQ(CheckError(ConfigError("state.sources[0].carry", "must be a number"),
                       Doc::kState),
            "");
  EXPECT_NE(CheckError(Status::Invalid("sources: x"), Doc::kConfig), "");  // no detail
  EXPECT_NE(CheckError(DataError("sources", "x"), Doc::kConfig), "");
  EXPECT_NE(CheckError(ConfigError("config", "something failed"), Doc::kConfig), "");
  EXPECT_NE(CheckError(ConfigError("<config>", "x at line 1, column 1"), Doc::kConfig),
            "");
  EXPECT_NE(CheckError(ConfigError("batch.nope", "must be > 0"), Doc::kConfig), "");
  EXPECT_NE(CheckError(ConfigError("batch[\"x\"]", "must be > 0"), Doc::kConfig), "");
  EXPECT_NE(CheckError(ConfigError("state", "malformed: type_error"), Doc::kState), "");
  EXPECT_NE(CheckError(ConfigError("sources", "got '\xff'"), Doc::kConfig), "");
  EXPECT_NE(CheckError(ConfigError("sources", "two\nlines"), Doc::kConfig), "");
  EXPECT_NE(CheckError(ConfigError("sources", std::string(2000, 'x')), Doc::kConfig), "");
  EXPECT_NE(CheckError(ConfigError("sources[1", "x"), Doc::kConfig), "");
  EXPECT_NE(CheckError(ConfigError("sources..a", "x"), Doc::kConfig), "");
  EXPECT_NE(CheckError(ConfigError("seed", ""), Doc::kConfig), "");
}

// Regressions: what the harness (or writing it) found, one case each.

// Parses `text`, expects an error at `where` whose message has `what`, and that the
// error passes the harness's check.
void ExpectConfigError(const std::string& text, const std::string& where,
                       const std::string& what) {
  auto c = ParseConfig(text, fuzz::kBaseDir);
  ASSERT_FALSE(c.ok()) << "expected an error at " << where;
  const ErrorDetail* detail = GetErrorDetail(c.status());
  ASSERT_NE(detail, nullptr) << c.status().ToString();
  EXPECT_EQ(detail->where(), where) << c.status().message();
  EXPECT_THAT(c.status().message(), HasSubstr(what));
  EXPECT_EQ(fuzz::CheckError(c.status(), fuzz::Doc::kConfig), "");
}

std::string MinimalWith(const std::string& batch, const std::string& source_extra = "",
                        const std::string& root_extra = "") {
  return root_extra + "batch: " + batch +
         "\nsources:\n  - {name: a, path: a.parquet, tokens_column: ids" + source_extra +
         "}\n";
}

constexpr const char* kBatch = "{global_tokens: 4096, seq_len: 1024}";

// `text` with its first `from` replaced by `to`.
std::string Sub(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return at == std::string::npos ? text : text.replace(at, from.size(), to);
}

TEST(ConfigFuzzRegression, InvalidUtf8SourceNameMadeStateJsonThrow) {
  // Accepted before; PlannerStateToJson (Loader.state_dict, --state-out) then threw
  // nlohmann's type_error 316 on the name.
  ExpectConfigError(Sub(MinimalWith(kBatch), "name: a", "name: \"a\xc0\xaf\""), "config",
                    "not valid UTF-8 at line 3, column 14 (byte \\xC0)");
}

TEST(ConfigFuzzRegression, ImagePatchSizeSquareOverflowed) {
  ExpectConfigError(
      "tokenizer: {model: m}\n" +
          Sub(MinimalWith(kBatch), "tokens_column: ids",
              "text_column: t, image_column: i, "
              "image: {patch_size: 4611686018427387904, image_token_id: 1}"),
      "sources[0].image.max_pixels", "at least patch_size^2");
}

TEST(ConfigFuzzRegression, TopologyProductOverflowed) {
  ExpectConfigError(MinimalWith("{global_tokens: 4096, seq_len: 1024}", "",
                                "topology: {dp: 4294967296, tp: 4294967296}\n"),
                    "topology", "at most 2^63 - 1");
}

TEST(ConfigFuzzRegression, MicroBatchTimesBucketsOverflowed) {
  ExpectConfigError(
      MinimalWith("{global_tokens: 4096, seq_len: 1024, micro_batch_size: 4294967296}",
                  "", "topology: {dp: 4294967296}\n"),
      "batch.global_tokens", "(more than 2^63 - 1)");
}

TEST(ConfigFuzzRegression, TwiceCpOverflowed) {
  ExpectConfigError(MinimalWith("{global_tokens: 4096, seq_len: 1024}", "",
                                "topology: {cp: 9223372036854775807}\n"),
                    "batch.seq_len", "2 * topology.cp (more than 2^63 - 1)");
}

TEST(ConfigFuzzRegression, DeepNestingReachedYamlCppsRecursion) {
  // yaml-cpp recurses once per level (to 2000); the text is refused before it parses.
  ExpectConfigError(std::string(100000, '[') + std::string(100000, ']'), "config",
                    "nested deeper than 64 levels at line 1, column 64");
  ExpectConfigError("batch: " + std::string(70, '{') + "a: 1" + std::string(70, '}'),
                    "config", "nested deeper than 64 levels at line 1, column ");
  std::string block;
  for (int i = 0; i < 70; ++i) block += std::string(size_t(i) * 2, ' ') + "a:\n";
  ExpectConfigError(block, "config",
                    "nested deeper than 64 levels at line 65, column 129");
  std::string compact;
  for (int i = 0; i < 70; ++i) compact += "- ";
  ExpectConfigError(compact + "x\n", "config", "nested deeper than 64 levels");
  // Brackets inside quotes and comments, and a glob's brackets, are not nesting.
  const std::string brackets(100, '[');
  const std::string quoted = Sub(MinimalWith(kBatch), "a.parquet", '"' + brackets + '"');
  auto ok = ParseConfig("# " + brackets + "\n" + quoted, fuzz::kBaseDir);
  EXPECT_TRUE(ok.ok()) << ok.status().ToString();
  auto glob = ParseConfig("batch: {global_tokens: 4096, seq_len: 1024}\nsources:\n"
                          "  - name: a\n    path: data/[ab]*.parquet\n"
                          "    tokens_column: ids\n",
                          fuzz::kBaseDir);
  EXPECT_TRUE(glob.ok()) << glob.status().ToString();
}

TEST(ConfigFuzzRegression, PhaseWeightAliasesExpandedQuadratically) {
  // 300 phases that alias one weights mapping of 300 sources: 90,000 weights parsed
  // from 27 kB (and sources * phases * sources name comparisons before).
  ExpectConfigError(PhaseWeightAliases(300, 300), "phases[83].weights",
                    "aliases expand the document");
  EXPECT_TRUE(ParseConfig(PhaseWeightAliases(10, 10), fuzz::kBaseDir).ok());
}

TEST(ConfigFuzzRegression, BillionLaughsIsNotExpanded) {
  ExpectConfigError(BillionLaughs(9) + "batch: {global_tokens: 1, seq_len: 1}\n", "l0",
                    "unknown key");
}

TEST(ConfigFuzzRegression, LongScheduleValidationWasQuadratic) {
  // ValidateConfig evaluated every source's weight at every schedule point by a linear
  // scan: 20,000 points cost 4 * 10^8 steps. The harness's per-case bound applies.
  std::string sched = "[[0, 1]";
  for (int i = 1; i < 20000; ++i) sched += ", [" + std::to_string(i) + ", 1]";
  const std::string text = MinimalWith(kBatch, ", weight: {schedule: " + sched + "]}");
  const auto t0 = Clock::now();
  auto c = ParseConfig(text, fuzz::kBaseDir);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), kCaseSeconds);
  EXPECT_DOUBLE_EQ(c->WeightAt(0, 12345), 1.0);
}

TEST(ConfigFuzzRegression, DuplicateKeysWereFirstWins) {
  ExpectConfigError(MinimalWith("{seq_len: 1024, global_tokens: 4096, seq_len: 2048}"),
                    "batch.seq_len", "appears twice");
  ExpectConfigError(MinimalWith("{global_tokens: 4096, seq_len: 1024}") +
                        "phases: [{until_step: 5, weights: {a: 1, a: 0}}]\n",
                    "phases[0].weights.a", "appears twice");
}

TEST(ConfigFuzzRegression, NonStringKeyMadeAnEmptyPathSegment) {
  ExpectConfigError(MinimalWith("{[x]: 1, global_tokens: 4096, seq_len: 1024}"), "batch",
                    "keys must be strings at line 1, column 9");
}

TEST(ConfigFuzzRegression, OddKeysMadePathsAmbiguous) {
  ExpectConfigError(MinimalWith("{\"a.b[0]\": 1, global_tokens: 4096, seq_len: 1024}"),
                    "batch[\"a.b[0]\"]", "unknown key");
  ExpectConfigError("\"x\\ny\": 1\n", "[\"x\\x0Ay\"]", "unknown key");
  // Found with BRAID_FUZZ_SEED=7: a 10 kB identifier key was written whole.
  ExpectConfigError("? " + std::string(10000, 'x') + "\n: 1\n",
                    "[\"" + std::string(64, 'x') + "...\"]", "unknown key");
  ExpectConfigError(MinimalWith("{global_tokens: 4096, seq_len: 1024}") +
                        "phases: [{until_step: 5, weights: {\"no such\": 1}}]\n",
                    "phases[0].weights[\"no such\"]", "is not a source name");
}

TEST(ConfigFuzzRegression, LongAndControlValuesWereEchoedWhole) {
  auto c = ParseConfig(MinimalWith("{global_tokens: 4096, seq_len: 1024}",
                                   ", oversize: \"" + std::string(100000, 'x') + "\\t\""),
                       fuzz::kBaseDir);
  ASSERT_FALSE(c.ok());
  EXPECT_LT(c.status().message().size(), 300u);
  EXPECT_THAT(c.status().message(), HasSubstr("... (100001 bytes)"));
  ExpectConfigError(
      MinimalWith("{global_tokens: 4096, seq_len: 1024}", ", oversize: \"a\\tb\""),
      "sources[0].oversize", "got 'a\\x09b'");
}

TEST(ConfigFuzzRegression, SyntaxErrorsGivePositions) {
  ExpectConfigError("batch: {global_tokens: [unclosed\n", "config",
                    "not valid YAML at line ");
  ExpectConfigError("", "config", "must be a mapping (the document is empty)");
}

// State loader regressions.
class StateRegression : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = ParseConfig(fuzz::kStateConfig, fuzz::kBaseDir);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    config_ = *c;
    auto fresh = ReadFile(CorpusDir() / "state/fresh.json");
    fresh_ = fuzz::ExpandState(fresh, config_);
  }
  // The fresh seed with `from` replaced by `to` (first occurrence).
  std::string Edit(const std::string& from, const std::string& to) const {
    std::string s = fresh_;
    const size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return s.replace(at, from.size(), to);
  }
  void ExpectError(const std::string& text, const std::string& where,
                   const std::string& what) const {
    auto st = PlannerStateFromJson(text, config_);
    ASSERT_FALSE(st.ok()) << "expected an error at " << where;
    const ErrorDetail* detail = GetErrorDetail(st.status());
    ASSERT_NE(detail, nullptr);
    EXPECT_EQ(detail->where(), where) << st.status().message();
    EXPECT_THAT(st.status().message(), HasSubstr(what));
    EXPECT_EQ(fuzz::CheckError(st.status(), fuzz::Doc::kState), "");
  }
  Config config_;
  std::string fresh_;
};

TEST_F(StateRegression, WrongTypesHadNoKeyPath) {
  // Were "state: malformed: [json.exception.type_error.302] ...".
  ExpectError(Edit("\"version\":2", "\"version\":\"2\""), "state.version", "must be 2");
  ExpectError(Edit("\"step\":0", "\"step\":[0]"), "state.step",
              "must be an integer, got array");
  ExpectError(Edit("\"name\":\"web\"", "\"name\":7"), "state.sources[0].name",
              "must be a string, got number");
  ExpectError(Edit("\"carry\":0.0", "\"carry\":\"0\""), "state.sources[0].carry",
              "must be a number, got string");
  // Three sources, the first a number.
  const std::string sources = fresh_.substr(fresh_.find("\"sources\":["));
  ExpectError(Sub(fresh_, sources, "\"sources\":[7,{},{}]}"), "state.sources[0]",
              "must be a JSON object");
}

TEST_F(StateRegression, MissingKeysHadNoKeyPath) {
  // Was "state: malformed: [json.exception.out_of_range.403] key 'carry' not found".
  ExpectError(Edit("\"carry\":0.0,", ""), "state.sources[0].carry", "is required");
  ExpectError(Edit("\"step\":0,", ""), "state.step", "is required");
}

TEST_F(StateRegression, FloatPositionWasTruncated) {
  ExpectError(Edit("\"step\":0", "\"step\":1.5"), "state.step",
              "must be an integer, got number");
}

TEST_F(StateRegression, PositionsNearInt64MaxOverflowedLater) {
  ExpectError(Edit("\"step\":0", "\"step\":9223372036854775807"), "state.step",
              "must be in [0, 2^62]");
  ExpectError(Edit("\"epoch\":0", "\"epoch\":18446744073709551615"),
              "state.sources[0].epoch", "must be in [0, 2^62]");
  ExpectError(Edit("\"offset\":0", "\"offset\":-1"), "state.sources[0].offset",
              "must be in [0, 2^62], got -1");
}

TEST_F(StateRegression, HugeCarryWouldStallTheQuotaLoop) {
  // The planner hands out or takes back one token at a time until the quotas add up:
  // a carry of 1e15 tokens is 1e15 iterations; 1e300 overflowed its int64 cast.
  // (A source that deferred multimodal documents is owed a few steps at most.)
  ExpectError(Edit("\"carry\":0.0", "\"carry\":1e300"), "state.sources[0].carry",
              "within 8 * batch.global_tokens");
  ExpectError(Edit("\"carry\":0.0", "\"carry\":-65537"), "state.sources[0].carry",
              "within 8 * batch.global_tokens");
  EXPECT_TRUE(
      PlannerStateFromJson(Edit("\"carry\":0.0", "\"carry\":-65536"), config_).ok());
}

TEST_F(StateRegression, DeepNestingAndSyntaxErrors) {
  ExpectError("{\"x\": " + std::string(100000, '[') + std::string(100000, ']') + "}",
              "state", "nested deeper than 64 levels at line 1, column 70");
  ExpectError(fresh_.substr(0, 40), "state", "not valid JSON at line 1, column 41");
  ExpectError("{\"version\": 1, \"fingerprint\": \"\xff\"}", "state",
              "not valid JSON at line 1");
}

TEST_F(StateRegression, ForeignFingerprintIsEscaped) {
  ExpectError(Edit(config_.Fingerprint(), std::string(500, 'f') + "\\t"),
              "state.fingerprint", "... (");
}

}  // namespace
}  // namespace braid
