// What a run's `train.data` names, resolved on the file system (docs/data.md): its format, the
// files of each split, a prepared directory's manifest, and the fingerprint that puts the data's
// contents into the run key.
//
// The sweep expander resolves each distinct data config once (ApplyDataSource: the manifest's
// vocabulary, token width and end-of-document token, and the fingerprint, go into the run's
// config); the worker resolves it again when it opens the data and refuses data whose
// fingerprint is no longer the one the run was keyed by. Pure functions over files; thread-safe.
#ifndef ABLATE_CONFIG_DATA_SOURCE_H_
#define ABLATE_CONFIG_DATA_SOURCE_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/token_files.h"
#include "proto/ablate.pb.h"

namespace ablate {

struct DataSource {
  DataFormat format = DATA_AUTO;  // never AUTO once resolved
  std::string path;               // as resolved (the default corpus's for an empty path)
  // The files of each split: TEXT: the text files (val empty: cut from the end); NANOGPT_BIN and
  // PREPARED: train.bin, val.bin; LLMC: the shards; MEGATRON: the prefix (val empty without
  // val_path: held out by documents).
  std::vector<std::string> train, val;
  std::optional<DataManifest> manifest;  // PREPARED
  // PREPARED: the first 16 digits of the manifest's checksum; otherwise FingerprintFiles over
  // every file read (a Megatron dataset's .idx and .bin). Empty when not asked for.
  std::string fingerprint;
};

// Resolves `config` with its path replaced by `path` (the caller's default corpus for an empty
// one). Errors name the path: nothing there, a glob that matches nothing, a format that does not
// fit what is there, a manifest that does not read (ReadManifest), val_path where the format
// has its own split. With `fingerprint`, also computes it (reads sampled blocks of raw files).
absl::StatusOr<DataSource> ResolveDataSource(const DataConfig& config, const std::string& path,
                                             bool fingerprint);

// What expansion takes from the data into a run's config: data.fingerprint; for a prepared
// directory also data.format, token_dtype and eod_token, and model.vocab_size unless the spec set
// it (`vocab_size_set`): one smaller than the manifest's is an error naming both (a larger one
// is padding, as nanoGPT's 50304 for GPT-2's 50257). doc_aligned without known documents is an
// error too. Does nothing for an empty path (the default corpus, fixed by `make data`).
absl::Status ApplyDataSource(const DataSource& source, bool vocab_size_set, RunConfig* config);

// The run key's view of a config: with data.fingerprint set, data.path and data.val_path
// cleared (the same bytes elsewhere train the same run), and the file of each evaluation task
// with a fingerprint (multiple_choice) cleared likewise; otherwise the config itself.
RunConfig RunKeyView(const RunConfig& config);

}  // namespace ablate

#endif  // ABLATE_CONFIG_DATA_SOURCE_H_
