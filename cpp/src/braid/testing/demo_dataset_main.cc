// braid_demo_dataset DIR [SEQ_LEN [MICRO_BATCHES [SCALE]]]: writes MakeDemoDataset's
// three token sources and DIR/demo.yaml (one DP rank), and prints the config's path. The
// C++ example's test runs on it (examples/cpp/CMakeLists.txt); a test tool, not
// installed.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "braid/testing/parquet_fixture.h"

int main(int argc, char** argv) {
  if (argc < 2 || argc > 5) {
    std::fprintf(stderr, "usage: %s DIR [SEQ_LEN [MICRO_BATCHES [SCALE]]]\n", argv[0]);
    return 2;
  }
  const int64_t seq_len = argc > 2 ? std::atoll(argv[2]) : 512;
  const int64_t micro_batches = argc > 3 ? std::atoll(argv[3]) : 4;
  const double scale = argc > 4 ? std::atof(argv[4]) : 0.05;
  auto demo = braid::testing::MakeDemoDataset(argv[1], /*seed=*/7, seq_len, /*dp=*/1,
                                              micro_batches, scale);
  if (!demo.ok()) {
    std::fprintf(stderr, "%s\n", demo.status().ToString().c_str());
    return 1;
  }
  std::printf("%s\n", demo->config_path.c_str());
  return 0;
}
