// Token data on disk (docs/data.md): the manifest of a prepared directory (what `ablate data
// prepare` and `ablate data synth` write), the formats a run reads directly (llm.c shards,
// Megatron-LM indexed datasets), shard globs, and the fingerprint that keys raw files.
//
// No protobuf and no LibTorch: the `ablate-data` binary links this beside SentencePiece (whose
// embedded protobuf must never share a process with gRPC's), and the worker and the sweep
// expander link it too. Pure functions over files; thread-safe.
#ifndef ABLATE_COMMON_TOKEN_FILES_H_
#define ABLATE_COMMON_TOKEN_FILES_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace ablate {

inline constexpr char kManifestFile[] = "manifest.json";
inline constexpr int kManifestVersion = 1;

// One split of a prepared directory: a flat file of little-endian tokens, each document followed
// by the end-of-document token.
struct SplitInfo {
  std::string file;  // "train.bin", relative to the directory
  int64_t documents = 0;
  int64_t tokens = 0;
  std::string sha256;  // of the file's bytes, hex
};

// One input of `ablate data prepare` (or the corpus a synthetic task drew on).
struct InputInfo {
  std::string path;  // as given
  int64_t bytes = 0;
  std::string sha256;  // of its bytes, hex
};

// manifest.json of a prepared directory. Special token ids are -1 when there is none.
struct DataManifest {
  std::string kind = "prepared";  // "prepared" (ablate data prepare) or "synthetic" (synth)
  // "bytes", "bpe", "unigram" (trained here), "model" (given), or "none" (a synthetic task's ids
  // that are not text: mqar).
  std::string tokenizer;
  std::string tokenizer_file;    // relative to the directory; "" for bytes
  std::string tokenizer_sha256;  // of that file; "" for bytes
  int64_t vocab_size = 0;
  int token_bytes = 2;     // 2 (uint16) or 4 (uint32): TokenBytesFor(vocab_size)
  int64_t eod_token = -1;  // ends every document
  int64_t bos_token = -1;
  int64_t unk_token = -1;
  SplitInfo train, val;
  std::vector<InputInfo> inputs;
  // How the data was made: the command's settings (val_fraction, seed, ...) or a synthetic
  // task's parameters ({"task": "bigram-backcopy", ...}). Any JSON object.
  nlohmann::json params = nlohmann::json::object();
  std::string ablate_version;  // BuildVersion() of the binary that wrote it
  // SHA-256 (hex) of the manifest's canonical JSON without this field: what keys runs on this
  // data, and what catches a manifest edited by hand. Set by WriteManifest and ReadManifest.
  std::string checksum;
};

// 2 for a vocabulary that fits uint16 (<= 65,536 ids), else 4.
int TokenBytesFor(int64_t vocab_size);

// The manifest as JSON (every field, checksum included when set).
nlohmann::json ManifestJson(const DataManifest& m);
// Computes m->checksum and writes DIR/manifest.json durably (a temporary file renamed over it).
absl::Status WriteManifest(const std::string& dir, DataManifest* m);
// Reads DIR/manifest.json. Errors name the file and what is wrong: not JSON, a missing or
// mistyped field, an unknown version, a checksum that does not match (edited by hand), a split
// file whose size is not its token count times token_bytes, special tokens outside the vocabulary.
absl::StatusOr<DataManifest> ReadManifest(const std::string& dir);
// True when DIR/manifest.json exists (a prepared directory).
bool IsPreparedDir(const std::string& dir);

// llm.c / modded-nanogpt shards: a header of 256 little-endian int32 (magic 20240520, version 1
// for uint16 tokens, the token count), then the tokens.
inline constexpr int32_t kLlmcMagic = 20240520;
inline constexpr int64_t kLlmcHeaderBytes = 256 * 4;
struct LlmcShard {
  int64_t tokens = 0;  // from the header, checked against the file's size
  int token_bytes = 2;
};
// True when the file starts with the llm.c magic (false when it cannot be read).
bool HasLlmcMagic(const std::string& path);
// The header of an llm.c shard. Errors name the file: shorter than its header, a wrong magic or
// version, a token count that disagrees with the file's size (a short or long body).
absl::StatusOr<LlmcShard> ReadLlmcHeader(const std::string& path);

// A Megatron-LM indexed dataset: PREFIX.idx (the MMIDIDX header, version 1, a dtype code, the
// sequence and document counts, then sequence lengths, byte pointers and the document index)
// describing PREFIX.bin.
struct MegatronIndex {
  int dtype_code = 0;  // 1 uint8, 4 int32, 8 uint16 are read; others are refused
  int token_bytes = 0;
  std::vector<int32_t> lengths;    // tokens per sequence
  std::vector<int64_t> pointers;   // byte offset of each sequence in PREFIX.bin
  std::vector<int64_t> documents;  // the first sequence of each document, then the count
  int64_t bin_bytes = 0;           // the size of PREFIX.bin
};
// Errors name the file and the offset: a wrong header or version, a dtype not read, an index
// shorter than its counts, sequences that are not contiguous or run past PREFIX.bin's end, a
// PREFIX.bin longer than its sequences, a document index that is not increasing.
absl::StatusOr<MegatronIndex> ReadMegatronIndex(const std::string& prefix);
// True when PREFIX.idx and PREFIX.bin both exist.
bool IsMegatronPrefix(const std::string& prefix);

// The files a path names: itself, or the sorted matches of a glob (`*`, `?`, `[...]` in the last
// component). NotFound naming the pattern when a glob matches nothing.
bool IsGlob(const std::string& path);
absl::StatusOr<std::vector<std::string>> ExpandDataGlob(const std::string& pattern);

// A fingerprint of raw files that changes when their contents change: SHA-256 over, per file in
// order, its size, modification time (ns) and the bytes of 17 blocks of 64 KiB (the first, the
// last and 15 evenly between; every byte of a file up to 1.1 MB). Not its path: the same files
// moved (mv keeps the time) keep it. 16 hex digits. Errors name an unreadable file.
absl::StatusOr<std::string> FingerprintFiles(const std::vector<std::string>& files);

// Incremental SHA-256 (OpenSSL's EVP), for the files written and read here: Update as the bytes
// go by, Hex once at the end.
class Sha256Stream {
 public:
  Sha256Stream();
  ~Sha256Stream();
  Sha256Stream(const Sha256Stream&) = delete;
  Sha256Stream& operator=(const Sha256Stream&) = delete;
  void Update(const void* data, size_t n);
  // The digest in lower-case hex; the stream is spent.
  std::string Hex();

 private:
  struct Context;
  std::unique_ptr<Context> context_;
};

// SHA-256 of a file's bytes, hex (streamed). Errors name the file.
absl::StatusOr<std::string> Sha256File(const std::string& path);

}  // namespace ablate

#endif  // ABLATE_COMMON_TOKEN_FILES_H_
