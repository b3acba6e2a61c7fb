// The only file that includes SentencePiece's headers (see the header for why: no Abseil here).
#include "orchestrator/data/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <unordered_map>

namespace ablate {
namespace {

// Hands the sentences to the trainer one at a time, without copying them again.
class VectorIterator : public sentencepiece::SentenceIterator {
 public:
  explicit VectorIterator(const std::vector<std::string>& sentences) : sentences_(sentences) {}
  bool done() const override { return next_ >= sentences_.size(); }
  void Next() override { ++next_; }
  const std::string& value() const override { return sentences_[next_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<std::string>& sentences_;
  size_t next_ = 0;
};

}  // namespace

SentencePieceTokenizer::SentencePieceTokenizer()
    : processor_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {}
SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::unique_ptr<SentencePieceTokenizer> SentencePieceTokenizer::Load(const std::string& serialized,
                                                                     std::string* error) {
  std::unique_ptr<SentencePieceTokenizer> tokenizer(new SentencePieceTokenizer());
  const sentencepiece::util::Status status =
      tokenizer->processor_->LoadFromSerializedProto(serialized);
  if (!status.ok()) {
    *error = status.ToString();
    return nullptr;
  }
  return tokenizer;
}

int64_t SentencePieceTokenizer::vocab_size() const { return processor_->GetPieceSize(); }
int SentencePieceTokenizer::eos_id() const { return processor_->eos_id(); }
int SentencePieceTokenizer::bos_id() const { return processor_->bos_id(); }
int SentencePieceTokenizer::unk_id() const { return processor_->unk_id(); }

bool SentencePieceTokenizer::Encode(std::string_view text, std::vector<int>* ids,
                                    std::string* error) const {
  const sentencepiece::util::Status status = processor_->Encode(text, ids);
  if (!status.ok()) {
    *error = status.ToString();
    return false;
  }
  return true;
}

bool SentencePieceTokenizer::Decode(const std::vector<int>& ids, std::string* text,
                                    std::string* error) const {
  const sentencepiece::util::Status status = processor_->Decode(ids, text);
  if (!status.ok()) {
    *error = status.ToString();
    return false;
  }
  return true;
}

std::string TrainSentencePiece(const std::map<std::string, std::string>& args,
                               const std::vector<std::string>& sentences, unsigned int seed,
                               std::string* error) {
  std::unordered_map<std::string, std::string> kwargs(args.begin(), args.end());
  // 2: warnings and errors only. SentencePiece logs every training step at INFO on stderr, which
  // would bury the progress bar; what goes wrong comes back in the status anyway.
  kwargs.emplace("minloglevel", "2");
  sentencepiece::SetRandomGeneratorSeed(seed);
  VectorIterator iterator(sentences);
  std::string model;
  const sentencepiece::util::Status status =
      sentencepiece::SentencePieceTrainer::Train(kwargs, &iterator, &model);
  if (!status.ok()) {
    *error = status.message();
    return "";
  }
  return model;
}

}  // namespace ablate
