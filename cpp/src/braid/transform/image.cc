#include "braid/transform/image.h"

#include <spng.h>
#include <turbojpeg.h>
#include <webp/decode.h>
#include <webp/encode.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>

namespace braid {
namespace {

constexpr int64_t kMaxSide = 1 << 15;  // larger images are refused (memory)

Status DecodeError(const std::string& what) {
  return Status::Invalid("cannot decode image: ", what);
}

struct Rgb {
  int64_t width = 0;
  int64_t height = 0;
  std::vector<uint8_t> pixels;  // packed RGB8
};

struct TjCloser {
  void operator()(void* h) const { tjDestroy(h); }
};
using TjHandle = std::unique_ptr<void, TjCloser>;

Status JpegHeader(tjhandle tj, std::string_view bytes, int* w, int* h) {
  int subsamp = 0, colorspace = 0;
  if (tjDecompressHeader3(tj, reinterpret_cast<const unsigned char*>(bytes.data()),
                          static_cast<unsigned long>(bytes.size()), w, h, &subsamp,
                          &colorspace) != 0) {
    return DecodeError(std::string("JPEG: ") + tjGetErrorStr2(tj));
  }
  return Status::OK();
}

// Decodes at the smallest DCT scale that still covers th x tw.
Status DecodeJpeg(std::string_view bytes, int64_t th, int64_t tw, Rgb* out) {
  TjHandle tj(tjInitDecompress());
  if (!tj) return DecodeError("cannot start the JPEG decoder");
  const auto* buf = reinterpret_cast<const unsigned char*>(bytes.data());
  const auto len = static_cast<unsigned long>(bytes.size());
  int w = 0, h = 0;
  ARROW_RETURN_NOT_OK(JpegHeader(tj.get(), bytes, &w, &h));
  int num_factors = 0;
  const tjscalingfactor* factors = tjGetScalingFactors(&num_factors);
  int sw = w, sh = h;
  for (int k = 0; factors != nullptr && k < num_factors; ++k) {
    const tjscalingfactor f = factors[k];
    if (f.num > f.denom) continue;
    const int fw = TJSCALED(w, f), fh = TJSCALED(h, f);
    if (fw >= tw && fh >= th && int64_t{fw} * fh < int64_t{sw} * sh) {
      sw = fw;
      sh = fh;
    }
  }
  out->width = sw;
  out->height = sh;
  out->pixels.resize(size_t(sw) * size_t(sh) * 3);
  if (tjDecompress2(tj.get(), buf, len, out->pixels.data(), sw, /*pitch=*/0, sh, TJPF_RGB,
                    /*flags=*/0) != 0) {
    // Warnings (e.g. a truncated tail) still give an image; only errors fail.
    if (tjGetErrorCode(tj.get()) == TJERR_FATAL) {
      return DecodeError(std::string("JPEG: ") + tjGetErrorStr2(tj.get()));
    }
  }
  return Status::OK();
}

struct SpngCloser {
  void operator()(spng_ctx* c) const { spng_ctx_free(c); }
};
using SpngCtx = std::unique_ptr<spng_ctx, SpngCloser>;

// A decoder over `bytes` with its header read into `ihdr`.
Result<SpngCtx> OpenPng(std::string_view bytes, spng_ihdr* ihdr) {
  SpngCtx ctx(spng_ctx_new(0));
  if (!ctx) return DecodeError("cannot start the PNG decoder");
  spng_set_image_limits(ctx.get(), kMaxSide, kMaxSide);
  int err = spng_set_png_buffer(ctx.get(), bytes.data(), bytes.size());
  if (err == 0) err = spng_get_ihdr(ctx.get(), ihdr);
  if (err != 0) return DecodeError(std::string("PNG: ") + spng_strerror(err));
  return ctx;
}

Status PngHeader(std::string_view bytes, int64_t* w, int64_t* h) {
  spng_ihdr ihdr{};
  ARROW_RETURN_NOT_OK(OpenPng(bytes, &ihdr).status());
  *w = ihdr.width;
  *h = ihdr.height;
  return Status::OK();
}

Status DecodePng(std::string_view bytes, Rgb* out) {
  spng_ihdr ihdr{};
  ARROW_ASSIGN_OR_RAISE(SpngCtx ctx, OpenPng(bytes, &ihdr));
  size_t size = 0;
  int err = spng_decoded_image_size(ctx.get(), SPNG_FMT_RGB8, &size);
  if (err == 0) {
    out->width = ihdr.width;
    out->height = ihdr.height;
    out->pixels.resize(size);
    err = spng_decode_image(ctx.get(), out->pixels.data(), size, SPNG_FMT_RGB8, 0);
  }
  if (err != 0) return DecodeError(std::string("PNG: ") + spng_strerror(err));
  if (out->width <= 0 || out->height <= 0 ||
      size != size_t(out->width) * size_t(out->height) * 3) {
    return DecodeError("PNG: unexpected decoded size");
  }
  return Status::OK();
}

Status WebpHeader(std::string_view bytes, int* w, int* h) {
  if (!WebPGetInfo(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), w, h)) {
    return DecodeError("WebP: bad header");
  }
  return Status::OK();
}

Status DecodeWebp(std::string_view bytes, Rgb* out) {
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  int w = 0, h = 0;
  ARROW_RETURN_NOT_OK(WebpHeader(bytes, &w, &h));
  out->width = w;
  out->height = h;
  out->pixels.resize(size_t(w) * size_t(h) * 3);
  if (WebPDecodeRGBInto(data, bytes.size(), out->pixels.data(), out->pixels.size(),
                        /*output_stride=*/w * 3) == nullptr) {
    return DecodeError("WebP: corrupt data");
  }
  return Status::OK();
}

// Bilinear resize (half-pixel centres) of `src` to th x tw, normalized to [-1, 1] and
// written straight into patch layout. Separable: each source row that an output row
// reads is interpolated across once (per channel, into a float row), then each output
// row blends two of them. Every value takes the same float operations in the same
// order as interpolating the four taps per pixel would, so the result is the same bit
// for bit; reads and writes run along rows, a patch's row at a time.
ImagePatches Patchify(const Rgb& src, int64_t th, int64_t tw, int64_t p) {
  ImagePatches out;
  out.grid_h = static_cast<int32_t>(th / p);
  out.grid_w = static_cast<int32_t>(tw / p);
  out.pixels.resize(size_t(th * tw * 3));
  struct Tap {
    int64_t i0, i1;
    float w1;
  };
  auto taps = [](int64_t dst, int64_t n) {
    std::vector<Tap> t(static_cast<size_t>(dst));
    const double scale = static_cast<double>(n) / static_cast<double>(dst);
    for (int64_t i = 0; i < dst; ++i) {
      double f = (static_cast<double>(i) + 0.5) * scale - 0.5;
      f = std::clamp(f, 0.0, static_cast<double>(n - 1));
      const auto i0 = static_cast<int64_t>(std::floor(f));
      t[size_t(i)] = {i0, std::min(i0 + 1, n - 1), static_cast<float>(f - double(i0))};
    }
    return t;
  };
  const std::vector<Tap> ys = taps(th, src.height), xs = taps(tw, src.width);
  const uint8_t* px = src.pixels.data();
  const int64_t stride = src.width * 3;
  const int64_t pp = p * p;
  // Two interpolated source rows, [c][x] each, and which source row each slot holds.
  std::vector<float> rows(size_t(2 * 3 * tw));
  int64_t held[2] = {-1, -1};
  auto row = [&](int64_t sy) -> const float* {
    for (int s = 0; s < 2; ++s) {
      if (held[s] == sy) return rows.data() + s * 3 * tw;
    }
    // Source rows only move forward with y: the slot of the older row is replaced.
    const int s = held[0] < held[1] ? 0 : 1;
    held[s] = sy;
    float* r = rows.data() + s * 3 * tw;
    const uint8_t* in = px + sy * stride;
    for (int64_t x = 0; x < tw; ++x) {
      const Tap tx = xs[size_t(x)];
      for (int c = 0; c < 3; ++c) {
        const float a0 = in[tx.i0 * 3 + c], a1 = in[tx.i1 * 3 + c];
        r[c * tw + x] = a0 + tx.w1 * (a1 - a0);
      }
    }
    return r;
  };
  for (int64_t y = 0; y < th; ++y) {
    const Tap ty = ys[size_t(y)];
    const float* a_row = row(ty.i0);
    const float* b_row = row(ty.i1);
    const int64_t gy = y / p, py = y % p;
    for (int c = 0; c < 3; ++c) {
      const float* a = a_row + c * tw;
      const float* b = b_row + c * tw;
      for (int64_t gx = 0; gx < out.grid_w; ++gx) {
        float* dst =
            out.pixels.data() + ((gy * out.grid_w + gx) * 3 + c) * pp + py * p;
        const float* pa = a + gx * p;
        const float* pb = b + gx * p;
        for (int64_t k = 0; k < p; ++k) {
          const float v = pa[k] + ty.w1 * (pb[k] - pa[k]);
          dst[k] = (v / 255.0f - 0.5f) / 0.5f;
        }
      }
    }
  }
  return out;
}

}  // namespace

