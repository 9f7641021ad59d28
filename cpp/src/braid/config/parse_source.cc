// The parser of one `sources[i]` entry and of tokenizers (config_internal.h): its files,
// its transform (tokens_column | text_column | chat | transform, with workers and
// loaders), images, the length column, weight, error policy, storage options and shuffle
// windows (docs/sources.md, docs/config.md).
//
// Thread-safe: pure functions of the YAML they read.
#include <string>
#include <utility>

#include "braid/config/config.h"
#include "braid/config/config_internal.h"
#include "braid/config/limits_internal.h"
#include "braid/io/formats.h"

namespace braid::internal {
namespace {

// A string that must not be empty.
Result<std::string> NonEmpty(const YAML::Node& node, const std::string& key) {
  ARROW_ASSIGN_OR_RAISE(auto v, Scalar<std::string>(node, key, "a string"));
  if (v.empty()) return ConfigError(key, "must not be empty");
  return v;
}

// `chat`: prompt_column + response_column, or messages_column.
Status ParseChat(const YAML::Node& chat, const std::string& key, ChatColumns* out) {
  ARROW_RETURN_NOT_OK(
      CheckMap(chat, key, {"prompt_column", "response_column", "messages_column"}));
  if (chat["messages_column"]) {
    if (chat["prompt_column"] || chat["response_column"]) {
      return ConfigError(key, "give messages_column or prompt_column + response_column");
    }
    ARROW_ASSIGN_OR_RAISE(out->messages_column,
                          NonEmpty(chat["messages_column"], Join(key, "messages_column")));
    return Status::OK();
  }
  for (const char* k : {"prompt_column", "response_column"}) {
    if (!chat[k]) {
      return ConfigError(Join(key, k), "is required (or give messages_column)");
    }
  }
  ARROW_ASSIGN_OR_RAISE(out->prompt_column,
                        NonEmpty(chat["prompt_column"], Join(key, "prompt_column")));
  ARROW_ASSIGN_OR_RAISE(out->response_column,
                        NonEmpty(chat["response_column"], Join(key, "response_column")));
  return Status::OK();
}

// `transform: {python, columns, batched}`: a user function (transform/user_transform.h).
Status ParseUserTransform(const YAML::Node& t, const std::string& key,
                          SourceConfig::UserTransform* out) {
  ARROW_RETURN_NOT_OK(CheckMap(t, key, {"python", "columns", "batched"}));
  if (!t["python"]) return ConfigError(Join(key, "python"), "is required");
  ARROW_ASSIGN_OR_RAISE(out->python, NonEmpty(t["python"], Join(key, "python")));
  const std::string ckey = Join(key, "columns");
  const YAML::Node cols = t["columns"];
  if (!cols) return ConfigError(ckey, "is required (the columns the function reads)");
  if (!cols.IsSequence() || cols.size() == 0) {
    return ConfigError(ckey, "must be a non-empty list of column names");
  }
  ARROW_RETURN_NOT_OK(Visit(cols.size(), ckey));
  for (size_t i = 0; i < cols.size(); ++i) {
    ARROW_ASSIGN_OR_RAISE(auto name, NonEmpty(cols[i], Index(ckey, i)));
    out->columns.push_back(std::move(name));
  }
  if (t["batched"]) {
    ARROW_ASSIGN_OR_RAISE(out->batched,
                          Scalar<bool>(t["batched"], Join(key, "batched"), "a boolean"));
  }
  return Status::OK();
}

// Exactly one of tokens_column, text_column, chat and transform (a Megatron dataset
// needs none: it is a token source); workers; loaders.
Status ParseSourceTransform(const YAML::Node& node, const std::string& path,
                            SourceConfig* src) {
  const int given = (node["tokens_column"] ? 1 : 0) + (node["text_column"] ? 1 : 0) +
                    (node["chat"] ? 1 : 0) + (node["transform"] ? 1 : 0);
  const bool megatron = LooksLikeMegatron(*src);
  if (megatron) {
    for (const char* k : {"text_column", "chat", "transform", "image_column",
                          "length_column"}) {
      if (node[k]) {
        return ConfigError(Join(path, k),
                           "does not apply to a Megatron dataset (.idx / .bin): its "
                           "documents are token ids");
      }
    }
  }
  // A directory (local and there, or a URI) or a glob whose names say no format may
  // hold Megatron datasets: the files tell when the source opens (io/source_files.h; a
  // config error naming tokens_column there if they are not).
  const bool may_be_megatron =
      megatron || (src->format == SourceFormat::kAuto &&
                   DetectFormatFromName(src->path) == SourceFormat::kAuto &&
                   MayListDatasets(src->path));
  if (given == 0 && !may_be_megatron) {
    return ConfigError(Join(path, "tokens_column"),
                       "is required (or give text_column, chat or transform; a Megatron "
                       "dataset, .idx / .bin or format: megatron, needs none)");
  }
  if (given > 1) {
    return ConfigError(path,
                       "give exactly one of tokens_column, text_column, chat, transform");
  }
  if (node["tokens_column"]) {
    ARROW_ASSIGN_OR_RAISE(src->tokens_column,
                          Scalar<std::string>(node["tokens_column"],
                                              Join(path, "tokens_column"), "a string"));
  }
  if (node["text_column"]) {
    ARROW_ASSIGN_OR_RAISE(src->text_column,
                          NonEmpty(node["text_column"], Join(path, "text_column")));
  }
  if (const YAML::Node chat = node["chat"]) {
    ARROW_RETURN_NOT_OK(ParseChat(chat, Join(path, "chat"), &src->chat));
  }
  if (node["workers"]) {
    ARROW_ASSIGN_OR_RAISE(src->workers, PositiveInt(node["workers"], Join(path, "workers")));
  }
  if (const YAML::Node t = node["transform"]) {
    ARROW_RETURN_NOT_OK(
        ParseUserTransform(t, Join(path, "transform"), &src->user_transform));
  }
  if (node["loaders"]) {
    ARROW_ASSIGN_OR_RAISE(src->loaders, PositiveInt(node["loaders"], Join(path, "loaders")));
  }
  return Status::OK();
}

// image_column + image: {patch_size, max_pixels, image_token_id, folder}, only together
// with text_column (the caption); `folder` resolved against `base_dir`.
Status ParseSourceImage(const YAML::Node& node, const std::string& path,
                        const std::string& base_dir, SourceConfig* src) {
  if (!node["image_column"]) {
    if (node["image"]) return ConfigError(Join(path, "image"), "needs image_column");
    return Status::OK();
  }
  const std::string col_key = Join(path, "image_column");
  if (node["image_column"].IsSequence()) {
    // Alternatives (a WebDataset source's member extensions): the first a sample has.
    const YAML::Node list = node["image_column"];
    if (list.size() == 0) return ConfigError(col_key, "must not be an empty list");
    ARROW_RETURN_NOT_OK(Visit(list.size(), col_key));
    for (size_t i = 0; i < list.size(); ++i) {
      ARROW_ASSIGN_OR_RAISE(auto name, NonEmpty(list[i], Index(col_key, i)));
      if (name.find(';') != std::string::npos) {
        return ConfigError(Index(col_key, i), "must not hold ';'");
      }
      src->image_column += (i == 0 ? "" : ";") + name;
    }
  } else {
    ARROW_ASSIGN_OR_RAISE(src->image_column,
                          Scalar<std::string>(node["image_column"], col_key,
                                              "a string or a list of strings"));
  }
  if (src->image_column.empty()) return ConfigError(col_key, "must not be empty");
  if (src->text_column.empty()) {
    return ConfigError(col_key, "needs text_column (the caption)");
  }
  const std::string key = Join(path, "image");
  const YAML::Node image = node["image"];
  if (!image) return ConfigError(Join(key, "image_token_id"), "is required");
  ARROW_RETURN_NOT_OK(
      CheckMap(image, key, {"patch_size", "max_pixels", "image_token_id", "folder"}));
  if (image["folder"]) {
    ARROW_ASSIGN_OR_RAISE(src->image_folder,
                          Scalar<std::string>(image["folder"], Join(key, "folder"),
                                              "a string"));
    if (src->image_folder.empty()) {
      return ConfigError(Join(key, "folder"), "must not be empty");
    }
    src->image_folder = ResolvePath(src->image_folder, base_dir);
  }
  if (image["patch_size"]) {
    ARROW_ASSIGN_OR_RAISE(src->image_patch_size,
                          PositiveInt(image["patch_size"], Join(key, "patch_size")));
  }
  if (image["max_pixels"]) {
    ARROW_ASSIGN_OR_RAISE(src->image_max_pixels,
                          PositiveInt(image["max_pixels"], Join(key, "max_pixels")));
  }
  if (src->image_patch_size > src->image_max_pixels / src->image_patch_size) {
    return ConfigError(Join(key, "max_pixels"), "must be at least patch_size^2");
  }
  if (!image["image_token_id"]) {
    return ConfigError(Join(key, "image_token_id"), "is required");
  }
  ARROW_ASSIGN_OR_RAISE(src->image_token_id,
                        Scalar<int64_t>(image["image_token_id"],
                                        Join(key, "image_token_id"), "an integer"));
  if (src->image_token_id < 0 || src->image_token_id > 2147483647) {
    return ConfigError(Join(key, "image_token_id"), "must be an int32 >= 0");
  }
  return Status::OK();
}

// length_column: another column of a tokens_column source.
Status ParseLengthColumn(const YAML::Node& node, const std::string& key,
                         SourceConfig* src) {
  ARROW_ASSIGN_OR_RAISE(src->length_column, Scalar<std::string>(node, key, "a string"));
  if (src->length_column.empty()) return ConfigError(key, "must not be empty");
  if (src->tokens_column.empty()) {
    return ConfigError(key,
                       "applies to tokens_column sources only (a text, chat, image or "
                       "transform source has no token count before it is tokenized)");
  }
  if (src->length_column == src->tokens_column) {
    return ConfigError(key, "must name another column than tokens_column");
  }
  return Status::OK();
}

// storage: {endpoint, region, anonymous} of an s3:// or gs:// path (docs/config.md).
Status ParseSourceStorage(const YAML::Node& storage, const std::string& key,
                          SourceConfig* src) {
  ARROW_RETURN_NOT_OK(CheckMap(storage, key, {"endpoint", "region", "anonymous"}));
  if (storage["anonymous"]) {
    ARROW_ASSIGN_OR_RAISE(src->storage_anonymous,
                          Scalar<bool>(storage["anonymous"], Join(key, "anonymous"),
                                       "true or false"));
  }
  if (storage["endpoint"]) {
    ARROW_ASSIGN_OR_RAISE(src->storage_endpoint,
                          Scalar<std::string>(storage["endpoint"], Join(key, "endpoint"),
                                              "a URL such as http://127.0.0.1:9000"));
  }
  if (storage["region"]) {
    ARROW_ASSIGN_OR_RAISE(src->storage_region,
                          Scalar<std::string>(storage["region"], Join(key, "region"),
                                              "a string"));
  }
  if (src->path.find("://") == std::string::npos) {
    return ConfigError(key, "applies to s3:// and gs:// paths only");
  }
  if (src->storage_anonymous && src->path.rfind("gs://", 0) != 0) {
    return ConfigError(Join(key, "anonymous"),
                       "applies to gs:// paths only (S3 credentials come from the "
                       "environment: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)");
  }
  return Status::OK();
}

}  // namespace

bool LooksLikeMegatron(const SourceConfig& src) {
  if (src.format == SourceFormat::kMegatron) return true;
  if (src.format != SourceFormat::kAuto) return false;
  return DetectFormatFromName(src.path) == SourceFormat::kMegatron ||
         IsLocalMegatronPrefix(src.path);
}

Result<TokenizerConfig> ParseTokenizer(const YAML::Node& node, const std::string& key,
                                       const std::string& base_dir) {
  TokenizerConfig t;
  t.key = key;
  if (!node.IsMap()) {
    return ConfigError(key, "must be a map: {type: sentencepiece, model: PATH} or "
                            "{type: huggingface, file: PATH}");
  }
  if (node["type"]) {
    ARROW_ASSIGN_OR_RAISE(t.type,
                          Scalar<std::string>(node["type"], Join(key, "type"), "a string"));
    if (t.type != "sentencepiece" && t.type != "huggingface") {
      return ConfigError(Join(key, "type"), "must be sentencepiece or huggingface, got '" +
                                                EscapeForMessage(t.type) + "'");
    }
  }
  // The path key: `model` (a SentencePiece .model) or `file` (a tokenizer.json).
  const char* path_key = t.huggingface() ? "file" : "model";
  if (t.huggingface()) {
    ARROW_RETURN_NOT_OK(CheckMap(node, key, {"type", "file", "add_special_tokens",
                                             "bos_token", "eos_token", "chat_template"}));
  } else {
    ARROW_RETURN_NOT_OK(CheckMap(node, key, {"type", "model", "bos", "eos"}));
  }
  if (!node[path_key]) return ConfigError(Join(key, path_key), "is required");
  ARROW_ASSIGN_OR_RAISE(std::string model,
                        Scalar<std::string>(node[path_key], Join(key, path_key),
                                            "a string"));
  if (model.empty()) return ConfigError(Join(key, path_key), "must not be empty");
  t.model = ResolvePath(model, base_dir);
  if (node["bos"]) {
    ARROW_ASSIGN_OR_RAISE(t.bos, Scalar<bool>(node["bos"], Join(key, "bos"), "a boolean"));
  }
  if (node["eos"]) {
    ARROW_ASSIGN_OR_RAISE(t.eos, Scalar<bool>(node["eos"], Join(key, "eos"), "a boolean"));
  }
  if (node["add_special_tokens"]) {
    ARROW_ASSIGN_OR_RAISE(t.add_special_tokens,
                          Scalar<bool>(node["add_special_tokens"],
                                       Join(key, "add_special_tokens"), "a boolean"));
  }
  if (node["chat_template"]) {
    ARROW_ASSIGN_OR_RAISE(
        t.chat_template,
        Enum<bool>(node["chat_template"], Join(key, "chat_template"),
                   {{"auto", true}, {"plain", false}}));
  }
  for (auto [name, out] : {std::pair{"bos_token", &t.bos_token},
                           std::pair{"eos_token", &t.eos_token}}) {
    if (!node[name]) continue;
    ARROW_ASSIGN_OR_RAISE(*out,
                          Scalar<std::string>(node[name], Join(key, name), "a string"));
    if (out->empty()) return ConfigError(Join(key, name), "must not be empty");
  }
  return t;
}

Result<SourceConfig> ParseSource(const YAML::Node& node, const std::string& path,
                                 const std::string& base_dir) {
  ARROW_RETURN_NOT_OK(CheckMap(node, path,
                               {"name", "path", "tokens_column", "text_column",
                                "image_column", "weight", "oversize", "on_error",
                                "storage", "image", "shuffle_window",
                                "shuffle_window_bytes", "chat", "workers", "transform",
                                "loaders", "tokenizer", "length_column", "format"}));
  SourceConfig src;
  for (const char* required : {"name", "path"}) {
    if (!node[required]) return ConfigError(Join(path, required), "is required");
  }
  ARROW_ASSIGN_OR_RAISE(src.name,
                        Scalar<std::string>(node["name"], Join(path, "name"), "a string"));
  if (src.name.empty()) return ConfigError(Join(path, "name"), "must not be empty");
  ARROW_ASSIGN_OR_RAISE(std::string p,
                        Scalar<std::string>(node["path"], Join(path, "path"), "a string"));
  if (p.empty()) return ConfigError(Join(path, "path"), "must not be empty");
  src.path = ResolvePath(p, base_dir);
  if (node["format"]) {
    ARROW_ASSIGN_OR_RAISE(
        src.format, Enum<SourceFormat>(node["format"], Join(path, "format"),
                                       {{"auto", SourceFormat::kAuto},
                                        {"parquet", SourceFormat::kParquet},
                                        {"megatron", SourceFormat::kMegatron},
                                        {"jsonl", SourceFormat::kJsonl},
                                        {"hf_arrow", SourceFormat::kHfArrow},
                                        {"webdataset", SourceFormat::kWebDataset}}));
  }
  if (node["image_column"] && !node["text_column"]) {
    return ConfigError(Join(path, "image_column"), "needs text_column (the caption)");
  }
  ARROW_RETURN_NOT_OK(ParseSourceTransform(node, path, &src));
  ARROW_RETURN_NOT_OK(ParseSourceImage(node, path, base_dir, &src));
  if (node["length_column"]) {
    ARROW_RETURN_NOT_OK(
        ParseLengthColumn(node["length_column"], Join(path, "length_column"), &src));
  }
  if (node["tokenizer"]) {
    ARROW_ASSIGN_OR_RAISE(src.tokenizer,
                          ParseTokenizer(node["tokenizer"], Join(path, "tokenizer"),
                                         base_dir));
  }
  if (node["weight"]) {
    ARROW_ASSIGN_OR_RAISE(src.weight, ParseWeight(node["weight"], Join(path, "weight")));
  }
  if (node["oversize"]) {
    ARROW_ASSIGN_OR_RAISE(src.oversize,
                          Enum<Oversize>(node["oversize"], Join(path, "oversize"),
                                         {{"split", Oversize::kSplit},
                                          {"truncate", Oversize::kTruncate},
                                          {"skip", Oversize::kSkip}}));
  }
  if (node["on_error"]) {
    ARROW_ASSIGN_OR_RAISE(
        src.on_error, Enum<OnError>(node["on_error"], Join(path, "on_error"),
                                    {{"fail", OnError::kFail}, {"skip", OnError::kSkip}}));
  }
  if (const YAML::Node storage = node["storage"]) {
    ARROW_RETURN_NOT_OK(ParseSourceStorage(storage, Join(path, "storage"), &src));
  }
  if (node["shuffle_window"]) {
    ARROW_ASSIGN_OR_RAISE(src.shuffle_window_rows,
                          PositiveInt(node["shuffle_window"], Join(path, "shuffle_window")));
  }
  if (node["shuffle_window_bytes"]) {
    const std::string key = Join(path, "shuffle_window_bytes");
    ARROW_ASSIGN_OR_RAISE(src.shuffle_window_bytes,
                          Scalar<int64_t>(node["shuffle_window_bytes"], key, "an integer"));
    if (src.shuffle_window_bytes < 0) {
      return ConfigError(key, "must be >= 0 (0: no byte bound), got " +
                                  std::to_string(src.shuffle_window_bytes));
    }
  }
  return src;
}

}  // namespace braid::internal
