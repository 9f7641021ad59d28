// Input hardening of the config parser (limits_internal.h): UTF-8, nesting depth, the
// alias visit budget, key path segments, and EscapeForMessage.
#include "braid/config/limits_internal.h"

#include <cctype>
#include <vector>

#include "braid/config/config.h"

namespace braid {
namespace internal {
namespace {

// Values the parser may still visit in this thread's ParseConfig: every element of a
// list or mapping that it walks costs one. A document without aliases costs less than
// its size in bytes; a `*alias` stands for a whole anchored node, so only aliases can
// exceed it (an alias bomb: lists of aliases of lists of aliases ...).
thread_local int64_t t_visit_budget = 0;

bool IsIdentifier(const std::string& key) {
  if (key.empty() || key.size() > 64) return false;  // a long key is quoted and cut
  for (unsigned char ch : key) {
    if (!std::isalnum(ch) && ch != '_' && ch != '-') return false;
  }
  return true;
}

}  // namespace

size_t Utf8Length(std::string_view text, size_t i) {
  const auto ch = static_cast<unsigned char>(text[i]);
  size_t len = 0;
  uint32_t min = 0, cp = 0;
  if ((ch & 0xE0) == 0xC0) {
    len = 2, min = 0x80, cp = ch & 0x1F;
  } else if ((ch & 0xF0) == 0xE0) {
    len = 3, min = 0x800, cp = ch & 0x0F;
  } else if ((ch & 0xF8) == 0xF0) {
    len = 4, min = 0x10000, cp = ch & 0x07;
  }
  if (len == 0 || i + len > text.size()) return 0;
  for (size_t k = 1; k < len; ++k) {
    const auto cont = static_cast<unsigned char>(text[i + k]);
    if ((cont & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (cont & 0x3F);
  }
  return cp >= min && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF) ? len : 0;
}

std::string Join(const std::string& parent, const std::string& key) {
  if (IsIdentifier(key)) return parent.empty() ? key : parent + "." + key;
  std::string quoted;
  for (char ch : key.substr(0, 64)) {
    if (ch == '"' || ch == '\\') quoted += '\\';
    quoted += ch;
  }
  return parent + "[\"" + EscapeForMessage(quoted, 80) +
         (key.size() > 64 ? "...\"]" : "\"]");
}

// Rejects containers nested deeper than kMaxConfigDepth before yaml-cpp sees the text:
// its parser recurses once per level (up to 2000, then throws), which a small thread
// stack or a sanitizer's larger frames may not hold. The depth is estimated from the
// text: block indentation levels and compact "- " / "? " entries, plus flow brackets
// outside quotes and comments. It never under-counts a document yaml-cpp would parse.
Status CheckNestingDepth(const std::string& text) {
  std::vector<size_t> indents;  // columns of the open block levels
  size_t block = 0;             // block levels of the current line
  int64_t flow = 0;
  size_t line = 1, line_begin = 0;
  char quote = 0;  // '"' or '\'' inside a quoted scalar
  bool line_start = true;
  auto too_deep = [&](size_t at) {
    return ConfigError("config", "nested deeper than " + std::to_string(kMaxConfigDepth) +
                                     " levels at line " + std::to_string(line) +
                                     ", column " + std::to_string(at - line_begin + 1) +
                                     " (the limit on nesting; a config needs 8)");
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (ch == '\n') {
      ++line;
      line_begin = i + 1;
      line_start = true;
      continue;
    }
    if (quote != 0) {
      if (quote == '"' && ch == '\\') {
        if (i + 1 < text.size() && text[i + 1] != '\n') ++i;
      } else if (ch == quote) {
        if (quote == '\'' && i + 1 < text.size() && text[i + 1] == '\'') {
          ++i;  // '' inside a single-quoted scalar
        } else {
          quote = 0;
        }
      }
      continue;
    }
    if (line_start && flow == 0) {
      line_start = false;
      size_t j = i;
      while (j < text.size() && text[j] == ' ') ++j;
      if (j == text.size() || text[j] == '\n' || text[j] == '\r' || text[j] == '#') {
        i = j - 1;  // blank or comment-only line: no level
        continue;
      }
      while (!indents.empty() && indents.back() >= j - line_begin) indents.pop_back();
      indents.push_back(j - line_begin);
      // Compact nested entries on one line: "- - - x", "- ? x".
      while (j + 1 < text.size() && (text[j] == '-' || text[j] == '?') &&
             (text[j + 1] == ' ' || text[j + 1] == '\t')) {
        j += 2;
        while (j < text.size() && text[j] == ' ') ++j;
        indents.push_back(j - line_begin);
      }
      block = indents.size();
      if (block > size_t{kMaxConfigDepth}) return too_deep(j);
      i = j - 1;
      continue;
    }
    line_start = false;
    const char prev = i == line_begin ? ' ' : text[i - 1];
    const bool after_space = prev == ' ' || prev == '\t' || prev == '\r';
    const bool token_start =
        after_space || (flow > 0 && (prev == '[' || prev == '{' || prev == ',' ||
                                     prev == ':'));
    if (ch == '#' && after_space) {
      while (i + 1 < text.size() && text[i + 1] != '\n') ++i;
    } else if ((ch == '"' || ch == '\'') && token_start) {
      quote = ch;
    } else if ((ch == '[' || ch == '{') && (flow > 0 || token_start)) {
      ++flow;
      if (static_cast<int64_t>(block) + flow > kMaxConfigDepth) return too_deep(i);
    } else if ((ch == ']' || ch == '}') && flow > 0) {
      --flow;
    }
  }
  return Status::OK();
}

// YAML is Unicode text, and every name and path of a config reaches JSON (plans, states,
// reports), whose writer throws on invalid UTF-8: reject it up front, with its position.
Status CheckUtf8(const std::string& text) {
  size_t line = 1, line_begin = 0;
  for (size_t i = 0; i < text.size();) {
    const auto ch = static_cast<unsigned char>(text[i]);
    if (ch < 0x80) {
      if (ch == '\n') line_begin = i + 1, ++line;
      ++i;
      continue;
    }
    const size_t len = Utf8Length(text, i);
    if (len == 0) {
      return ConfigError("config", "not valid UTF-8 at line " + std::to_string(line) +
                                       ", column " + std::to_string(i - line_begin + 1) +
                                       " (byte " + EscapeForMessage(text.substr(i, 1)) +
                                       ")");
    }
    i += len;
  }
  return Status::OK();
}

void SetVisitBudget(int64_t values) { t_visit_budget = values; }

Status Visit(size_t elements, const std::string& path) {
  t_visit_budget -= static_cast<int64_t>(elements);
  if (t_visit_budget < 0) {
    return ConfigError(path.empty() ? "config" : path,
                       "aliases expand the document to more values than it has bytes; "
                       "write the repeated values out");
  }
  return Status::OK();
}

std::optional<int64_t> Product(std::initializer_list<int64_t> factors) {
  int64_t out = 1;
  for (int64_t f : factors) {
    if (__builtin_mul_overflow(out, f, &out)) return std::nullopt;
  }
  return out;
}

}  // namespace internal

std::string EscapeForMessage(std::string_view text, size_t max_bytes) {
  std::string out;
  size_t i = 0;
  auto hex = [&out](unsigned char ch) {
    static const char kDigits[] = "0123456789ABCDEF";
    out += "\\x";
    out += kDigits[ch >> 4];
    out += kDigits[ch & 15];
  };
  while (i < text.size() && out.size() < max_bytes) {
    const auto ch = static_cast<unsigned char>(text[i]);
    if (ch < 0x80) {
      if (ch < 0x20 || ch == 0x7f) {
        hex(ch);
      } else {
        out += static_cast<char>(ch);
      }
      ++i;
      continue;
    }
    // A well-formed UTF-8 sequence is copied; any other byte is written as \xNN.
    const size_t len = internal::Utf8Length(text, i);
    if (len > 0) {
      out.append(text.substr(i, len));
      i += len;
    } else {
      hex(ch);
      ++i;
    }
  }
  if (i < text.size()) out += "... (" + std::to_string(text.size()) + " bytes)";
  return out;
}

}  // namespace braid
