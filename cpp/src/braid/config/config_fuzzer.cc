// libFuzzer entry point for the config parser (built with BRAID_BUILD_FUZZERS=ON under
// clang; docs/config.md, "Fuzzing"). The check is the GoogleTest harness's
// (fuzz_check.h): a crash, a sanitizer report or a violation aborts with the reason.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "braid/config/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const std::string violation = braid::fuzz::CheckConfigText(text);
  if (!violation.empty()) {
    std::fprintf(stderr, "config fuzz: %s\n", violation.c_str());
    std::abort();
  }
  return 0;
}
