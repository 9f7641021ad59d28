// Input hardening of the config parser (docs/config.md, "Errors and limits").
//
// What keeps any text, however hostile, from crashing or stalling ParseConfig, and its
// messages one unambiguous line: the UTF-8 and nesting-depth checks that run before
// yaml-cpp sees the text, the visit budget that bounds how often aliases are walked, key
// path segments quoted when a key is not an identifier, and overflow-checked products.
// The parser (parse.cc and its neighbours) calls these; nothing here reads YAML.
//
// Thread-safe: pure functions, except the visit budget, which is per thread (one
// ParseConfig call sets it and spends it on its own thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

#include "braid/status.h"

namespace braid::internal {

/// The length of the well-formed UTF-8 sequence of 2-4 bytes at text[i] (no overlong
/// forms, surrogates or values above U+10FFFF), or 0.
size_t Utf8Length(std::string_view text, size_t i);

/// `parent.key`, or `parent["key"]` (escaped, cut) for a key that is not an identifier,
/// so a user's odd key never makes the path ambiguous or the message more than one line.
std::string Join(const std::string& parent, const std::string& key);

/// Fails (key "config", with a line and column) for text nested deeper than
/// kMaxConfigDepth, estimated from the text without parsing it (see limits.cc).
Status CheckNestingDepth(const std::string& text);

/// Fails (key "config", with a line and column) for text that is not valid UTF-8.
Status CheckUtf8(const std::string& text);

/// Sets this thread's visit budget: the values the parser may still visit.
void SetVisitBudget(int64_t values);

/// Spends `elements` of the visit budget (a list or mapping walked); fails naming `path`
/// (or "config") once only aliases can have spent it.
Status Visit(size_t elements, const std::string& path);

/// Overflow-checked product of positive sizes; nullopt when it exceeds int64.
std::optional<int64_t> Product(std::initializer_list<int64_t> factors);

}  // namespace braid::internal
