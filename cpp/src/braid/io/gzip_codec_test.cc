// The gzip codec against what zlib (Arrow's codec) wrote: one member, several members, a
// header with a file name, read through Arrow's compressed stream in chunks of every
// size; and damage (garbled, cut short, a wrong CRC, bytes after the last member).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <arrow/api.h>
#include <arrow/io/compressed.h>
#include <arrow/io/memory.h>

#include <random>
#include <string>

#include "braid/io/gzip_codec_internal.h"

namespace braid::internal {
namespace {

using ::testing::HasSubstr;

// Text with long repeats and random runs, so the deflate stream has both kinds of blocks.
std::string Body(size_t bytes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string out;
  while (out.size() < bytes) {
    if (rng() % 2) {
      out += "{\"text\": \"lorem ipsum dolor sit amet\", \"n\": " +
             std::to_string(rng() % 1000) + "}\n";
    } else {
      for (int i = 0; i < 64; ++i) out += char('a' + rng() % 26);
    }
  }
  out.resize(bytes);
  return out;
}

// `body` gzipped by zlib through Arrow's codec.
std::string Zlib(const std::string& body) {
  auto codec = arrow::util::Codec::Create(arrow::Compression::GZIP).ValueOrDie();
  auto sink = arrow::io::BufferOutputStream::Create().ValueOrDie();
  auto out = arrow::io::CompressedOutputStream::Make(codec.get(), sink).ValueOrDie();
  EXPECT_TRUE(out->Write(body.data(), int64_t(body.size())).ok());
  EXPECT_TRUE(out->Close().ok());
  return sink->Finish().ValueOrDie()->ToString();
}

// What the codec gives for `gz`, read `chunk` bytes at a time.
arrow::Result<std::string> Inflate(const std::string& gz, int64_t chunk) {
  ARROW_ASSIGN_OR_RAISE(auto codec, MakeReadCodec(arrow::Compression::GZIP));
  auto raw = std::make_shared<arrow::io::BufferReader>(arrow::Buffer::FromString(gz));
  ARROW_ASSIGN_OR_RAISE(auto in,
                        arrow::io::CompressedInputStream::Make(codec.get(), raw));
  std::string out;
  std::string buf(size_t(chunk), '\0');
  while (true) {
    ARROW_ASSIGN_OR_RAISE(int64_t n, in->Read(chunk, buf.data()));
    if (n == 0) break;
    out.append(buf.data(), size_t(n));
  }
  return out;
}

TEST(GzipCodecTest, ReadsWhatZlibWroteInEveryChunkSize) {
  const std::string body = Body(3 << 20, 1);
  const std::string gz = Zlib(body);
  for (int64_t chunk : {1, 7, 4096, 65536, 1 << 22}) {
    if (chunk == 1) {  // byte by byte over a shorter stream
      const std::string small = Body(70000, 2);
      auto got = Inflate(Zlib(small), chunk);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(*got, small);
      continue;
    }
    auto got = Inflate(gz, chunk);
    ASSERT_TRUE(got.ok()) << chunk << ": " << got.status();
    EXPECT_EQ(*got, body) << chunk;
  }
}

TEST(GzipCodecTest, ReadsEveryMemberOfAConcatenatedFile) {
  const std::string a = Body(200000, 3), b = Body(5, 4), c = Body(900001, 5);
  const std::string gz = Zlib(a) + Zlib(b) + Zlib("") + Zlib(c);
  for (int64_t chunk : {3, 65536}) {
    auto got = Inflate(gz, chunk);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, a + b + c) << chunk;
  }
}

TEST(GzipCodecTest, SkipsAFileNameInTheHeader) {
  const std::string body = Body(100000, 6);
  std::string gz = Zlib(body);
  gz[3] = 0x08;  // FLG.FNAME, as the gzip tool writes: a name ended by 0 after 10 bytes
  gz.insert(10, std::string("part-000.jsonl") + '\0');
  auto got = Inflate(gz, 65536);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, body);
}

TEST(GzipCodecTest, DamageIsAnErrorNotADifferentStream) {
  const std::string body = Body(1 << 20, 7);
  const std::string gz = Zlib(body);

  std::string garbled = gz;
  for (size_t i = gz.size() / 2; i < gz.size() / 2 + 64; ++i) garbled[i] = char(~gz[i]);
  auto g = Inflate(garbled, 65536);
  ASSERT_FALSE(g.ok());
  EXPECT_THAT(g.status().message(), HasSubstr("gzip: "));

  auto cut = Inflate(gz.substr(0, gz.size() * 2 / 3), 65536);
  ASSERT_FALSE(cut.ok());
  EXPECT_THAT(cut.status().message(), HasSubstr("runcated"));

  std::string crc = gz;
  crc[gz.size() - 8] = char(crc[gz.size() - 8] ^ 1);  // the trailer's CRC-32
  auto c = Inflate(crc, 65536);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("CRC-32"));

  auto trailing = Inflate(gz + "not gzip at all", 65536);
  ASSERT_FALSE(trailing.ok());
  EXPECT_THAT(trailing.status().message(), HasSubstr("gzip: "));

  auto none = Inflate("plain text, no gzip", 65536);
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(none.status().message(), HasSubstr("not a gzip header"));
}

TEST(GzipCodecTest, OtherCompressionsAreArrowsCodecs) {
  auto zstd = MakeReadCodec(arrow::Compression::ZSTD);
  ASSERT_TRUE(zstd.ok());
  EXPECT_EQ((*zstd)->compression_type(), arrow::Compression::ZSTD);
  auto gz = MakeReadCodec(arrow::Compression::GZIP);
  ASSERT_TRUE(gz.ok());
  EXPECT_EQ((*gz)->compression_type(), arrow::Compression::GZIP);
  EXPECT_FALSE((*gz)->MakeCompressor().ok());  // reads only
}

}  // namespace
}  // namespace braid::internal