void ImageTargetSize(int64_t height, int64_t width, const ImageOptions& options,
                     int64_t* target_height, int64_t* target_width) {
  const int64_t p = options.patch_size;
  const double area = static_cast<double>(height) * static_cast<double>(width);
  const double scale =
      std::min(1.0, std::sqrt(static_cast<double>(options.max_pixels) / area));
  auto patches = [&](int64_t side) {
    return std::max<int64_t>(
        1, std::llround(static_cast<double>(side) * scale / static_cast<double>(p)));
  };
  int64_t gh = patches(height), gw = patches(width);
  while (gh * gw * p * p > options.max_pixels && (gh > 1 || gw > 1)) {
    if (gh >= gw) {
      --gh;
    } else {
      --gw;
    }
  }
  *target_height = gh * p;
  *target_width = gw * p;
}

namespace {

enum class Format { kJpeg, kPng, kWebp };

Result<Format> FormatOf(std::string_view bytes) {
  const auto* b = reinterpret_cast<const unsigned char*>(bytes.data());
  if (bytes.size() >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) {
    return Format::kJpeg;
  }
  if (bytes.size() >= 8 && b[0] == 0x89 && b[1] == 'P' && b[2] == 'N' && b[3] == 'G') {
    return Format::kPng;
  }
  if (bytes.size() >= 12 && bytes.substr(0, 4) == "RIFF" && bytes.substr(8, 4) == "WEBP") {
    return Format::kWebp;
  }
  return DecodeError("not a JPEG, PNG or WebP (" + std::to_string(bytes.size()) +
                     " bytes)");
}

const char* FormatName(Format f) {
  switch (f) {
    case Format::kJpeg: return "JPEG";
    case Format::kPng: return "PNG";
    default: return "WebP";
  }
}

}  // namespace

