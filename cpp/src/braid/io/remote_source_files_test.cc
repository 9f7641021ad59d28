// SourceFiles on remote storage through the C++ core alone: no Python in this process, so
// nothing but Braid registers Arrow's filesystems. The S3 server is moto's (a real
// S3-compatible server), started as a child process on loopback with the build's Python;
// its fixtures are uploaded by a child boto3 process.
#include "braid/io/source_files.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <arrow/api.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>
#include <vector>

#include "braid/testing/parquet_fixture.h"
#include "braid/testing/temp_dir.h"

extern char** environ;

namespace braid {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using Docs = std::vector<std::vector<int32_t>>;

int FreePort() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  ::getsockname(s, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(s);
  return ntohs(addr.sin_port);
}

bool Accepts(int port) {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(s);
  return ok;
}

pid_t Spawn(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  if (posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&actions);
  return pid;
}

int Wait(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// moto's S3 server on a free loopback port, for the life of the object.
class S3Server {
 public:
  S3Server() : port_(FreePort()) {
    ::setenv("AWS_ACCESS_KEY_ID", "braid-test", 1);
    ::setenv("AWS_SECRET_ACCESS_KEY", "braid-test", 1);
    ::setenv("AWS_DEFAULT_REGION", "us-east-1", 1);
    ::setenv("AWS_EC2_METADATA_DISABLED", "true", 1);
    pid_ = Spawn({BRAID_PYTHON, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                  std::to_string(port_)});
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (pid_ > 0 && !Accepts(port_) && std::chrono::steady_clock::now() < deadline) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;  // exited: moto is not installed
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    started_ = pid_ > 0 && Accepts(port_);
  }
  ~S3Server() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      Wait(pid_);
    }
  }
  bool started() const { return started_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

  // Creates `bucket` and uploads local files as (key, path) pairs; true on success.
  bool Upload(const std::string& bucket,
              const std::vector<std::pair<std::string, std::string>>& objects) {
    std::string script =
        "import sys, boto3\n"
        "c = boto3.client('s3', endpoint_url=sys.argv[1], region_name='us-east-1')\n"
        "c.create_bucket(Bucket=sys.argv[2])\n"
        "for key, path in zip(sys.argv[3::2], sys.argv[4::2]):\n"
        "    c.upload_file(path, sys.argv[2], key)\n";
    std::vector<std::string> args = {BRAID_PYTHON, "-c", script, url(), bucket};
    for (const auto& [key, path] : objects) {
      args.push_back(key);
      args.push_back(path);
    }
    const pid_t pid = Spawn(args);
    return pid > 0 && Wait(pid) == 0;
  }

 private:
  int port_;
  pid_t pid_ = -1;
  bool started_ = false;
};

// Every document of every file, read through SourceFiles.
Docs ReadAll(SourceFiles* files) {
  Docs out;
  for (size_t f = 0; f < files->files().size(); ++f) {
    for (size_t rg = 0; rg < files->files()[f].row_group_rows.size(); ++rg) {
      auto array = files->ReadTokens(int(f), int(rg));
      EXPECT_TRUE(array.ok()) << array.status().ToString();
      if (!array.ok()) return out;
      const auto& list = static_cast<const arrow::ListArray&>(**array);
      const auto& values = static_cast<const arrow::Int32Array&>(*list.values());
      for (int64_t i = 0; i < list.length(); ++i) {
        out.emplace_back(values.raw_values() + list.value_offset(i),
                         values.raw_values() + list.value_offset(i) + list.value_length(i));
      }
    }
  }
  return out;
}

SourceConfig TokenSource(const std::string& path) {
  SourceConfig source;
  source.name = "web";
  source.path = path;
  source.tokens_column = "input_ids";
  return source;
}

TEST(SourceFilesRemoteTest, S3SourceReadsLikeItsLocalCopyWithAndWithoutTheCache) {
  testing::ScopedTempDir dir("braid-source-files");
  std::vector<std::pair<std::string, std::string>> objects;
  Docs expected;
  testing::LengthSpec lengths;
  lengths.median_tokens = 30;
  lengths.max_tokens = 200;
  testing::TokenFileOptions options;
  options.row_group_rows = 16;
  for (int f = 0; f < 3; ++f) {
    const Docs docs = testing::RandomDocs(40, lengths, /*seed=*/17 + f);
    const std::string path = dir.Sub("part-" + std::to_string(f) + ".parquet");
    ASSERT_TRUE(testing::WriteTokenFile(path, docs, options).ok());
    objects.emplace_back("corpus/part-" + std::to_string(f) + ".parquet", path);
    expected.insert(expected.end(), docs.begin(), docs.end());
  }
  S3Server server;
  ASSERT_TRUE(server.started())
      << "moto's S3 server did not start with " << BRAID_PYTHON
      << " (install requirements-dev.txt: moto[server])";
  ASSERT_TRUE(server.Upload("braid-cc", objects));

  // The first S3 use in this process: Braid itself must make s3:// known to Arrow.
  SourceConfig source = TokenSource("s3://braid-cc/corpus/*.parquet");
  source.storage_endpoint = server.url();
  source.storage_region = "us-east-1";
  auto files = SourceFiles::Open(source, "sources[0]");
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  ASSERT_EQ((*files)->files().size(), 3u);
  EXPECT_EQ(ReadAll(files->get()), expected);

  // Through a cache that holds one file at a time: every file is read, none is lost.
  source.cache_dir = dir.Sub("cache");
  source.cache_max_bytes = static_cast<int64_t>(
      std::filesystem::file_size(objects.front().second) * 3 / 2);
  auto cached = SourceFiles::Open(source, "sources[0]");
  ASSERT_TRUE(cached.ok()) << cached.status().ToString();
  EXPECT_EQ(ReadAll(cached->get()), expected);
  // Again, backwards: files come back after eviction.
  for (int f = 2; f >= 0; --f) {
    for (size_t rg = 0; rg < (*cached)->files()[size_t(f)].row_group_rows.size(); ++rg) {
      ASSERT_TRUE((*cached)->ReadTokens(f, int(rg)).ok());
    }
  }
  int64_t cached_bytes = 0;
  for (const auto& e : std::filesystem::directory_iterator(source.cache_dir)) {
    if (e.is_regular_file()) cached_bytes += static_cast<int64_t>(e.file_size());
  }
  // One file is pinned by the open reader; the folder keeps its budget.
  EXPECT_GT(cached_bytes, 0);
  EXPECT_LE(cached_bytes, source.cache_max_bytes);
}

TEST(SourceFilesRemoteTest, HdfsIsRecognizedAndItsErrorNamesThePath) {
  // No Hadoop here: the URI must reach Arrow's HDFS filesystem (which then cannot load
  // libhdfs or connect), not fail as an unknown scheme.
  std::shared_ptr<arrow::fs::FileSystem> fs;
  std::vector<std::string> paths;
  const std::string path = "hdfs://127.0.0.1:1/corpus/*.parquet";
  const Status st = ResolveFiles(path, "sources[0]", &fs, &paths);
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr(path));
  EXPECT_THAT(st.message(), HasSubstr("sources[0].path"));
  EXPECT_THAT(st.message(), HasSubstr("JVM"));
  EXPECT_THAT(st.message(), Not(HasSubstr("Unrecognized filesystem")));
  EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.message();
}

TEST(SourceFilesRemoteTest, GcsIsRecognized) {
  // Nothing listens on port 1: the error is a connection failure naming the path.
  std::shared_ptr<arrow::fs::FileSystem> fs;
  std::vector<std::string> paths;
  const std::string path =
      "gs://bucket/corpus/x.parquet?endpoint_override=127.0.0.1:1&scheme=http"
      "&retry_limit_seconds=1";
  const Status st = ResolveFiles(path, "sources[0]", &fs, &paths, /*anonymous=*/true);
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr("gs://bucket/corpus/x.parquet"));
  EXPECT_THAT(st.message(), Not(HasSubstr("Unrecognized filesystem")));
}

}  // namespace
}  // namespace braid
