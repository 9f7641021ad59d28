// libFuzzer entry point for the state loader (built with BRAID_BUILD_FUZZERS=ON under
// clang; docs/config.md, "Fuzzing"). States are checked against fuzz::kStateConfig, with
// the placeholder fingerprint of the seeds replaced by its own (fuzz_check.h).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "braid/config/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const braid::Config config =
      braid::ParseConfig(braid::fuzz::kStateConfig, braid::fuzz::kBaseDir).ValueOrDie();
  const std::string text = braid::fuzz::ExpandState(
      std::string(reinterpret_cast<const char*>(data), size), config);
  const std::string violation = braid::fuzz::CheckStateText(text, config);
  if (!violation.empty()) {
    std::fprintf(stderr, "state fuzz: %s\n", violation.c_str());
    std::abort();
  }
  return 0;
}
