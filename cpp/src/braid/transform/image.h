// Image decoding for the image-caption transform: encoded bytes -> normalized patches.
//
// ReadImageGrid reads only an image's header (its size) and gives the patch grid, hence
// the sample's image token count, without decoding (metadata first, docs/sources.md).
// DecodeImage decodes JPEG (libjpeg-turbo's TurboJPEG API, using its DCT scaling to
// decode near the target size), PNG (libspng) or WebP (libwebp) to RGB, resizes it
// bilinearly to the target size (ImageTargetSize), normalizes every channel to (x / 255 - 0.5) / 0.5, i.e.
// [-1, 1], and cuts it into a grid of patch_size x patch_size patches (docs/sources.md).
//
// Thread-safe: free functions without shared state (each call has its own decoder).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "braid/source/payload.h"
#include "braid/status.h"

namespace braid {

struct ImageOptions {
  int64_t patch_size = 14;
  int64_t max_pixels = 262144;
};

/// The resized (height, width) of an h x w image: scaled down (never up) keeping the
/// aspect ratio so that height * width <= max_pixels, then each side rounded to the
/// nearest multiple of patch_size (at least one patch); if rounding up overshot
/// max_pixels, the longer side loses patches until it fits (or is one patch).
void ImageTargetSize(int64_t height, int64_t width, const ImageOptions& options,
                     int64_t* target_height, int64_t* target_width);

/// An image's size, as its header gives it.
struct ImageSize {
  int64_t height = 0;
  int64_t width = 0;
};

/// The size of an encoded image from its header alone, decoding no pixel: JPEG with
/// TurboJPEG's header parse (markers up to the frame header), PNG from the IHDR chunk
/// with libspng, WebP with WebPGetInfo. Fails as DecodeImage does for bytes of another
/// format, a corrupt or truncated header, or a side of 0 or over 32768 pixels. Cheap
/// (no allocation beyond the decoder handle).
Result<ImageSize> ReadImageSize(std::string_view bytes);

/// A patch grid: grid_h x grid_w patches, one placeholder token each.
struct ImageGrid {
  int32_t grid_h = 0;
  int32_t grid_w = 0;
  int64_t num_patches() const { return int64_t{grid_h} * grid_w; }
};

/// The grid DecodeImage gives `bytes`, from the header alone: ImageTargetSize of
/// ReadImageSize, in patches. Equals DecodeImage's grid whenever that succeeds (both
/// size the image from its header); the body may still be undecodable.
Result<ImageGrid> ReadImageGrid(std::string_view bytes, const ImageOptions& options);

/// Decodes `bytes` (JPEG, PNG or WebP) to patches: grid (target_h / p, target_w / p), pixels
/// [grid_h * grid_w][3][p][p] float32 (row-major grid order, channel-first in a patch).
/// Fails with Invalid "cannot decode image: ..." for bytes of another format, or corrupt.
Result<ImagePatches> DecodeImage(std::string_view bytes, const ImageOptions& options);

/// DecodeImage for an image whose grid a header read gave earlier (`grid`: the sample's
/// published placeholders): fails with Invalid "cannot decode image: its size differs
/// from its header" when the decoded grid is another (the bytes changed since).
Result<ImagePatches> DecodeImageAs(std::string_view bytes, const ImageOptions& options,
                                   const ImageGrid& grid);

/// Blanks a payload whose images cannot be decoded so that it still fits its published
/// metadata: every image's pixels 0 (grid kept), nothing trained (loss mask all 0).
void BlankImagePayload(const ImageOptions& options, Payload* payload);

/// The message for image `k` of a row's `n` that failed to decode (`status`), naming the
/// column ("..., image k" when the row holds more than one).
std::string ImageErrorMessage(const Status& status, const std::string& column, size_t k,
                              size_t n);

/// Encodes packed RGB8 pixels (height * width * 3 bytes) as JPEG / PNG / lossless WebP;
/// for tests and
/// tools that make images.
Result<std::string> EncodeJpeg(const uint8_t* rgb, int width, int height,
                               int quality = 95);
Result<std::string> EncodePng(const uint8_t* rgb, int width, int height);
Result<std::string> EncodeWebpLossless(const uint8_t* rgb, int width, int height);

}  // namespace braid
