// A uniquely named temporary folder for tests, removed with everything in it when the
// object goes out of scope. Thread-compatible.
#pragma once

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <string>
#include <system_error>

namespace braid::testing {

class ScopedTempDir {
 public:
  /// Creates `<system temp>/<prefix>-<pid>-<counter>-<time>`.
  explicit ScopedTempDir(const std::string& prefix = "braid-test") {
    static std::atomic<int64_t> counter{0};
    const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
    path_ = std::filesystem::temp_directory_path() /
            (prefix + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) +
             "-" + std::to_string(now));
    std::filesystem::create_directories(path_);
  }
  ~ScopedTempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  /// `path() / name` as a string.
  std::string Sub(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace braid::testing
