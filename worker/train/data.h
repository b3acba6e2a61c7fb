// Token data for training (docs/data.md): byte-level text, nanoGPT token files, prepared
// directories, llm.c shards and Megatron indexed datasets (config/data_source.h resolves which);
// a deterministic train/validation split, documents where they are known, and batches that are
// pure functions of (data seed, batch index).
//
// No LibTorch here: batches are written into caller-provided int64 buffers, so resuming or
// rolling back a run needs no iterator state. Immutable after Load(); thread-safe to read.
#ifndef ABLATE_WORKER_TRAIN_DATA_H_
#define ABLATE_WORKER_TRAIN_DATA_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/ablate.pb.h"

namespace ablate {

// Where the default corpus (kjv.txt, written by `make data`, installed by `make install`) is
// looked for, in order, for a binary at `exe` and $ABLATE_DATA_DIR = `data_dir` (null: unset).
// With ABLATE_DATA_DIR set, only there. Else: beside the installed binaries
// (EXE_DIR/../share/ablate), the build tree's (EXE_DIR/../data), the source tree this was built
// from (SOURCE/data), and ./data. So a worker finds it from any working directory.
std::vector<std::string> DefaultCorpusCandidates(const std::string& exe, const char* data_dir);
// The first of this process's candidates that exists; "" when none does.
std::string DefaultCorpusPath();

// A read-only array of token ids, 1, 2 or 4 bytes each (little-endian): a text corpus's bytes
// held in memory, or a token file mapped into memory (mmap), so that a 17 GB train.bin costs
// address space, not memory, and the ranks of one machine share its pages. Copies share the data.
class TokenArray {
 public:
  TokenArray() = default;
  // `bytes` as tokens of one byte each (byte-level text).
  static TokenArray OfBytes(std::string bytes);
  // The file at `path` mapped, as tokens of `width` bytes (1, 2: uint16, 4: uint32) from byte
  // `offset` on (an llm.c shard's header is skipped). Errors name the file: unreadable, or a size
  // that is not a whole number of tokens.
  static absl::StatusOr<TokenArray> Map(const std::string& path, int width, int64_t offset = 0);

  int64_t size() const { return size_; }
  int width() const { return width_; }
  int64_t operator[](int64_t i) const {
    switch (width_) {
      case 1: return data_[i];
      case 2: return reinterpret_cast<const uint16_t*>(data_)[i];
      default: return reinterpret_cast<const uint32_t*>(data_)[i];
    }
  }
  // Tokens [begin, end) of this array, sharing its data.
  TokenArray Slice(int64_t begin, int64_t end) const;
  // The first token >= vocab_size, by index; -1 when every token is below it. One pass.
  int64_t FirstOutside(int64_t vocab_size) const;

 private:
  std::shared_ptr<const void> owner_;  // the string or the mapping
  const uint8_t* data_ = nullptr;
  int64_t size_ = 0;
  int width_ = 1;
};

class TokenData {
 public:
  // Loads config.path (or the default corpus). Errors name the file: unreadable, empty, tokens
  // outside the vocabulary (the first one, by offset), a split shorter than seq_len + 1 tokens,
  // or a fingerprint (set by expansion) that the data no longer has: it changed after the sweep
  // was submitted. Token files are mapped, not read (TokenArray).
  static absl::StatusOr<TokenData> Load(const DataConfig& config, int64_t vocab_size,
                                        int64_t seq_len);

  enum class Split { kTrain, kVal };

  // Writes batch `index` of `split`: inputs (batch_size x seq_len) and the next-token targets,
  // row-major int64. The same (data_seed, split, index) always gives the same batch. With a
  // bos_token every input row is [bos, c0, ..., c(seq_len-2)] and its targets [c0, ...,
  // c(seq_len-1)]: the first target is the window's first corpus token. With doc_aligned, every
  // window starts at a document start (windows run on into the next document: packed).
  void Batch(Split split, int64_t index, int64_t batch_size, int64_t* inputs,
             int64_t* targets) const;
  // The same at another window length (TrainConfig.eval_seq_lens); the split must hold at least
  // seq_len + 1 tokens (tokens(split)).
  void Batch(Split split, int64_t index, int64_t batch_size, int64_t seq_len, int64_t* inputs,
             int64_t* targets) const;

  // `count` consecutive windows of `len` tokens cut from the start of `split`, back to back
  // (window w covers tokens [w len, (w + 1) len) and predicts each one's successor): the same
  // text at every window length. The split must hold count * len + 1 tokens (windows do not cross
  // from one file of a split to the next; past the last, they start over). With a bos_token, each
  // input row starts with it as in Batch.
  void Consecutive(Split split, int64_t count, int64_t len, int64_t* inputs,
                   int64_t* targets) const;

  int64_t train_tokens() const { return train_.tokens; }
  int64_t val_tokens() const { return val_.tokens; }
  // Documents known in each split (0 where they are not).
  int64_t train_documents() const { return train_.documents; }
  int64_t val_documents() const { return val_.documents; }
  const std::string& source() const { return source_; }
  // The trigger tokens of bigram-backcopy data (its manifest's params.trigger_tokens): they split
  // the probes' query positions into trigger and non_trigger classes. Empty for other data.
  const std::vector<int32_t>& triggers() const { return triggers_; }

  // One file of a split (or a part of one): its tokens and, where documents are known, the
  // offsets where documents start (sorted, the first 0).
  struct Segment {
    TokenArray tokens;
    std::vector<int64_t> starts;
  };
  struct SplitTokens {
    std::vector<Segment> segments;
    int64_t tokens = 0;
    int64_t documents = 0;
  };

 private:
  TokenData() = default;
  // One window of `len` inputs from tokens[start] and their next-token targets (with the
  // bos_token first when set).
  void Window(const TokenArray& tokens, int64_t start, int64_t len, int64_t* in,
              int64_t* out) const;

  SplitTokens train_, val_;
  bool doc_aligned_ = false;
  uint64_t seed_ = 0;
  int64_t seq_len_ = 0;
  int32_t bos_ = -1;  // DataConfig.bos_token, -1 when unset
  std::vector<int32_t> triggers_;
  std::string source_;  // human-readable: the path(s) loaded
};

}  // namespace ablate

#endif  // ABLATE_WORKER_TRAIN_DATA_H_
