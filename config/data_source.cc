#include "config/data_source.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace ablate {

namespace fs = std::filesystem;

namespace {

// PATH.bin or PATH.idx of a Megatron dataset named by its file: the prefix; else "".
std::string MegatronPrefixOf(const std::string& path) {
  for (const char* suffix : {".bin", ".idx"}) {
    if (absl::EndsWith(path, suffix)) {
      const std::string prefix = path.substr(0, path.size() - 4);
      if (IsMegatronPrefix(prefix)) return prefix;
    }
  }
  return IsMegatronPrefix(path) ? path : "";
}

absl::StatusOr<DataFormat> Detect(const std::string& path) {
  std::error_code ec;
  if (IsGlob(path)) return DATA_LLMC;
  if (fs::is_directory(path, ec)) {
    if (IsPreparedDir(path)) return DATA_PREPARED;
    if (fs::exists(fs::path(path) / "train.bin", ec)) return DATA_NANOGPT_BIN;
    return DATA_TEXT;
  }
  if (!MegatronPrefixOf(path).empty()) return DATA_MEGATRON;
  if (fs::exists(path, ec)) return HasLlmcMagic(path) ? DATA_LLMC : DATA_TEXT;
  return absl::NotFoundError(absl::StrCat(path, ": no such file or directory (nor ", path,
                                          ".bin and ", path, ".idx of a Megatron dataset)"));
}

absl::Status NoValPath(const DataConfig& config, const char* format) {
  if (config.val_path().empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("train.data.val_path: ", format,
                   " data holds its own validation split; val_path is for llm.c shards and "
                   "Megatron datasets"));
}

}  // namespace

absl::StatusOr<DataSource> ResolveDataSource(const DataConfig& config, const std::string& path,
                                             bool fingerprint) {
  DataSource source;
  source.path = path;
  std::error_code ec;
  if (config.format() == DATA_AUTO) {
    absl::StatusOr<DataFormat> format = Detect(path);
    if (!format.ok()) return format.status();
    source.format = *format;
  } else {
    source.format = config.format();
  }
  switch (source.format) {
    case DATA_PREPARED: {
      if (absl::Status s = NoValPath(config, "prepared"); !s.ok()) return s;
      absl::StatusOr<DataManifest> manifest = ReadManifest(path);
      if (!manifest.ok()) return manifest.status();
      source.train = {(fs::path(path) / manifest->train.file).string()};
      source.val = {(fs::path(path) / manifest->val.file).string()};
      source.fingerprint = manifest->checksum.substr(0, 16);
      source.manifest = *std::move(manifest);
      return source;  // keyed by its manifest: no file is read for a fingerprint
    }
    case DATA_NANOGPT_BIN:
      if (absl::Status s = NoValPath(config, "nanoGPT"); !s.ok()) return s;
      source.train = {(fs::path(path) / "train.bin").string()};
      source.val = {(fs::path(path) / "val.bin").string()};
      break;
    case DATA_TEXT:
      if (absl::Status s = NoValPath(config, "text"); !s.ok()) return s;
      if (fs::is_directory(path, ec)) {
        for (const auto& entry : fs::directory_iterator(path, ec)) {
          if (entry.is_regular_file() && entry.path().extension() == ".txt") {
            source.train.push_back(entry.path().string());
          }
        }
        std::sort(source.train.begin(), source.train.end());  // a stable corpus order
        if (source.train.empty()) {
          return absl::InvalidArgumentError(absl::StrCat(path, ": no .txt files in directory"));
        }
      } else {
        source.train = {path};
      }
      break;
    case DATA_LLMC: {
      absl::StatusOr<std::vector<std::string>> train = ExpandDataGlob(path);
      if (!train.ok()) return train.status();
      source.train = *std::move(train);
      if (!config.val_path().empty()) {
        absl::StatusOr<std::vector<std::string>> val = ExpandDataGlob(config.val_path());
        if (!val.ok()) return val.status();
        source.val = *std::move(val);
      }
      break;
    }
    case DATA_MEGATRON: {
      const std::string prefix = MegatronPrefixOf(path);
      if (prefix.empty()) {
        return absl::NotFoundError(
            absl::StrCat(path, ": a Megatron dataset needs ", path, ".bin and ", path, ".idx"));
      }
      source.train = {prefix};
      if (!config.val_path().empty()) {
        const std::string val = MegatronPrefixOf(config.val_path());
        if (val.empty()) {
          return absl::NotFoundError(
              absl::StrCat("train.data.val_path: ", config.val_path(),
                           ": a Megatron dataset needs PREFIX.bin and PREFIX.idx"));
        }
        source.val = {val};
      }
      break;
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("train.data.format: unknown value ", static_cast<int>(source.format)));
  }
  if (fingerprint) {
    std::vector<std::string> files;
    for (const auto* split : {&source.train, &source.val}) {
      for (const std::string& f : *split) {
        if (source.format == DATA_MEGATRON) {
          files.push_back(f + ".idx");
          files.push_back(f + ".bin");
        } else {
          files.push_back(f);
        }
      }
    }
    absl::StatusOr<std::string> print = FingerprintFiles(files);
    if (!print.ok()) return print.status();
    source.fingerprint = *std::move(print);
  }
  return source;
}

absl::Status ApplyDataSource(const DataSource& source, bool vocab_size_set, RunConfig* config) {
  DataConfig* d = config->mutable_train()->mutable_data();
  if (d->path().empty()) return absl::OkStatus();
  d->set_format(source.format);
  d->set_fingerprint(source.fingerprint);
  if (source.manifest) {
    const DataManifest& m = *source.manifest;
    d->set_token_dtype(m.token_bytes == 4 ? TOKEN_UINT32 : TOKEN_UINT16);
    d->set_eod_token(static_cast<int32_t>(m.eod_token));
    if (!vocab_size_set) {
      config->mutable_model()->set_vocab_size(static_cast<int32_t>(m.vocab_size));
    } else if (config->model().vocab_size() < m.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.vocab_size: ", config->model().vocab_size(),
                       " is smaller than the vocabulary of ", source.path, " (", m.vocab_size,
                       ", its manifest.json): leave vocab_size out to take the "
                       "manifest's, or give at least ",
                       m.vocab_size));
    }
  }
  if (d->doc_aligned() && source.format != DATA_PREPARED && source.format != DATA_MEGATRON &&
      !d->has_eod_token()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "train.data.doc_aligned: ", source.path,
        " has no documents ablate knows: give train.data.eod_token (the token that ends each), or "
        "use a prepared directory or a Megatron dataset"));
  }
  return absl::OkStatus();
}

RunConfig RunKeyView(const RunConfig& config) {
  RunConfig view = config;
  if (!config.train().data().fingerprint().empty()) {
    view.mutable_train()->mutable_data()->clear_path();
    view.mutable_train()->mutable_data()->clear_val_path();
  }
  // A multiple-choice task by its contents, as the data.
  for (EvalTask& task : *view.mutable_train()->mutable_evals()) {
    if (!task.fingerprint().empty()) task.clear_file();
  }
  return view;
}

}  // namespace ablate
