// Writes a prepared data directory (docs/data.md): train.bin and val.bin of little-endian
// tokens, each document followed by the end-of-document token, and manifest.json last.
//
// Atomic: everything is written into a hidden sibling directory (OUT.partial-PID) and renamed to
// OUT only by Commit(), after the manifest; a process killed before that leaves no OUT (and
// Open() removes a stale partial directory of a dead writer). Never a half directory that looks
// complete. Shared by `ablate data prepare` and `ablate data synth`; links no protobuf.
#ifndef ABLATE_ORCHESTRATOR_DATA_PREPARED_WRITER_H_
#define ABLATE_ORCHESTRATOR_DATA_PREPARED_WRITER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/token_files.h"

namespace ablate {

class PreparedWriter {
 public:
  enum class Split { kTrain, kVal };

  // Starts OUT. AlreadyExists naming OUT when it exists and `replace` is false (with `replace`,
  // Commit() swaps the old directory out only once the new one is complete). `token_bytes` is 2 or
  // 4 (TokenBytesFor(vocab_size)); ids are checked against vocab_size as they are written.
  static absl::StatusOr<std::unique_ptr<PreparedWriter>> Open(const std::string& out,
                                                              int64_t vocab_size, int token_bytes,
                                                              int64_t eod_token, bool replace);
  ~PreparedWriter();  // removes the partial directory when Commit() did not run

  // Appends one document's tokens and then the end-of-document token to `split`. InvalidArgument
  // naming the document when an id is outside [0, vocab_size).
  absl::Status AddDocument(Split split, const std::vector<int32_t>& tokens);

  // AddDocument in parts, for a document too long to hold whole (prepare encodes a huge single
  // file in chunks of lines): AppendTokens adds tokens to the document open in `split`, and
  // EndDocument appends the end-of-document token and counts it. Same id check as AddDocument.
  absl::Status AppendTokens(Split split, const std::vector<int32_t>& tokens);
  absl::Status EndDocument(Split split);

  // The partial directory, for files that go beside the splits (the tokenizer model).
  const std::string& partial_dir() const { return partial_; }

  // Fills manifest->{vocab_size, token_bytes, eod_token, train, val, ablate_version}, writes it,
  // syncs and renames the directory to OUT. InvalidArgument when a split has no document.
  absl::Status Commit(DataManifest* manifest);

 private:
  PreparedWriter() = default;
  struct SplitFile;
  std::string out_, partial_;
  int64_t vocab_size_ = 0;
  int token_bytes_ = 2;
  int64_t eod_ = -1;
  bool replace_ = false;
  bool committed_ = false;
  std::unique_ptr<SplitFile> train_, val_;
};

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_DATA_PREPARED_WRITER_H_