Result<ImageSize> ReadImageSize(std::string_view bytes) {
  ARROW_ASSIGN_OR_RAISE(const Format format, FormatOf(bytes));
  ImageSize size;
  switch (format) {
    case Format::kJpeg: {
      TjHandle tj(tjInitDecompress());
      if (!tj) return DecodeError("cannot start the JPEG decoder");
      int w = 0, h = 0;
      ARROW_RETURN_NOT_OK(JpegHeader(tj.get(), bytes, &w, &h));
      size = {h, w};
      break;
    }
    case Format::kPng:
      ARROW_RETURN_NOT_OK(PngHeader(bytes, &size.width, &size.height));
      break;
    case Format::kWebp: {
      int w = 0, h = 0;
      ARROW_RETURN_NOT_OK(WebpHeader(bytes, &w, &h));
      size = {h, w};
      break;
    }
  }
  if (size.width <= 0 || size.height <= 0 || size.width > kMaxSide ||
      size.height > kMaxSide) {
    return DecodeError(std::string(FormatName(format)) + " of " +
                       std::to_string(size.width) + "x" + std::to_string(size.height) +
                       " pixels is empty or too large");
  }
  return size;
}

Result<ImageGrid> ReadImageGrid(std::string_view bytes, const ImageOptions& options) {
  ARROW_ASSIGN_OR_RAISE(const ImageSize size, ReadImageSize(bytes));
  int64_t th = 0, tw = 0;
  ImageTargetSize(size.height, size.width, options, &th, &tw);
  return ImageGrid{static_cast<int32_t>(th / options.patch_size),
                   static_cast<int32_t>(tw / options.patch_size)};
}

