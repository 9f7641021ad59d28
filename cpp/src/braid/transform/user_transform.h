// User-defined transforms: preprocessing Braid does not know, supplied as a function.
//
// A source with `transform: {python: SPEC, columns: [a, b]}` reads the named columns of
// each row, converts the row to plain values (RowValue: null, bool, int, float, string,
// bytes, list, struct), and calls a RowCallback that returns the row's token ids and
// optionally a loss mask, or "no sample". The core owns everything but the call: reading,
// order, worker threads, error handling (on_error), skips. It knows nothing of Python:
// the Python extension installs a RowCallbackFactory that turns SPEC into a callback that
// holds the GIL only around the user's function; C++ users (and tests) install their own.
//
// The loader hands the transform chunks of consecutive rows of its batch (ApplyBatch),
// and the transform hands each chunk to the callback in one CallRows: with `batched:
// false` the callback calls the function once per row (the Python callback takes the GIL
// once for the chunk), with `batched: true` once for the chunk, which returns one result
// per row. Chunk boundaries depend on `workers` and on row sizes; results land in per-row
// slots, so the stream does not (given a function that treats each row on its own). A
// batched call that fails as a whole is repeated row by row (batches of one), so that an
// error names its row and `on_error: skip` skips only that row.
//
// Thread-safety: SetRowCallbackFactory and MakeRowCallback are thread-safe. A
// RowCallback's Call / CallRows run concurrently on a loader's worker threads and must be
// thread-safe; Cancel may be called from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "braid/config/config.h"
#include "braid/status.h"

namespace braid {

class Transform;

/// One column value of a row as a user transform sees it.
struct RowValue {
  enum class Kind : int8_t {
    kNull, kBool, kInt, kFloat, kString, kBytes, kList, kStruct
  };
  Kind kind = Kind::kNull;
  bool boolean = false;  ///< kBool
  int64_t integer = 0;   ///< kInt
  double real = 0;       ///< kFloat
  /// kString (UTF-8) and kBytes: points into the Arrow buffers; valid during the call.
  std::string_view bytes;
  std::vector<RowValue> items;  ///< kList: the elements; kStruct: the field values
  /// kStruct: the field names, parallel to `items`; valid during the call.
  std::vector<std::string_view> field_names;
};

/// What a user function made of a row.
struct RowCallbackResult {
  bool none = false;  ///< the function returned "no sample" (Python None): a skip
  std::vector<int32_t> tokens;
  std::vector<uint8_t> loss_mask;  ///< empty, or one value per token (nonzero: trained)
};

/// A user function over rows. Implementations are thread-safe (Call runs on several
/// worker threads at once).
class RowCallback {
 public:
  virtual ~RowCallback() = default;
  /// Calls the function on one row, values in `transform.columns` order. A failure of
  /// the function is a non-OK status whose message is its error text (for Python, the
  /// exception type and message); the transform adds the source, file and row.
  virtual Status Call(const std::vector<RowValue>& row, RowCallbackResult* out) const = 0;
  /// Calls the function on rows[0, n) with one entry into its runtime (for Python, one
  /// hold of the GIL): with `batched` false once per row, out[k] and row_status[k] as
  /// Call would give them; with `batched` true once for all the rows
  /// (`transform.batched`), the function returning one result per row, row_status[k]
  /// saying whether out[k] is a valid result. Returns Cancelled when stopping, or
  /// (batched only) the failure of the call as a whole (the function raised, or did not
  /// return one result per row); out and row_status are then unspecified. The default calls Call row by row in both modes
  /// (a C++ function has no batch form unless it overrides this).
  virtual Status CallRows(const std::vector<std::vector<RowValue>>& rows, bool batched,
                          RowCallbackResult* out, Status* row_status) const;
  /// Called by the loader's Stop() before it joins its threads, possibly on a thread
  /// that holds a lock a Call waits for (the GIL): from then on Call must return promptly
  /// (Cancelled), and Cancel must not return while a Call could still block on it.
  virtual void Cancel() const {}
};

/// Turns a `transform.python` spec into a callback. `key` is the spec's config key path
/// ("sources[1].transform.python") for errors: a spec that cannot be resolved is an
/// Invalid status naming it.
using RowCallbackFactory = std::function<Result<std::shared_ptr<const RowCallback>>(
    const std::string& spec, const std::string& key)>;

/// Installs the process-wide factory, replacing any previous one (nullptr removes it).
void SetRowCallbackFactory(RowCallbackFactory factory);

/// The callback of `spec` from the installed factory; Invalid naming `key` when no
/// factory is installed (a C++ program without the Python extension).
Result<std::shared_ptr<const RowCallback>> MakeRowCallback(const std::string& spec,
                                                           const std::string& key);

/// The user transform of config.sources[source_index] (REQUIRES: its transform.python is
/// set), calling `callback`.
std::unique_ptr<Transform> MakeUserTransform(const Config& config, int32_t source_index,
                                             std::shared_ptr<const RowCallback> callback);

}  // namespace braid
