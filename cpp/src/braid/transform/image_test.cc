// The image-caption transform: decoding (JPEG via TurboJPEG, PNG via libspng), target
// sizes, normalization and patch layout, the transform through the source loader (tokens,
// loss mask, bad bytes), and the constructor's pixel_values / image_grid tensors.
#include "braid/transform/image.h"

#include <arrow/api.h>
#include <arrow/io/file.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <parquet/arrow/writer.h>
#include <sentencepiece_processor.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <set>

#include "braid/construct/constructor.h"
#include "braid/construct/views.h"
#include "braid/source/source_loader.h"
#include "braid/testing/parquet_fixture.h"
#include "braid/testing/sentencepiece_fixture.h"
#include "braid/testing/temp_dir.h"

namespace braid {
namespace {

using ::testing::HasSubstr;

constexpr float kJpegTolerance = 0.03f;  // ~4 of 255 levels, after normalization

std::vector<uint8_t> Solid(int w, int h, uint8_t r, uint8_t g, uint8_t b) {
  std::vector<uint8_t> px(size_t(w) * size_t(h) * 3);
  for (size_t i = 0; i < px.size(); i += 3) {
    px[i] = r;
    px[i + 1] = g;
    px[i + 2] = b;
  }
  return px;
}

// Seeded noise: large encoded files whose decode takes a while.
std::vector<uint8_t> Noise(int w, int h, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> px(size_t(w) * size_t(h) * 3);
  for (auto& v : px) v = static_cast<uint8_t>(rng() & 0xff);
  return px;
}

float Norm(uint8_t v) { return (float(v) / 255.0f - 0.5f) / 0.5f; }

std::string Jpeg(int w, int h, uint8_t r, uint8_t g, uint8_t b) {
  auto px = Solid(w, h, r, g, b);
  auto out = EncodeJpeg(px.data(), w, h);
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  return out.ok() ? *out : "";
}

std::string Png(int w, int h, uint8_t r, uint8_t g, uint8_t b) {
  auto px = Solid(w, h, r, g, b);
  auto out = EncodePng(px.data(), w, h);
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  return out.ok() ? *out : "";
}

// Every value of channel c in every patch, against `expected`.
void ExpectSolid(const ImagePatches& im, int64_t p, const float expected[3], float tol) {
  ASSERT_EQ(int64_t(im.pixels.size()), im.num_patches() * 3 * p * p);
  for (int64_t k = 0; k < im.num_patches(); ++k) {
    for (int64_t c = 0; c < 3; ++c) {
      for (int64_t i = 0; i < p * p; ++i) {
        ASSERT_NEAR(im.pixels[size_t((k * 3 + c) * p * p + i)], expected[c], tol)
            << "patch " << k << " channel " << c;
      }
    }
  }
}

TEST(ImageTargetSizeTest, KeepsAspectRoundsToPatchesAndFitsMaxPixels) {
  int64_t h = 0, w = 0;
  ImageTargetSize(100, 100, {}, &h, &w);  // small: not scaled up, rounded to 7 patches
  EXPECT_EQ(h, 98);
  EXPECT_EQ(w, 98);
  ImageTargetSize(5, 3, {}, &h, &w);  // tiny: at least one patch
  EXPECT_EQ(h, 14);
  EXPECT_EQ(w, 14);
  ImageTargetSize(1000, 500, {}, &h, &w);  // rounding up overshoots: 52x26 -> 51x26
  EXPECT_EQ(h, 51 * 14);
  EXPECT_EQ(w, 26 * 14);
  EXPECT_LE(h * w, 262144);
  ImageTargetSize(768, 1024, {.patch_size = 16, .max_pixels = 16 * 16 * 12}, &h, &w);
  EXPECT_EQ(h, 3 * 16);
  EXPECT_EQ(w, 4 * 16);
}

TEST(ImageConfigTest, ImageColumnNeedsTextColumnAndTokenId) {
  const std::string head = "batch: {global_tokens: 64, seq_len: 64}\n"
                           "tokenizer: {model: tok.model}\nsources:\n";
  auto good = ParseConfig(head +
                              "  - {name: c, path: c.parquet, image_column: img, "
                              "text_column: cap, "
                              "image: {image_token_id: 9, patch_size: 16}}\n",
                          "/base");
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  EXPECT_EQ(good->sources[0].image_column, "img");
  EXPECT_EQ(good->sources[0].image_token_id, 9);
  EXPECT_EQ(good->sources[0].image_patch_size, 16);
  EXPECT_EQ(good->sources[0].image_max_pixels, 262144);
  struct Bad {
    std::string source, key;
  };
  for (const Bad& bad : std::vector<Bad>{
           {"image_column: img, tokens_column: ids", "sources[0].image_column"},
           {"image_column: img, text_column: cap", "sources[0].image.image_token_id"},
           {"image_column: img, text_column: cap, image: {patch_size: 14}",
            "sources[0].image.image_token_id"},
           {"image_column: img, text_column: cap, image: {image_token_id: -1}",
            "sources[0].image.image_token_id"},
           {"image_column: img, text_column: cap, "
            "image: {image_token_id: 1, max_pixels: 9}",
            "sources[0].image.max_pixels"},
           {"image_column: img, text_column: cap, image: {image_token_id: 1, size: 9}",
            "sources[0].image.size"},
           {"text_column: cap, image: {image_token_id: 1}", "sources[0].image"}}) {
    auto c = ParseConfig(head + "  - {name: c, path: c.parquet, " + bad.source + "}\n",
                         "/base");
    ASSERT_FALSE(c.ok()) << bad.source;
    EXPECT_THAT(c.status().message(), ::testing::StartsWith(bad.key + ":"))
        << c.status().message();
  }
}

TEST(DecodeImageTest, SolidJpegDecodesToItsNormalizedColour) {
  const float expected[3] = {Norm(200), Norm(100), Norm(50)};
  auto im = DecodeImage(Jpeg(64, 48, 200, 100, 50), {});
  ASSERT_TRUE(im.ok()) << im.status().ToString();
  EXPECT_EQ(im->grid_h, 3);  // 48 / 14 = 3.4 -> 3
  EXPECT_EQ(im->grid_w, 5);  // 64 / 14 = 4.6 -> 5
  ExpectSolid(*im, 14, expected, kJpegTolerance);

  // A large JPEG is decoded at a DCT scale, then resized: same colour, small grid.
  auto big = DecodeImage(Jpeg(1024, 768, 200, 100, 50), {.patch_size = 14,
                                                          .max_pixels = 14 * 14 * 16});
  ASSERT_TRUE(big.ok()) << big.status().ToString();
  EXPECT_EQ(big->grid_h, 3);
  EXPECT_EQ(big->grid_w, 5);
  ExpectSolid(*big, 14, expected, kJpegTolerance);
}

TEST(DecodeImageTest, PngIsExactAndPatchesAreChannelFirst) {
  const float expected[3] = {Norm(10), Norm(255), Norm(0)};
  auto im = DecodeImage(Png(30, 40, 10, 255, 0), {});
  ASSERT_TRUE(im.ok()) << im.status().ToString();
  EXPECT_EQ(im->grid_h, 3);  // 40 / 14 = 2.9 -> 3
  EXPECT_EQ(im->grid_w, 2);  // 30 / 14 = 2.1 -> 2
  ExpectSolid(*im, 14, expected, 1e-5f);

  // Left half red, right half blue, 28x28 with 14-pixel patches: patches 0 and 2 (left
  // column of the row-major grid) are red, 1 and 3 blue; [c][y][x] inside a patch.
  std::vector<uint8_t> px(28 * 28 * 3, 0);
  for (int y = 0; y < 28; ++y) {
    for (int x = 0; x < 28; ++x) px[size_t((y * 28 + x) * 3 + (x < 14 ? 0 : 2))] = 255;
  }
  auto png = EncodePng(px.data(), 28, 28);
  ASSERT_TRUE(png.ok());
  auto halves = DecodeImage(*png, {});
  ASSERT_TRUE(halves.ok()) << halves.status().ToString();
  ASSERT_EQ(halves->grid_h, 2);
  ASSERT_EQ(halves->grid_w, 2);
  const float red[3] = {1, -1, -1}, blue[3] = {-1, -1, 1};
  for (int k = 0; k < 4; ++k) {
    ImagePatches one;
    one.grid_h = one.grid_w = 1;
    const auto first = halves->pixels.begin() + k * 588;
    one.pixels.assign(first, first + 588);
    ExpectSolid(one, 14, k % 2 == 0 ? red : blue, 1e-5f);
  }
}

// The resampler's definition, pixel by pixel: bilinear with half-pixel centres over the
// four taps, normalized, in patch layout. DecodeImage computes it row-separably; the
// float operations are the same, so the values must be too, bit for bit.
std::vector<float> FourTapPatches(const std::vector<uint8_t>& rgb, int64_t h, int64_t w,
                                  int64_t th, int64_t tw, int64_t p) {
  auto tap = [](int64_t i, int64_t dst, int64_t n, int64_t* i0, int64_t* i1, float* w1) {
    double f = (double(i) + 0.5) * (double(n) / double(dst)) - 0.5;
    f = std::clamp(f, 0.0, double(n - 1));
    *i0 = int64_t(std::floor(f));
    *i1 = std::min(*i0 + 1, n - 1);
    *w1 = float(f - double(*i0));
  };
  std::vector<float> out(size_t(th * tw * 3));
  const int64_t gw = tw / p;
  for (int64_t y = 0; y < th; ++y) {
    int64_t y0, y1, x0, x1;
    float wy, wx;
    tap(y, th, h, &y0, &y1, &wy);
    for (int64_t x = 0; x < tw; ++x) {
      tap(x, tw, w, &x0, &x1, &wx);
      for (int c = 0; c < 3; ++c) {
        auto at = [&](int64_t yy, int64_t xx) {
          return float(rgb[size_t((yy * w + xx) * 3 + c)]);
        };
        const float a = at(y0, x0) + wx * (at(y0, x1) - at(y0, x0));
        const float b = at(y1, x0) + wx * (at(y1, x1) - at(y1, x0));
        const float v = a + wy * (b - a);
        out[size_t((((y / p) * gw + x / p) * 3 + c) * p * p + (y % p) * p + x % p)] =
            (v / 255.0f - 0.5f) / 0.5f;
      }
    }
  }
  return out;
}

TEST(DecodeImageTest, ResizedPatchesAreTheFourTapBilinearBitForBit) {
  std::mt19937 rng(11);
  // Up in both sides, down in both (max_pixels), mixed, and already patch-sized.
  const int sizes[][2] = {{37, 53}, {301, 190}, {20, 90}, {28, 42}, {1, 1}};
  for (const auto& [w, h] : sizes) {
    for (const int64_t max_pixels : {int64_t{262144}, int64_t{4096}}) {
      std::vector<uint8_t> rgb(size_t(w * h * 3));
      for (auto& v : rgb) v = uint8_t(rng());
      auto png = EncodePng(rgb.data(), w, h);
      ASSERT_TRUE(png.ok());
      ImageOptions options;
      options.max_pixels = max_pixels;
      int64_t th = 0, tw = 0;
      ImageTargetSize(h, w, options, &th, &tw);
      auto im = DecodeImage(*png, options);
      ASSERT_TRUE(im.ok()) << im.status().ToString();
      const std::vector<float> want = FourTapPatches(rgb, h, w, th, tw, 14);
      ASSERT_EQ(im->pixels.size(), want.size()) << w << "x" << h;
      size_t differ = 0;
      for (size_t k = 0; k < want.size(); ++k) {
        differ += std::memcmp(&im->pixels[k], &want[k], sizeof(float)) != 0;
      }
      EXPECT_EQ(differ, 0u) << w << "x" << h << " max_pixels " << max_pixels;
    }
  }
}

TEST(DecodeImageTest, LosslessWebpIsExact) {
  auto px = Solid(30, 20, 40, 80, 120);
  auto webp = EncodeWebpLossless(px.data(), 30, 20);
  ASSERT_TRUE(webp.ok()) << webp.status().ToString();
  auto im = DecodeImage(*webp, {});
  ASSERT_TRUE(im.ok()) << im.status().ToString();
  EXPECT_EQ(im->grid_h, 1);  // 20 / 14 = 1.4 -> 1
  EXPECT_EQ(im->grid_w, 2);  // 30 / 14 = 2.1 -> 2
  const float expected[3] = {Norm(40), Norm(80), Norm(120)};
  ExpectSolid(*im, 14, expected, 1e-5f);
  auto broken = DecodeImage(std::string_view(*webp).substr(0, 20), {});
  ASSERT_FALSE(broken.ok());
  EXPECT_THAT(broken.status().message(), HasSubstr("cannot decode image: WebP"));
}

TEST(DecodeImageTest, UndecodableBytesAreInvalid) {
  auto garbage = DecodeImage("definitely not an image", {});
  ASSERT_FALSE(garbage.ok());
  EXPECT_TRUE(garbage.status().IsInvalid());
  EXPECT_THAT(garbage.status().message(), HasSubstr("cannot decode image"));
  std::string png = Png(20, 20, 1, 2, 3);
  auto truncated = DecodeImage(std::string_view(png).substr(0, png.size() / 2), {});
  ASSERT_FALSE(truncated.ok());
  EXPECT_THAT(truncated.status().message(), HasSubstr("cannot decode image: PNG"));
  std::string jpeg = Jpeg(20, 20, 1, 2, 3);
  auto broken = DecodeImage(std::string_view(jpeg).substr(0, 40), {});
  ASSERT_FALSE(broken.ok());
  EXPECT_THAT(broken.status().message(), HasSubstr("cannot decode image: JPEG"));
}

TEST(ReadImageGridTest, HeaderGridEqualsTheDecodedGridForEveryFormatAndSize) {
  // Seeded sizes, odd ones included: JPEG's DCT-scaled decode rounds its sides up, so the
  // target must come from the header's size in both paths.
  std::mt19937 rng(11);
  std::vector<std::pair<int, int>> sizes = {{1, 1}, {13, 29}, {14, 14}, {97, 1001},
                                            {733, 517}, {1023, 769}};
  for (int k = 0; k < 10; ++k) {
    sizes.emplace_back(1 + int(rng() % 900), 1 + int(rng() % 900));
  }
  const std::vector<ImageOptions> options = {
      {}, {.patch_size = 16, .max_pixels = 16 * 16 * 12}, {.patch_size = 14,
                                                           .max_pixels = 14 * 14 * 7}};
  int checked = 0;
  for (const auto& [w, h] : sizes) {
    const auto px = Solid(w, h, 90, 60, 30);
    std::vector<std::string> encoded = {*EncodeJpeg(px.data(), w, h),
                                        *EncodePng(px.data(), w, h),
                                        *EncodeWebpLossless(px.data(), w, h)};
    for (const std::string& bytes : encoded) {
      auto size = ReadImageSize(bytes);
      ASSERT_TRUE(size.ok()) << size.status().ToString();
      EXPECT_EQ(size->width, w);
      EXPECT_EQ(size->height, h);
      for (const ImageOptions& o : options) {
        auto grid = ReadImageGrid(bytes, o);
        auto decoded = DecodeImage(bytes, o);
        ASSERT_TRUE(grid.ok()) << grid.status().ToString();
        ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
        EXPECT_EQ(grid->grid_h, decoded->grid_h) << w << "x" << h << " p " << o.patch_size;
        EXPECT_EQ(grid->grid_w, decoded->grid_w) << w << "x" << h << " p " << o.patch_size;
        EXPECT_LE(grid->num_patches() * o.patch_size * o.patch_size, o.max_pixels);
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, int(sizes.size()) * 3 * 3);
}

TEST(ReadImageGridTest, ReadsTheHeaderOnly) {
  // A PNG cut after its header: the grid is known, the pixels are not.
  const auto px = Noise(60, 40, 1);
  const std::string png = *EncodePng(px.data(), 60, 40);
  const std::string_view head = std::string_view(png).substr(0, 64);
  auto grid = ReadImageGrid(head, {});
  ASSERT_TRUE(grid.ok()) << grid.status().ToString();
  EXPECT_EQ(grid->grid_h, 3);  // 40 / 14 = 2.9 -> 3
  EXPECT_EQ(grid->grid_w, 4);  // 60 / 14 = 4.3 -> 4
  auto decoded = DecodeImage(head, {});
  ASSERT_FALSE(decoded.ok());
  EXPECT_THAT(decoded.status().message(), HasSubstr("cannot decode image: PNG"));
  // A bad header is an error of the header read itself.
  EXPECT_FALSE(ReadImageGrid("definitely not an image", {}).ok());
  EXPECT_FALSE(ReadImageGrid(std::string_view(png).substr(0, 12), {}).ok());
  const std::string jpeg = Jpeg(20, 20, 1, 2, 3);
  auto cut = ReadImageGrid(std::string_view(jpeg).substr(0, 40), {});
  ASSERT_FALSE(cut.ok());
  EXPECT_THAT(cut.status().message(), HasSubstr("cannot decode image: JPEG"));
}

// ---------------------------------------------------------------------------------------
// Through the source loader.

Status WriteImageFile(const std::string& path,
                      const std::vector<std::optional<std::string>>& images,
                      const std::vector<std::string>& captions) {
  arrow::BinaryBuilder ib;
  arrow::StringBuilder cb;
  for (size_t i = 0; i < images.size(); ++i) {
    ARROW_RETURN_NOT_OK(images[i] ? ib.Append(*images[i]) : ib.AppendNull());
    ARROW_RETURN_NOT_OK(cb.Append(captions[i]));
  }
  ARROW_ASSIGN_OR_RAISE(auto ia, ib.Finish());
  ARROW_ASSIGN_OR_RAISE(auto ca, cb.Finish());
  auto table = arrow::Table::Make(
      arrow::schema({arrow::field("image", arrow::binary()),
                     arrow::field("caption", arrow::utf8())}),
      {ia, ca});
  ARROW_ASSIGN_OR_RAISE(auto out, arrow::io::FileOutputStream::Open(path));
  return parquet::arrow::WriteTable(*table, arrow::default_memory_pool(), out,
                                    /*chunk_size=*/4);
}

class ImageSourceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::ScopedTempDir("braid-image");
    ASSERT_TRUE(testing::TrainTinySentencePiece(testing::RandomSentences(300, 5),
                                                dir_->Sub("tok"), 100)
                    .ok());
  }
  static void TearDownTestSuite() { delete dir_; }

  static Config ImageConfig(const std::string& path, OnError on_error) {
    Config c;
    c.seed = 2;
    c.batch.seq_len = 256;
    c.batch.global_tokens = 256;
    c.tokenizer.model = dir_->Sub("tok.model");
    c.sources.push_back(
        testing::CaptionSource(path, on_error, /*workers=*/2, /*window_rows=*/1));
    return c;
  }

  static std::vector<int32_t> Encode(const std::string& text) {
    sentencepiece::SentencePieceProcessor sp;
    EXPECT_TRUE(sp.Load(dir_->Sub("tok.model")).ok());
    std::vector<int> ids;
    EXPECT_TRUE(sp.Encode(text, &ids).ok());
    return {ids.begin(), ids.end()};
  }

  static testing::ScopedTempDir* dir_;
};

testing::ScopedTempDir* ImageSourceTest::dir_ = nullptr;

// Every sample of a loader made with `options`, payloads waited for (error statuses kept).
struct Pulled {
  std::vector<Sample> samples;
  std::vector<Result<TokenPayload>> payloads;
};

Pulled Pull(const Config& config, int64_t n, SourceLoader::Options options = {}) {
  Pulled out;
  auto loader = SourceLoader::Make(config, 0, StreamPos{}, options);
  EXPECT_TRUE(loader.ok()) << loader.status().ToString();
  if (!loader.ok()) return out;
  for (int64_t i = 0; i < n; ++i) {
    auto s = (*loader)->Next();
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (!s.ok()) break;
    out.samples.push_back(*s);
  }
  for (const Sample& s : out.samples) {
    out.payloads.push_back(s.payload ? s.payload.Get()
                                     : Result<TokenPayload>(TokenPayload(nullptr)));
  }
  return out;
}

void ExpectSameMeta(const SampleMeta& a, const SampleMeta& b) {
  EXPECT_EQ(a.file, b.file);
  EXPECT_EQ(a.row, b.row);
  EXPECT_EQ(a.pos, b.pos);
  EXPECT_EQ(a.skip, b.skip);
  EXPECT_EQ(a.tokens, b.tokens) << "row " << a.row;
  EXPECT_EQ(a.image_tokens, b.image_tokens) << "row " << a.row;
}

// Ten rows of mixed formats and sizes; row 4's PNG is cut after its header (its body
// cannot decode), row 6 is garbage (its header cannot be read either).
std::string WriteMixedFile(const std::string& path) {
  std::vector<std::optional<std::string>> images;
  std::vector<std::string> captions;
  for (int i = 0; i < 10; ++i) {
    const int w = 20 + 37 * i, h = 300 - 23 * i;
    const auto px = Noise(w, h, uint32_t(i));
    switch (i % 3) {
      case 0: images.push_back(*EncodeJpeg(px.data(), w, h)); break;
      case 1: images.push_back(*EncodePng(px.data(), w, h)); break;
      default: images.push_back(*EncodeWebpLossless(px.data(), w, h)); break;
    }
    captions.push_back("caption number " + std::to_string(i) + ".");
  }
  images[4] = images[4]->substr(0, 80);
  images[6] = "garbage";
  EXPECT_TRUE(WriteImageFile(path, images, captions).ok());
  return path;
}

TEST_F(ImageSourceTest, TokensArePlaceholdersThenCaptionWithMaskAndPatches) {
  const std::string path = dir_->Sub("good.parquet");
  const std::vector<std::string> captions = {"the quick brown fox.", "a data loader."};
  ASSERT_TRUE(WriteImageFile(path, {Jpeg(28, 42, 200, 100, 50), Png(70, 14, 0, 0, 255)},
                             captions)
                  .ok());
  auto loader = SourceLoader::Make(ImageConfig(path, OnError::kFail), 0, StreamPos{}, {});
  ASSERT_TRUE(loader.ok()) << loader.status().ToString();
  const int64_t patches[2] = {3 * 2, 1 * 5};
  for (int i = 0; i < 2; ++i) {
    auto s = (*loader)->Next();
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    const int64_t row = s->meta.row;
    const int64_t n = patches[row];
    std::vector<int32_t> expected(size_t(n), 7);
    for (int32_t id : Encode(captions[size_t(row)])) expected.push_back(id);
    expected.push_back(2);  // EOS
    auto payload = s->payload.Get();
    ASSERT_TRUE(payload.ok());
    EXPECT_EQ((*payload)->tokens, expected);
    EXPECT_EQ(s->meta.tokens, int64_t(expected.size()));
    EXPECT_EQ(s->meta.image_tokens, n);
    std::vector<uint8_t> mask(expected.size(), 1);
    std::fill(mask.begin(), mask.begin() + n, 0);
    EXPECT_EQ((*payload)->loss_mask, mask);
    ASSERT_EQ((*payload)->images.size(), 1u);
    EXPECT_EQ((*payload)->images[0].num_patches(), n);
    EXPECT_EQ((*payload)->image_start, std::vector<int64_t>{0});
    EXPECT_GE((*payload)->bytes(), n * 588 * 4);
  }
}

TEST_F(ImageSourceTest, UndecodableImageFailsNamingRowOrIsASkip) {
  const std::string path = dir_->Sub("bad.parquet");
  std::vector<std::optional<std::string>> images;
  std::vector<std::string> captions;
  for (int i = 0; i < 10; ++i) {
    images.push_back(Png(14, 14, uint8_t(i), 0, 0));
    captions.push_back("caption " + std::to_string(i) + ".");
  }
  images[5] = "garbage bytes";
  images[7] = std::nullopt;
  ASSERT_TRUE(WriteImageFile(path, images, captions).ok());

  auto fail = SourceLoader::Make(ImageConfig(path, OnError::kFail), 0, StreamPos{}, {});
  ASSERT_TRUE(fail.ok());
  Status st;
  for (int i = 0; i < 12 && st.ok(); ++i) st = (*fail)->Next().status();
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr("bad.parquet"));
  EXPECT_THAT(st.message(), HasSubstr("row group 1"));
  EXPECT_THAT(st.message(), HasSubstr("row 5"));
  EXPECT_THAT(st.message(), HasSubstr("cannot decode image"));