Result<ImagePatches> DecodeImage(std::string_view bytes, const ImageOptions& options) {
  // The target comes from the header's size, never from the decoded one (a JPEG decoded
  // at a DCT scale rounds its sides), so ReadImageGrid gives the same grid.
  ARROW_ASSIGN_OR_RAISE(const ImageSize size, ReadImageSize(bytes));
  int64_t th = 0, tw = 0;
  ImageTargetSize(size.height, size.width, options, &th, &tw);
  Rgb rgb;
  switch (FormatOf(bytes).ValueUnsafe()) {
    case Format::kJpeg:
      ARROW_RETURN_NOT_OK(DecodeJpeg(bytes, th, tw, &rgb));
      break;
    case Format::kPng:
      ARROW_RETURN_NOT_OK(DecodePng(bytes, &rgb));
      break;
    case Format::kWebp:
      ARROW_RETURN_NOT_OK(DecodeWebp(bytes, &rgb));
      break;
  }
  return Patchify(rgb, th, tw, options.patch_size);
}

Result<ImagePatches> DecodeImageAs(std::string_view bytes, const ImageOptions& options,
                                   const ImageGrid& grid) {
  ARROW_ASSIGN_OR_RAISE(ImagePatches patches, DecodeImage(bytes, options));
  if (patches.grid_h != grid.grid_h || patches.grid_w != grid.grid_w) {
    return Status::Invalid("cannot decode image: its size differs from its header");
  }
  return patches;
}

void BlankImagePayload(const ImageOptions& options, Payload* payload) {
  const int64_t values = 3 * options.patch_size * options.patch_size;
  for (ImagePatches& image : payload->images) {
    image.pixels.assign(size_t(image.num_patches() * values), 0.0f);
  }
  payload->loss_mask.assign(payload->tokens.size(), 0);
}

std::string ImageErrorMessage(const Status& status, const std::string& column, size_t k,
                              size_t n) {
  return status.message() + " (column '" + column + "'" +
         (n > 1 ? ", image " + std::to_string(k) : "") + ")";
}

Result<std::string> EncodeJpeg(const uint8_t* rgb, int width, int height, int quality) {
  TjHandle tj(tjInitCompress());
  if (!tj) return Status::Invalid("cannot start the JPEG encoder");
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  if (tjCompress2(tj.get(), rgb, width, /*pitch=*/0, height, TJPF_RGB, &buf, &size,
                  TJSAMP_444, quality, /*flags=*/0) != 0) {
    if (buf != nullptr) tjFree(buf);
    return Status::Invalid("JPEG encoding failed: ", tjGetErrorStr2(tj.get()));
  }
  std::string out(reinterpret_cast<const char*>(buf), size);
  tjFree(buf);
  return out;
}

Result<std::string> EncodeWebpLossless(const uint8_t* rgb, int width, int height) {
  uint8_t* buf = nullptr;
  const size_t size = WebPEncodeLosslessRGB(rgb, width, height, width * 3, &buf);
  if (size == 0 || buf == nullptr) return Status::Invalid("WebP encoding failed");
  std::string out(reinterpret_cast<const char*>(buf), size);
  WebPFree(buf);
  return out;
}

Result<std::string> EncodePng(const uint8_t* rgb, int width, int height) {
  SpngCtx ctx(spng_ctx_new(SPNG_CTX_ENCODER));
  if (!ctx) return Status::Invalid("cannot start the PNG encoder");
  spng_set_option(ctx.get(), SPNG_ENCODE_TO_BUFFER, 1);
  spng_ihdr ihdr{};
  ihdr.width = static_cast<uint32_t>(width);
  ihdr.height = static_cast<uint32_t>(height);
  ihdr.bit_depth = 8;
  ihdr.color_type = SPNG_COLOR_TYPE_TRUECOLOR;
  spng_set_ihdr(ctx.get(), &ihdr);
  int err = spng_encode_image(ctx.get(), rgb, size_t(width) * size_t(height) * 3,
                              SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE);
  if (err != 0) return Status::Invalid("PNG encoding failed: ", spng_strerror(err));
  size_t len = 0;
  void* png = spng_get_png_buffer(ctx.get(), &len, &err);
  if (png == nullptr) return Status::Invalid("PNG encoding failed: ", spng_strerror(err));
  std::string out(static_cast<const char*>(png), len);
  free(png);
  return out;
}

}  // namespace braid
