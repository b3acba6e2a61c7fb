// SentencePiece behind a plain interface: loading, encoding, decoding and training.
//
// Why a wrapper: Debian's sentencepiece_processor.h declares `namespace absl { using
// std::string_view; }`, which collides with Abseil's own absl::string_view (a class in Debian's
// build), so no translation unit can include both. Only sentencepiece_tokenizer.cc includes
// SentencePiece; this header uses only the standard library, and errors are strings (the caller
// wraps them in absl::Status).
#ifndef ABLATE_ORCHESTRATOR_DATA_SENTENCEPIECE_TOKENIZER_H_
#define ABLATE_ORCHESTRATOR_DATA_SENTENCEPIECE_TOKENIZER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace ablate {

// A loaded model. Encode and Decode are const and thread-safe (SentencePiece's processor is
// read-only once loaded): prepare encodes on several threads with one instance.
class SentencePieceTokenizer {
 public:
  // From the bytes of a .model file; nullptr with *error set when they are not a model.
  static std::unique_ptr<SentencePieceTokenizer> Load(const std::string& serialized,
                                                      std::string* error);
  ~SentencePieceTokenizer();

  int64_t vocab_size() const;  // GetPieceSize()
  int eos_id() const;          // -1 when the model has none
  int bos_id() const;
  int unk_id() const;

  // False with *error set when SentencePiece refuses the input.
  bool Encode(std::string_view text, std::vector<int>* ids, std::string* error) const;
  bool Decode(const std::vector<int>& ids, std::string* text, std::string* error) const;

 private:
  SentencePieceTokenizer();
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
};

// Trains a model on `sentences` with SentencePieceTrainer's flags `args` (model_type, vocab_size,
// ...: names as spm_train's, values as strings). Returns the serialized model, or "" with *error
// set to SentencePiece's message. `seed` seeds SentencePiece's random generator. Silences
// SentencePiece's informational log (process-wide) while it trains.
std::string TrainSentencePiece(const std::map<std::string, std::string>& args,
                               const std::vector<std::string>& sentences, unsigned int seed,
                               std::string* error);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_DATA_SENTENCEPIECE_TOKENIZER_H_