  auto skip = SourceLoader::Make(ImageConfig(path, OnError::kSkip), 0, StreamPos{}, {});
  ASSERT_TRUE(skip.ok());
  std::set<int64_t> skipped;
  for (int i = 0; i < 10; ++i) {
    auto s = (*skip)->Next();
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    if (s->meta.skip != SkipReason::kNone) {
      EXPECT_EQ(s->meta.skip, SkipReason::kNull);
      skipped.insert(s->meta.row);
    } else {
      EXPECT_EQ(s->meta.image_tokens, 1);
    }
  }
  EXPECT_EQ(skipped, (std::set<int64_t>{5, 7}));
}

// ---------------------------------------------------------------------------------------
// The constructor: pixel tensors for whole images, an error for a split one.

PayloadRef ImagePayload(int32_t grid_h, int32_t grid_w, float value, int64_t caption) {
  auto p = std::make_shared<Payload>();
  const int64_t n = int64_t{grid_h} * grid_w;
  std::vector<int32_t> ids(size_t(n), 7);
  for (int64_t k = 0; k < caption; ++k) ids.push_back(int32_t(100 + k));
  p->tokens = std::move(ids);
  p->loss_mask.assign(p->tokens.size(), 1);
  std::fill(p->loss_mask.begin(), p->loss_mask.begin() + n, 0);
  p->images.push_back({grid_h, grid_w, std::vector<float>(size_t(n * 12), value)});
  p->image_start = {0};
  return PayloadRef(TokenPayload(p));
}

StepPlan OneSequencePlan(std::vector<DocPiece> docs, int64_t seq_len) {
  StepPlan plan;
  plan.seq_len = seq_len;
  plan.buckets.resize(1);
  plan.buckets[0].micro_batches.resize(1);
  Sequence seq;
  seq.docs.assign(docs.begin(), docs.end());
  plan.buckets[0].micro_batches[0].sequences.push_back(seq);
  return plan;
}

DocPiece Piece(PayloadRef payload, int64_t start, int64_t len, int64_t row) {
  DocPiece d;
  d.row = row;
  d.start = start;
  d.len = len;
  d.doc_tokens = int64_t(payload->tokens.size());
  d.payload = std::move(payload);
  return d;
}

TEST(ImageConstructorTest, WholeImagesBecomePixelValuesInTokenOrder) {
  // Text doc, image doc (2x3 patches + 4 caption), image doc (1x1 + 2): 6+4+1+2+text 3.
  PayloadRef text = MakeTokenPayload({1, 2, 3});
  PayloadRef a = ImagePayload(2, 3, 0.25f, 4);
  PayloadRef b = ImagePayload(1, 1, -0.5f, 2);
  auto batch = BuildMicroBatch(
      OneSequencePlan({Piece(text, 0, 3, 0), Piece(a, 0, 10, 1), Piece(b, 0, 3, 2)}, 16),
      0, 0);
  ASSERT_TRUE(batch.ok()) << batch.status().ToString();
  const Tensor* pixels = batch->Find("pixel_values");
  const Tensor* grid = batch->Find("image_grid");
  ASSERT_NE(pixels, nullptr);
  ASSERT_NE(grid, nullptr);
  EXPECT_EQ(pixels->shape, (std::vector<int64_t>{7, 12}));
  EXPECT_EQ(grid->shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(std::vector<int32_t>(grid->data<int32_t>(), grid->data<int32_t>() + 4),
            (std::vector<int32_t>{2, 3, 1, 1}));
  EXPECT_EQ(pixels->data<float>()[0], 0.25f);
  EXPECT_EQ(pixels->data<float>()[6 * 12], -0.5f);
  // Placeholders in input_ids == rows of pixel_values; no loss on placeholder targets.
  const Tensor* ids = batch->Find("input_ids");
  const Tensor* mask = batch->Find("loss_mask");
  int64_t placeholders = 0;
  for (int64_t t = 0; t < 16; ++t) placeholders += ids->data<int64_t>()[t] == 7;
  EXPECT_EQ(placeholders, 7);
  for (int64_t t = 3; t < 3 + 5; ++t) EXPECT_EQ(mask->data<float>()[t], 0.0f) << t;
  EXPECT_EQ(mask->data<float>()[3 + 5], 1.0f);  // last placeholder predicts the caption

  // A text-only batch has no image tensors.
  auto plain = BuildMicroBatch(OneSequencePlan({Piece(text, 0, 3, 0)}, 4), 0, 0);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->Find("pixel_values"), nullptr);
  EXPECT_EQ(plain->Find("image_grid"), nullptr);
}

TEST(ImageConstructorTest, APieceWithPartOfAnImageIsAnError) {
  PayloadRef a = ImagePayload(2, 3, 0.25f, 4);
  // The caption-only tail of a cut document carries no image and is fine.
  auto tail = BuildMicroBatch(OneSequencePlan({Piece(a, 6, 4, 9)}, 4), 0, 0);
  ASSERT_TRUE(tail.ok()) << tail.status().ToString();
  EXPECT_EQ(tail->Find("pixel_values"), nullptr);
  auto split = BuildMicroBatch(OneSequencePlan({Piece(a, 0, 4, 9)}, 4), 0, 0);
  ASSERT_FALSE(split.ok());
  EXPECT_TRUE(split.status().IsInvalid());
  EXPECT_THAT(split.status().message(), HasSubstr("sources[0] file 0 row 9"));
  EXPECT_THAT(split.status().message(), HasSubstr("an image was split"));
  EXPECT_THAT(split.status().message(), HasSubstr("oversize: skip or raise seq_len"));
}

TEST(ImageConstructorTest, ContextParallelViewsKeepImageTensorsWhole) {
  // A 1x1 image of 12 values in a 12-token sequence: pixel_values [1, 12] has the shape
  // of a per-token tensor [mbs, seq_len], yet must reach every CP rank whole.
  auto p = std::make_shared<Payload>();
  p->tokens = {7, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12};
  p->images.push_back({1, 1, std::vector<float>(12, 0.5f)});
  p->image_start = {0};
  PayloadRef ref{TokenPayload(p)};
  auto batch = BuildMicroBatch(OneSequencePlan({Piece(ref, 0, 12, 0)}, 12), 0, 0);
  ASSERT_TRUE(batch.ok()) << batch.status().ToString();
  ASSERT_EQ(batch->Find("pixel_values")->shape, (std::vector<int64_t>{1, 12}));
  Topology topology;
  topology.cp = 2;
  topology.pp = 2;
  for (int64_t cp = 0; cp < 2; ++cp) {
    auto view = ViewFor(*batch, topology, RankCoords{0, 0, 0, cp});
    ASSERT_TRUE(view.ok()) << view.status().ToString();
    EXPECT_EQ(view->Find("input_ids")->shape, (std::vector<int64_t>{1, 6}));
    ASSERT_NE(view->Find("pixel_values"), nullptr);
    EXPECT_EQ(view->Find("pixel_values")->shape, (std::vector<int64_t>{1, 12}));
    EXPECT_EQ(view->Find("image_grid")->shape, (std::vector<int64_t>{1, 2}));
    auto last = ViewFor(*batch, topology, RankCoords{0, 0, 1, cp});
    ASSERT_TRUE(last.ok());
    EXPECT_EQ(last->Find("pixel_values"), nullptr);  // only the first stage's input
  }
}

// ---------------------------------------------------------------------------------------
// Metadata first.

TEST_F(ImageSourceTest, MetadataOnlyReadsHeadersAndMatchesTheFullPath) {
  const std::string path = WriteMixedFile(dir_->Sub("mixed-meta.parquet"));
  Config config = ImageConfig(path, OnError::kSkip);
  SourceLoader::Options meta_only;
  meta_only.read_payloads = false;
  const Pulled meta = Pull(config, 10, meta_only);
  const Pulled full = Pull(config, 10);
  ASSERT_EQ(meta.samples.size(), 10u);
  ASSERT_EQ(full.samples.size(), 10u);
  for (size_t i = 0; i < 10; ++i) {
    ExpectSameMeta(meta.samples[i].meta, full.samples[i].meta);
    EXPECT_FALSE(meta.samples[i].payload);
  }
  for (const Sample& s : meta.samples) {
    if (s.meta.row == 6) {
      EXPECT_EQ(s.meta.skip, SkipReason::kNull);  // no header: skipped in both paths
    } else {
      // Row 4's body is corrupt, yet its metadata is whole: nothing was decoded.
      EXPECT_EQ(s.meta.skip, SkipReason::kNone) << s.meta.row;
      EXPECT_GT(s.meta.image_tokens, 0);
    }
  }
  // With on_error: fail the metadata-only read fails at row 6 (no header), never at
  // row 4 (no decode happens).
  auto loader =
      SourceLoader::Make(ImageConfig(path, OnError::kFail), 0, StreamPos{}, meta_only);
  ASSERT_TRUE(loader.ok());
  size_t delivered = 0;
  Status st;
  for (; delivered < 10; ++delivered) {
    auto s = (*loader)->Next();
    st = s.status();
    if (!st.ok()) break;
    EXPECT_NE(s->meta.row, 6);
  }
  EXPECT_THAT(st.message(), HasSubstr("row 6"));
  size_t row6_at = 0;
  while (row6_at < 10 && meta.samples[row6_at].meta.row != 6) ++row6_at;
  EXPECT_EQ(delivered, row6_at);
}

TEST_F(ImageSourceTest, UndecodableBodyFailsFromGetOrIsBlankedUnderSkip) {
  const std::string path = WriteMixedFile(dir_->Sub("mixed-body.parquet"));
  {
    // on_error: fail. Row 4's metadata is published; its payload is the error.
    auto loader =
        SourceLoader::Make(ImageConfig(path, OnError::kFail), 0, StreamPos{}, {});
    ASSERT_TRUE(loader.ok());
    bool seen = false;
    for (int i = 0; i < 10 && !seen; ++i) {
      auto s = (*loader)->Next();
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      auto payload = s->payload.Get();
      if (s->meta.row != 4) {
        ASSERT_TRUE(payload.ok()) << payload.status().ToString();
        continue;
      }
      seen = true;
      EXPECT_GT(s->meta.image_tokens, 0);
      ASSERT_FALSE(payload.ok());
      EXPECT_TRUE(payload.status().IsInvalid());
      EXPECT_THAT(payload.status().message(), HasSubstr("mixed-body.parquet"));
      EXPECT_THAT(payload.status().message(), HasSubstr("row group 1"));
      EXPECT_THAT(payload.status().message(), HasSubstr("row 4"));
      EXPECT_THAT(payload.status().message(), HasSubstr("cannot decode image: PNG"));
      ASSERT_NE(GetErrorDetail(payload.status()), nullptr);
    }
    EXPECT_TRUE(seen);
  }
  // on_error: skip. Row 4 keeps its published tokens, with blank pixels and no loss.
  auto loader = SourceLoader::Make(ImageConfig(path, OnError::kSkip), 0, StreamPos{}, {});
  ASSERT_TRUE(loader.ok());
  std::vector<Sample> samples;
  for (int i = 0; i < 10; ++i) {
    auto s = (*loader)->Next();
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    samples.push_back(*s);
  }
  // Payloads decode on demand: none has been wanted yet, so none has decoded.
  EXPECT_EQ((*loader)->blanked_payloads(), 0);
  for (const Sample& s : samples) {
    if (s.meta.skip == SkipReason::kNone) EXPECT_FALSE(s.payload.ready());
  }
  int blank = 0;
  for (const Sample& s : samples) {
    if (s.meta.skip != SkipReason::kNone) continue;
    auto payload = s.payload.Get();
    ASSERT_TRUE(payload.ok()) << payload.status().ToString();
    const Payload& p = **payload;
    EXPECT_EQ(int64_t(p.tokens.size()), s.meta.tokens);
    ASSERT_EQ(p.images.size(), 1u);
    EXPECT_EQ(p.images[0].num_patches(), s.meta.image_tokens);
    EXPECT_EQ(int64_t(p.images[0].pixels.size()), s.meta.image_tokens * 3 * 14 * 14);
    const int64_t trained = std::count(p.loss_mask.begin(), p.loss_mask.end(), 1);
    if (s.meta.row == 4) {
      ++blank;
      EXPECT_EQ(trained, 0);
      EXPECT_TRUE(std::all_of(p.images[0].pixels.begin(), p.images[0].pixels.end(),
                              [](float v) { return v == 0.0f; }));
    } else {
      EXPECT_GT(trained, 0);
    }
  }
  EXPECT_EQ(blank, 1);
  // Only what was wanted decoded: read-ahead into epoch 1 decodes nothing.
  EXPECT_EQ((*loader)->blanked_payloads(), 1);
}

TEST_F(ImageSourceTest, SameStreamForAnyWorkerCountAndReadAhead) {
  const std::string path = WriteMixedFile(dir_->Sub("mixed-workers.parquet"));
  Config one = ImageConfig(path, OnError::kSkip);
  one.sources[0].workers = 1;
  one.sources[0].shuffle_window_rows = 10;
  const Pulled a = Pull(one, 25);
  for (int64_t workers : {2, 4}) {
    for (int64_t read_ahead : {int64_t{1}, int64_t{64} << 20}) {
      Config c = one;
      c.sources[0].workers = workers;
      SourceLoader::Options options;
      options.read_ahead_bytes = read_ahead;
      const Pulled b = Pull(c, 25, options);
      ASSERT_EQ(b.samples.size(), a.samples.size());
      for (size_t i = 0; i < a.samples.size(); ++i) {
        ExpectSameMeta(a.samples[i].meta, b.samples[i].meta);
        ASSERT_EQ(a.payloads[i].ok(), b.payloads[i].ok());
        const TokenPayload& x = *a.payloads[i];
        const TokenPayload& y = *b.payloads[i];
        ASSERT_EQ(x == nullptr, y == nullptr);
        if (x == nullptr) continue;
        EXPECT_EQ(x->tokens, y->tokens);
        EXPECT_EQ(x->loss_mask, y->loss_mask);
        ASSERT_EQ(x->images.size(), y->images.size());
        EXPECT_EQ(x->images[0].pixels, y->images[0].pixels) << "workers " << workers;
      }
    }
  }
}

// Twelve copies of a large noise PNG (1024 x 1024, ~3 MB): slow to decode. Written once.
std::string LargePngFile(const testing::ScopedTempDir& dir) {
  const std::string path = dir.Sub("large.parquet");
  if (std::filesystem::exists(path)) return path;
  const auto px = Noise(1024, 1024, 3);
  const std::string png = *EncodePng(px.data(), 1024, 1024);
  EXPECT_TRUE(WriteImageFile(path, std::vector<std::optional<std::string>>(12, png),
                             std::vector<std::string>(12, "noise."))
                  .ok());
  return path;
}

TEST_F(ImageSourceTest, MetadataIsPublishedBeforeImagesDecode) {
  // On one decode thread, the twelve samples' metadata (from the headers) is queued at
  // once, while decoding them all takes far longer than taking 12 samples.
  const std::string path = LargePngFile(*dir_);
  Config config = ImageConfig(path, OnError::kFail);
  config.sources[0].workers = 1;
  auto loader = SourceLoader::Make(config, 0, StreamPos{}, {});
  ASSERT_TRUE(loader.ok());
  int64_t pending = 0;
  std::vector<Sample> samples;
  for (int i = 0; i < 12; ++i) {
    auto s = (*loader)->Next();
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    pending += s->payload.ready() ? 0 : 1;
    EXPECT_EQ(s->meta.image_tokens, 37 * 36);  // 1024 -> 512 (36.6 patches), fitted
    samples.push_back(*s);
  }
  EXPECT_GT(pending, 0);
  for (const Sample& s : samples) {
    auto p = s.payload.Get();
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    EXPECT_EQ((*p)->images[0].num_patches(), 37 * 36);
  }
}

TEST_F(ImageSourceTest, StopLeavesNoPayloadToWaitFor) {
  const std::string path = LargePngFile(*dir_);
  Config config = ImageConfig(path, OnError::kFail);
  config.sources[0].workers = 1;
  auto loader = SourceLoader::Make(config, 0, StreamPos{}, {});
  ASSERT_TRUE(loader.ok());
  std::vector<Sample> samples;
  for (int i = 0; i < 12; ++i) samples.push_back((*loader)->Next().ValueOrDie());
  for (int i = 0; i < 6; ++i) samples[size_t(i)].payload.Want();  // decodes start
  (*loader)->Stop();
  // Every payload completes without waiting on the stopped loader: those wanted before
  // the stop decoded or were cancelled, those wanted after it are cancelled at once.
  for (size_t i = 0; i < samples.size(); ++i) {
    auto p = samples[i].payload.Get();
    EXPECT_TRUE(samples[i].payload.ready());
    if (i >= 6) {
      ASSERT_FALSE(p.ok()) << "sample " << i << " decoded after the stop";
    }
    if (!p.ok()) {
      EXPECT_TRUE(p.status().IsCancelled()) << p.status().ToString();
    }
  }
}

// Several images per row: a list<binary> column. Every image's placeholders lead the
// document, in list order, then the caption; the payload carries one ImagePatches per
// image; an empty list is an empty row, a null element a null.
TEST_F(ImageSourceTest, ListColumnGivesSeveralImagesPerRowInOrder) {
  const std::string path = dir_->Sub("multi.parquet");
  {
    auto ib = std::make_shared<arrow::BinaryBuilder>();
    arrow::ListBuilder lb(arrow::default_memory_pool(), ib);
    arrow::StringBuilder cb;
    ASSERT_TRUE(lb.Append().ok());  // row 0: two images
    ASSERT_TRUE(ib->Append(Jpeg(28, 42, 200, 100, 50)).ok());
    ASSERT_TRUE(ib->Append(Png(70, 14, 0, 0, 255)).ok());
    ASSERT_TRUE(lb.Append().ok());  // row 1: one image
    ASSERT_TRUE(ib->Append(Png(14, 14, 255, 0, 0)).ok());
    ASSERT_TRUE(lb.Append().ok());  // row 2: none
    ASSERT_TRUE(lb.Append().ok());  // row 3: a null element
    ASSERT_TRUE(ib->Append(Png(14, 14, 255, 0, 0)).ok());
    ASSERT_TRUE(ib->AppendNull().ok());
    for (const char* c : {"two pictures.", "one.", "none.", "broken."}) {
      ASSERT_TRUE(cb.Append(c).ok());
    }
    auto images = lb.Finish().ValueOrDie();
    auto captions = cb.Finish().ValueOrDie();
    auto table = arrow::Table::Make(
        arrow::schema({arrow::field("image", arrow::list(arrow::binary())),
                       arrow::field("caption", arrow::utf8())}),
        {images, captions});
    auto out = arrow::io::FileOutputStream::Open(path).ValueOrDie();
    ASSERT_TRUE(parquet::arrow::WriteTable(*table, arrow::default_memory_pool(), out,
                                           /*chunk_size=*/4)
                    .ok());
  }
  Config config = ImageConfig(path, OnError::kSkip);
  const Pulled full = Pull(config, 4);
  SourceLoader::Options meta_only;
  meta_only.read_payloads = false;
  const Pulled meta = Pull(config, 4, meta_only);
  ASSERT_EQ(full.samples.size(), 4u);
  ASSERT_EQ(meta.samples.size(), 4u);
  for (size_t i = 0; i < 4; ++i) ExpectSameMeta(full.samples[i].meta, meta.samples[i].meta);
  const float red[3] = {Norm(255), Norm(0), Norm(0)};
  for (size_t i = 0; i < 4; ++i) {
    const Sample& s = full.samples[i];
    switch (s.meta.row) {
      case 0: {
        ASSERT_TRUE(full.payloads[i].ok()) << full.payloads[i].status().ToString();
        const Payload& p = **full.payloads[i];
        EXPECT_EQ(s.meta.image_tokens, 6 + 5);
        ASSERT_EQ(p.images.size(), 2u);
        EXPECT_EQ(p.image_start, (std::vector<int64_t>{0, 6}));
        EXPECT_EQ(p.images[0].grid_h, 3);
        EXPECT_EQ(p.images[0].grid_w, 2);
        EXPECT_EQ(p.images[1].grid_h, 1);
        EXPECT_EQ(p.images[1].grid_w, 5);
        EXPECT_EQ(p.images[1].pixels.size(), size_t(5 * 588));
        std::vector<int32_t> expected(11, 7);
        for (int32_t id : Encode("two pictures.")) expected.push_back(id);
        expected.push_back(2);
        EXPECT_EQ(p.tokens, expected);
        // Both images reach the micro-batch, whole and in order.
        DocPiece d = Piece(s.payload, 0, int64_t(expected.size()), 0);
        auto batch = BuildMicroBatch(OneSequencePlan({d}, 64), 0, 0);
        ASSERT_TRUE(batch.ok()) << batch.status().ToString();
        EXPECT_EQ(batch->Find("pixel_values")->shape, (std::vector<int64_t>{11, 588}));
        EXPECT_EQ(batch->Find("image_grid")->shape, (std::vector<int64_t>{2, 2}));
        break;
      }
      case 1: {
        ASSERT_TRUE(full.payloads[i].ok());
        const Payload& p = **full.payloads[i];
        EXPECT_EQ(s.meta.image_tokens, 1);
        ASSERT_EQ(p.images.size(), 1u);
        ExpectSolid(p.images[0], 14, red, 1e-5f);
        break;
      }
      case 2:
        EXPECT_EQ(s.meta.skip, SkipReason::kEmpty);
        break;
      default:
        EXPECT_EQ(s.meta.skip, SkipReason::kNull);
        break;
    }
  }
  // With on_error: fail the null element names the row.
  auto failing = SourceLoader::Make(ImageConfig(path, OnError::kFail), 0, StreamPos{}, {});
  ASSERT_TRUE(failing.ok());
  Status first_error;
  for (int i = 0; i < 4 && first_error.ok(); ++i) first_error = (*failing)->Next().status();
  EXPECT_THAT(first_error.message(), HasSubstr("row 3"));
}

}  // namespace
}  // namespace braid
