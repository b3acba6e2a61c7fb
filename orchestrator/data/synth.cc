#include "orchestrator/data/synth.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/token_files.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "orchestrator/data/prepared_writer.h"
#include "orchestrator/data/sentencepiece_tokenizer.h"

namespace ablate {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr char kBigramBackcopy[] = "bigram-backcopy";
constexpr char kMqar[] = "mqar";
constexpr char kPasskey[] = "passkey";

// A raw text --from is read as bytes, as `ablate data prepare --tokenizer bytes` writes them: ids
// 0-255 are the bytes, then the end-of-document and BOS tokens.
constexpr int64_t kByteEod = 256;
constexpr int64_t kByteBos = 257;
constexpr int64_t kByteVocab = 258;

// mqar's vocabulary when --vocab is 0: Zoology's default (multiquery_ar's vocab_size = 8_192; the
// paper stresses that large vocabularies separate architectures that small ones do not).
constexpr int64_t kMqarDefaultVocab = 8192;

// The manifest's tokenizer kind for mqar, whose ids are no text at all.
constexpr char kNoTokenizer[] = "none";

// ---- Random numbers -------------------------------------------------------------------------
// std::mt19937_64 and std::seed_seq are specified exactly by the standard, the std distributions
// are not (libstdc++ and libc++ differ): the draws below are written out so that a seed gives the
// same files on every platform.
class Rng {
 public:
  // `stream` separates the independent streams of one seed (train, val).
  Rng(uint64_t seed, uint64_t stream) {
    std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                      static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)};
    gen_.seed(seq);
  }

  // Uniform in [0, n), n > 0, unbiased: draws below 2^64 mod n are rejected.
  uint64_t Below(uint64_t n) {
    const uint64_t threshold = (0 - n) % n;
    for (;;) {
      const uint64_t x = gen_();
      if (x >= threshold) return x % n;
    }
  }
  // Uniform in [lo, hi].
  int64_t Between(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(Below(static_cast<uint64_t>(hi - lo) + 1));
  }
  // Uniform in [0, 1), 53 bits.
  double Uniform() { return static_cast<double>(gen_() >> 11) * 0x1.0p-53; }
  bool Bernoulli(double p) { return Uniform() < p; }

 private:
  std::mt19937_64 gen_;
};

// Samples an index from cumulative counts (cum[i] = count of ids <= i), total = cum.back() > 0.
template <typename Cumulative>
size_t SampleCumulative(Rng& rng, const Cumulative& cum, int64_t total) {
  const int64_t r = static_cast<int64_t>(rng.Below(static_cast<uint64_t>(total)));
  return std::upper_bound(cum.begin(), cum.end(), r) - cum.begin();
}

// ---- The --from corpus ------------------------------------------------------------------------

// The corpus a task draws on: its token stream (a prepared directory's train.bin, or a text file's
// bytes) and the vocabulary the synthetic data then shares.
struct Corpus {
  std::string from;         // as given
  bool prepared = false;    // a prepared directory, else a raw text file read as bytes
  std::string tokens_file;  // DIR/train.bin or the text file
  int token_bytes = 1;      // width in tokens_file: 1 for a text file's bytes
  int64_t num_tokens = 0;   // in tokens_file
  DataManifest source;      // a prepared directory's manifest (tokenizer, special ids)
  int64_t vocab_size = kByteVocab;
  int64_t eod = kByteEod;
  int64_t bos = kByteBos;
  InputInfo input;  // for the written manifest's inputs

  // End-of-document and BOS never enter statistics or filler: they are structure, not text.
  bool IsSpecial(int64_t id) const { return id == eod || id == bos; }
};

absl::StatusOr<Corpus> OpenCorpus(const std::string& from) {
  Corpus c;
  c.from = from;
  std::error_code ec;
  if (!fs::exists(from, ec)) {
    return absl::NotFoundError(absl::StrCat("--from ", from, ": no such file or directory"));
  }
  if (fs::is_directory(from, ec)) {
    if (!IsPreparedDir(from)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--from ", from, " is a directory without ", kManifestFile,
          ": name a prepared directory (ablate data prepare ... --out DIR) or a raw text file"));
    }
    absl::StatusOr<DataManifest> m = ReadManifest(from);
    if (!m.ok()) return m.status();
    if (m->bos_token < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--from ", from,
                       ": its manifest has no BOS token (special_tokens.bos is -1), and every "
                       "synthetic sequence starts with BOS; prepare the corpus with a tokenizer "
                       "that has one, or "
                       "name the raw text file (read as bytes, BOS ",
                       kByteBos, ")"));
    }
    c.prepared = true;
    c.source = *m;
    c.tokens_file = (fs::path(from) / m->train.file).string();
    c.token_bytes = m->token_bytes;
    c.num_tokens = m->train.tokens;
    c.vocab_size = m->vocab_size;
    c.eod = m->eod_token;
    c.bos = m->bos_token;
    // Its train split is what is read; its hash is already in its manifest (hashing GBs again
    // would only repeat it); the params record the manifest's checksum beside it.
    c.input = {from, m->train.tokens * m->token_bytes, m->train.sha256};
  } else {
    c.tokens_file = from;
    c.num_tokens = static_cast<int64_t>(fs::file_size(from, ec));
    if (ec)
      return absl::NotFoundError(
          absl::StrCat("--from ", from, ": cannot read its size: ", ec.message()));
    absl::StatusOr<std::string> sha = Sha256File(from);
    if (!sha.ok()) return sha.status();
    c.input = {from, c.num_tokens, *sha};
  }
  if (c.num_tokens == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--from ", c.tokens_file, " is empty: no text to draw on"));
  }
  return c;
}

// Reads a corpus's token file: sequential blocks or a window at any offset, ids checked against
// the vocabulary.
class TokenReader {
 public:
  explicit TokenReader(const Corpus& corpus)
      : corpus_(corpus), in_(corpus.tokens_file, std::ios::binary) {}

  // Up to `n` tokens from token offset `offset` (fewer at the end of the file) into `out`.
  absl::Status Read(int64_t offset, int64_t n, std::vector<int32_t>* out) {
    out->clear();
    if (!in_)
      return absl::NotFoundError(absl::StrCat(corpus_.tokens_file, ": cannot open for reading"));
    n = std::min(n, corpus_.num_tokens - offset);
    if (n <= 0) return absl::OkStatus();
    const int width = corpus_.token_bytes;
    bytes_.resize(static_cast<size_t>(n * width));
    in_.clear();
    in_.seekg(offset * width);
    if (!in_.read(reinterpret_cast<char*>(bytes_.data()), n * width)) {
      return absl::DataLossError(absl::StrCat(corpus_.tokens_file, ": short read at byte ",
                                              offset * width,
                                              " (the file changed while it was read?)"));
    }
    out->resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const unsigned char* b = &bytes_[static_cast<size_t>(i * width)];
      uint32_t id = b[0];  // little-endian, whatever the host's order
      if (width >= 2) id |= static_cast<uint32_t>(b[1]) << 8;
      if (width == 4) id |= static_cast<uint32_t>(b[2]) << 16 | static_cast<uint32_t>(b[3]) << 24;
      if (id >= static_cast<uint64_t>(corpus_.vocab_size)) {
        return absl::InvalidArgumentError(
            absl::StrCat(corpus_.tokens_file, ": token ", id, " at token offset ", offset + i,
                         " is outside the vocabulary [0, ", corpus_.vocab_size, ")"));
      }
      (*out)[static_cast<size_t>(i)] = static_cast<int32_t>(id);
    }
    return absl::OkStatus();
  }

 private:
  const Corpus& corpus_;
  std::ifstream in_;
  std::vector<unsigned char> bytes_;
};

constexpr int64_t kReadBlock = 1 << 20;

// Draws filler text from the corpus: `n` consecutive tokens from a random offset, special tokens
// skipped (documents glued), wrapping at the end of the file (a corpus shorter than a document
// repeats).
absl::Status DrawFiller(const Corpus& corpus, TokenReader& reader, Rng& rng, int64_t n,
                        std::vector<int32_t>* out) {
  out->clear();
  int64_t offset = static_cast<int64_t>(rng.Below(static_cast<uint64_t>(corpus.num_tokens)));
  int64_t read = 0;
  std::vector<int32_t> block;
  while (static_cast<int64_t>(out->size()) < n) {
    if (read >= corpus.num_tokens && out->empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--from ", corpus.tokens_file,
                       " holds only end-of-document and BOS tokens: no filler text"));
    }
    const int64_t want = std::min<int64_t>(n - static_cast<int64_t>(out->size()) + 64, kReadBlock);
    absl::Status s = reader.Read(offset, want, &block);
    if (!s.ok()) return s;
    for (int32_t t : block) {
      if (!corpus.IsSpecial(t) && static_cast<int64_t>(out->size()) < n) out->push_back(t);
    }
    read += static_cast<int64_t>(block.size());
    offset += static_cast<int64_t>(block.size());
    if (offset >= corpus.num_tokens) offset = 0;
  }
  return absl::OkStatus();
}

// ---- bigram-backcopy --------------------------------------------------------------------------
//
// Guo et al. 2024, "Active-Dormant Attention Heads" (arXiv 2410.13835), the Bigram-Backcopy (BB)
// task, as its released data code builds it (GuoTianYu2000/Active-Dormant-Attention, BBM/: the BB
// generator `dormant_copy_2`, DataArgs seq_length 256 and bos_num 1, the README's data_args.k=3):
//   - a bigram transition table estimated on a corpus;
//   - trigger tokens: the k most frequent tokens by unigram count (`fixed_special_toks`: the top k
//     of the marginal's argsort); the released scripts use k = 3, our --triggers default;
//   - every sequence starts with <s>; the token after <s> is never a trigger (`no_trigger_init`);
//   - then, for the current token x: if x is a trigger, the next token copies the token before x
//     (backcopy); otherwise it is drawn from x's bigram row.
// Edge cases, as that generator settles them: since the first token is not a trigger, every
// trigger is preceded by a non-trigger (a trigger is produced either by a bigram draw from a
// non-trigger or by a copy of the token before a trigger, which by induction is not one), so a
// copied token is never itself a trigger and never <s>; a trigger may follow a copy.
// Differences: the released code draws the first token uniformly from the non-trigger ids <= 64
// (its small character vocabulary); over a real vocabulary uniform puts most of the mass on ids
// the corpus barely uses, so we draw it from the corpus unigram restricted to non-triggers. A
// token the corpus never follows within a document (its last token, say) has an empty row and
// falls back to the unigram distribution; the released code's table has a row for every token.
// Bigrams never cross a document boundary of a prepared corpus.

struct BigramModel {
  // Per token, its successors (ascending id) with cumulative counts; empty for a token never
  // followed within a document.
  std::vector<std::vector<std::pair<int32_t, int64_t>>> rows;
  std::vector<int64_t> unigram_cum;  // cumulative unigram counts over all ids
  std::vector<int64_t> first_cum;    // the same with triggers zeroed: the token after BOS
  std::vector<bool> is_trigger;
  std::vector<int32_t> triggers;  // most frequent first
  int64_t distinct = 0;           // ids seen in the corpus
};

absl::StatusOr<BigramModel> EstimateBigrams(const Corpus& corpus, int num_triggers) {
  BigramModel m;
  const size_t vocab = static_cast<size_t>(corpus.vocab_size);
  std::vector<int64_t> unigram(vocab, 0);
  std::unordered_map<uint64_t, int64_t> pairs;
  TokenReader reader(corpus);
  std::vector<int32_t> block;
  int64_t prev = -1;
  for (int64_t offset = 0; offset < corpus.num_tokens; offset += kReadBlock) {
    absl::Status s = reader.Read(offset, kReadBlock, &block);
    if (!s.ok()) return s;
    for (int32_t t : block) {
      if (corpus.IsSpecial(t)) {
        prev = -1;  // a document boundary: no bigram across it
        continue;
      }
      ++unigram[static_cast<size_t>(t)];
      if (prev >= 0) ++pairs[static_cast<uint64_t>(prev) << 32 | static_cast<uint32_t>(t)];
      prev = t;
    }
  }
  m.rows.resize(vocab);
  for (const auto& [key, count] : pairs) {
    m.rows[static_cast<size_t>(key >> 32)].emplace_back(static_cast<int32_t>(key & 0xffffffffu),
                                                        count);
  }
  for (auto& row : m.rows) {  // the hash map's order is not deterministic: sort, then accumulate
    std::sort(row.begin(), row.end());
    int64_t sum = 0;
    for (auto& [next, count] : row) count = sum += count;
  }
  std::vector<int32_t> seen;
  for (size_t id = 0; id < vocab; ++id) {
    if (unigram[id] > 0) seen.push_back(static_cast<int32_t>(id));
  }
  m.distinct = static_cast<int64_t>(seen.size());
  if (m.distinct == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--from ", corpus.tokens_file,
                     " holds only end-of-document and BOS tokens: no bigrams to estimate"));
  }
  if (num_triggers >= m.distinct) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--triggers ", num_triggers, " leaves no non-trigger token: --from ", corpus.from,
        " has only ", m.distinct, " distinct tokens; the token after BOS must be a non-trigger"));
  }
  std::stable_sort(seen.begin(), seen.end(), [&](int32_t a, int32_t b) {
    return unigram[static_cast<size_t>(a)] >
           unigram[static_cast<size_t>(b)];  // ties: smaller id first
  });
  m.triggers.assign(seen.begin(), seen.begin() + num_triggers);
  m.is_trigger.assign(vocab, false);
  for (int32_t t : m.triggers) m.is_trigger[static_cast<size_t>(t)] = true;
  m.unigram_cum.resize(vocab);
  m.first_cum.resize(vocab);
  int64_t all = 0, first = 0;
  for (size_t id = 0; id < vocab; ++id) {
    m.unigram_cum[id] = all += unigram[id];
    m.first_cum[id] = first += m.is_trigger[id] ? 0 : unigram[id];
  }
  return m;
}

// One sequence: BOS, then seq_len tokens.
void BigramBackcopySequence(const BigramModel& m, int64_t bos, int seq_len, Rng& rng,
                            std::vector<int32_t>* seq) {
  seq->clear();
  seq->push_back(static_cast<int32_t>(bos));
  seq->push_back(static_cast<int32_t>(SampleCumulative(rng, m.first_cum, m.first_cum.back())));
  while (static_cast<int>(seq->size()) < seq_len + 1) {
    const int32_t x = seq->back();
    if (m.is_trigger[static_cast<size_t>(x)]) {
      seq->push_back((*seq)[seq->size() - 2]);  // backcopy: the token before the trigger
      continue;
    }
    const auto& row = m.rows[static_cast<size_t>(x)];
    if (row.empty()) {
      seq->push_back(
          static_cast<int32_t>(SampleCumulative(rng, m.unigram_cum, m.unigram_cum.back())));
      continue;
    }
    const int64_t r = static_cast<int64_t>(rng.Below(static_cast<uint64_t>(row.back().second)));
    const auto it = std::upper_bound(
        row.begin(), row.end(), r,
        [](int64_t v, const std::pair<int32_t, int64_t>& e) { return v < e.second; });
    seq->push_back(it->first);
  }
}

// ---- mqar --------------------------------------------------------------------------------------
//
// Arora et al. 2023, "Zoology" (arXiv 2312.04927), multi-query associative recall, as its released
// generator builds it (HazyResearch/zoology, zoology/data/multiquery_ar.py):
//   - keys from the first half of the vocabulary, values from the second (key_vocab_size =
//     vocab_size // 2), both drawn without replacement per sequence;
//   - the pairs first, k1 v1 k2 v2 ...; then the query region, cut into slots of two positions;
//     each query takes a distinct slot drawn with probability ~ g^(a-1) for slot g = 1, 2, ...
//     (power_a = 0.01: real text repeats a bigram soon after its first use, rarely later);
//   - every key is queried (Zoology has no separate query count); with --queries < --pairs a
//     random subset of the keys is, each at most once;
//   - the other positions are random tokens (random_non_queries, Zoology's default).
// Differences, because this is a language-modelling corpus trained at every position rather than
// Zoology's inputs with labels only at the answers:
//   - the value is written after its query key (Zoology puts it in the label only);
//   - random filler never equals one of the sequence's keys: Zoology's can (its loss ignores that
//     position), here it would be a query without its answer, a contradiction the model is trained
//     on. Filler is uniform over the rest of the vocabulary, values included;
//   - BOS first, and end-of-document and BOS are ids after the task's: vocab_size = V + 2.

struct MqarShape {
  int64_t vocab = 0;  // task ids [0, vocab): keys [0, vocab/2), values [vocab/2, vocab)
  int64_t eod = 0, bos = 0;
  std::vector<double> slot_weight;  // slot g (0-based) ~ (g+1)^(a-1)
};

void MqarSequence(const SynthOptions& o, const MqarShape& shape, Rng& rng,
                  std::vector<int32_t>* seq) {
  const int64_t half = shape.vocab / 2;
  // Distinct draws in draw order (a random order): rejection, cheap since pairs <= half.
  const auto distinct = [&](int64_t lo, int64_t n, std::vector<int32_t>* out) {
    out->clear();
    std::unordered_set<int32_t> used;
    while (static_cast<int>(out->size()) < o.pairs) {
      const auto id =
          static_cast<int32_t>(lo + static_cast<int64_t>(rng.Below(static_cast<uint64_t>(n))));
      if (used.insert(id).second) out->push_back(id);
    }
  };
  std::vector<int32_t> keys, values;
  distinct(0, half, &keys);
  distinct(half, shape.vocab - half, &values);
  seq->assign(1, static_cast<int32_t>(shape.bos));
  for (int i = 0; i < o.pairs; ++i) {
    seq->push_back(keys[static_cast<size_t>(i)]);
    seq->push_back(values[static_cast<size_t>(i)]);
  }
  // Which pairs are queried: a random subset (Fisher-Yates prefix).
  std::vector<int> order(static_cast<size_t>(o.pairs));
  for (int i = 0; i < o.pairs; ++i) order[static_cast<size_t>(i)] = i;
  for (int i = 0; i < o.queries; ++i) {
    const int j = i + static_cast<int>(rng.Below(static_cast<uint64_t>(o.pairs - i)));
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  // Where: distinct slots by the power law, drawn one after another without replacement.
  const int region = o.seq_len - 2 * o.pairs;
  std::vector<int32_t> query_region(static_cast<size_t>(region), -1);
  std::vector<double> weight = shape.slot_weight;
  for (int q = 0; q < o.queries; ++q) {
    double total = 0;
    for (double w : weight) total += w;
    double r = rng.Uniform() * total;
    size_t slot = 0;
    for (; slot + 1 < weight.size(); ++slot) {
      if (weight[slot] > 0 && r < weight[slot]) break;
      r -= weight[slot];
    }
    while (weight[slot] == 0) --slot;  // rounding ran past the last free slot
    weight[slot] = 0;
    const int pair = order[static_cast<size_t>(q)];
    query_region[2 * slot] = keys[static_cast<size_t>(pair)];
    query_region[2 * slot + 1] = values[static_cast<size_t>(pair)];
  }
  const std::unordered_set<int32_t> key_set(keys.begin(), keys.end());
  for (int32_t& t : query_region) {
    while (t < 0) {
      const auto id = static_cast<int32_t>(rng.Below(static_cast<uint64_t>(shape.vocab)));
      if (!key_set.count(id)) t = id;
    }
  }
  seq->insert(seq->end(), query_region.begin(), query_region.end());
}

// ---- passkey -----------------------------------------------------------------------------------
//
// Mohtashami & Jaggi 2023, "Landmark Attention" (arXiv 2305.16300), the pass key retrieval test
// (epfml/landmark-attention, llama/run_test.py `generate_prompt`): filler, then at a depth drawn
// uniformly over the filler the line "The pass key is K. Remember it. K is the pass key.", more
// filler, and "What is the pass key? The pass key is", lines joined by "\n"; K is random.
// Here, as a training and evaluation mix:
//   - the filler is the corpus's own text (consecutive tokens from a random offset) instead of the
//     paper's repeated "The grass is green. The sky is blue. ..." (a model trained on that learns
//     to skip one sentence, not to retrieve across text);
//   - a --fraction of the documents carry a key; the others are filler only, of the same length;
//   - the document ends with the answer: "What is the pass key? The pass key is K.";
//   - K has exactly --key-digits digits, uniform (the paper: an integer in [1, 50000]);
//   - the paper's opening instruction ("There is an important info hidden inside ...") is left
//     out: it is a prompt for a model that was never trained on the task.
// The sentences are tokenized with the corpus's tokenizer: bytes, or its SentencePiece model.

uint64_t PowerOfTen(int n) {
  uint64_t p = 1;
  while (n-- > 0) p *= 10;
  return p;
}

std::string KeySentence(uint64_t key) {
  return fmt::format("\nThe pass key is {0}. Remember it. {0} is the pass key.\n", key);
}
std::string QuestionAndAnswer(uint64_t key) {
  return fmt::format("\nWhat is the pass key? The pass key is {}.", key);
}

using Encoder = std::function<absl::StatusOr<std::vector<int32_t>>(const std::string&)>;

absl::StatusOr<Encoder> CorpusEncoder(const Corpus& corpus) {
  if (!corpus.prepared || corpus.source.tokenizer == "bytes") {
    // Bytes are their ids (ablate data prepare --tokenizer bytes).
    return Encoder([](const std::string& text) -> absl::StatusOr<std::vector<int32_t>> {
      std::vector<int32_t> ids;
      for (unsigned char c : text) ids.push_back(c);
      return ids;
    });
  }
  if (corpus.source.tokenizer_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--from ", corpus.from, ": tokenizer \"", corpus.source.tokenizer,
                     "\" has no tokenizer file to encode the pass key sentences"));
  }
  const std::string model = (fs::path(corpus.from) / corpus.source.tokenizer_file).string();
  std::ifstream in(model, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(model, ": cannot open the corpus's tokenizer"));
  const std::string serialized((std::istreambuf_iterator<char>(in)),
                               std::istreambuf_iterator<char>());
  std::string error;
  std::shared_ptr<SentencePieceTokenizer> sp = SentencePieceTokenizer::Load(serialized, &error);
  if (sp == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(model, ": not a SentencePiece model: ", error));
  }
  return Encoder([sp, model](const std::string& text) -> absl::StatusOr<std::vector<int32_t>> {
    std::vector<int> ids;
    std::string error;
    if (!sp->Encode(text, &ids, &error)) {
      return absl::InternalError(absl::StrCat(model, ": cannot encode \"", text, "\": ", error));
    }
    return std::vector<int32_t>(ids.begin(), ids.end());
  });
}

struct PasskeyCounts {
  int64_t carrying = 0;
};

absl::Status PasskeySequence(const SynthOptions& o, const Corpus& corpus, const Encoder& encode,
                             TokenReader& reader, Rng& rng, std::vector<int32_t>* seq,
                             PasskeyCounts* counts) {
  seq->assign(1, static_cast<int32_t>(corpus.bos));
  std::vector<int32_t> filler;
  if (!rng.Bernoulli(o.fraction)) {
    absl::Status s = DrawFiller(corpus, reader, rng, o.seq_len, &filler);
    if (!s.ok()) return s;
    seq->insert(seq->end(), filler.begin(), filler.end());
    return absl::OkStatus();
  }
  const auto lo = static_cast<int64_t>(PowerOfTen(o.key_digits - 1));
  const uint64_t key = static_cast<uint64_t>(rng.Between(lo, lo * 10 - 1));
  absl::StatusOr<std::vector<int32_t>> sentence = encode(KeySentence(key));
  if (!sentence.ok()) return sentence.status();
  absl::StatusOr<std::vector<int32_t>> answer = encode(QuestionAndAnswer(key));
  if (!answer.ok()) return answer.status();
  const int64_t n_filler = o.seq_len - static_cast<int64_t>(sentence->size() + answer->size());
  if (n_filler < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--seq-len ", o.seq_len, " is too short for the pass key sentences (",
                     sentence->size() + answer->size(), " tokens with key ", key, ")"));
  }
  absl::Status s = DrawFiller(corpus, reader, rng, n_filler, &filler);
  if (!s.ok()) return s;
  const int64_t depth = rng.Between(0, n_filler);  // the paper's randint(0, n_garbage)
  seq->insert(seq->end(), filler.begin(), filler.begin() + depth);
  seq->insert(seq->end(), sentence->begin(), sentence->end());
  seq->insert(seq->end(), filler.begin() + depth, filler.end());
  seq->insert(seq->end(), answer->begin(), answer->end());
  ++counts->carrying;
  return absl::OkStatus();
}

// ---- Driver ------------------------------------------------------------------------------------

absl::Status InvalidFlag(const std::string& message) { return absl::InvalidArgumentError(message); }

// Checks what needs no file, so that bad flags fail before a corpus is read.
absl::Status CheckOptions(const SynthOptions& o) {
  if (o.kind != kBigramBackcopy && o.kind != kMqar && o.kind != kPasskey) {
    return InvalidFlag(absl::StrCat("unknown task \"", o.kind, "\": the tasks are ",
                                    kBigramBackcopy, ", ", kMqar, " and ", kPasskey));
  }
  if (o.out.empty()) return InvalidFlag("--out is required: the prepared directory to write");
  if (o.tokens <= 0) return InvalidFlag(absl::StrCat("--tokens ", o.tokens, " must be positive"));
  if (o.seq_len < 2)
    return InvalidFlag(absl::StrCat("--seq-len ", o.seq_len, " must be at least 2"));
  if (!(o.val_fraction > 0 && o.val_fraction < 1)) {
    return InvalidFlag(
        absl::StrCat("--val-fraction ", o.val_fraction,
                     " must be in (0, 1): both train.bin and val.bin get sequences"));
  }
  const bool needs_from = o.kind != kMqar;
  if (needs_from && o.from.empty()) {
    return InvalidFlag(absl::StrCat(
        o.kind, " draws on a corpus: --from names a prepared directory or a raw text file"));
  }
  if (!needs_from && !o.from.empty()) {
    return InvalidFlag(
        absl::StrCat("mqar draws no text: --from ", o.from, " is not used; leave it out"));
  }
  if (o.kind == kBigramBackcopy && o.triggers < 0) {
    return InvalidFlag(absl::StrCat("--triggers ", o.triggers, " must be 0 or more"));
  }
  if (o.kind == kMqar) {
    if (o.pairs < 1) return InvalidFlag(absl::StrCat("--pairs ", o.pairs, " must be at least 1"));
    if (o.queries < 1 || o.queries > o.pairs) {
      return InvalidFlag(absl::StrCat("--queries ", o.queries, " must be in [1, --pairs ", o.pairs,
                                      "]: each key is queried at most once, as in Zoology"));
    }
    if (2 * static_cast<int64_t>(o.pairs) + 2 * static_cast<int64_t>(o.queries) > o.seq_len) {
      return InvalidFlag(
          absl::StrCat("--seq-len ", o.seq_len, " is too short for --pairs ", o.pairs,
                       " and --queries ", o.queries, ": they take 2 * (pairs + queries) = ",
                       2 * (static_cast<int64_t>(o.pairs) + o.queries), " tokens after BOS"));
    }
    if (o.vocab != 0 && o.vocab < 2 * static_cast<int64_t>(o.pairs)) {
      return InvalidFlag(absl::StrCat("--vocab ", o.vocab, " is too small for --pairs ", o.pairs,
                                      ": each half (keys, values) needs ", o.pairs,
                                      " distinct ids, so at least ",
                                      2 * static_cast<int64_t>(o.pairs)));
    }
    if (o.vocab < 0 || o.vocab > (int64_t{1} << 31) - 2) {
      return InvalidFlag(absl::StrCat("--vocab ", o.vocab, " is outside [0, 2^31 - 2)"));
    }
    if (!(o.power_a > 0))
      return InvalidFlag(absl::StrCat("--power-a ", o.power_a, " must be positive"));
  }
  if (o.kind == kPasskey) {
    if (o.key_digits < 1 || o.key_digits > 18) {
      return InvalidFlag(absl::StrCat("--key-digits ", o.key_digits, " must be in [1, 18]"));
    }
    if (!(o.fraction >= 0 && o.fraction <= 1)) {
      return InvalidFlag(absl::StrCat("--fraction ", o.fraction, " must be in [0, 1]"));
    }
  }
  return absl::OkStatus();
}

// The vocabulary and tokenizer the output shares with its corpus (bigram-backcopy, passkey).
void DescribeCorpusVocabulary(const Corpus& c, DataManifest* m) {
  if (c.prepared) {
    m->tokenizer = c.source.tokenizer;
    m->tokenizer_file = c.source.tokenizer_file;
    m->tokenizer_sha256 = c.source.tokenizer_sha256;
    m->unk_token = c.source.unk_token;
  } else {
    m->tokenizer = "bytes";
  }
  m->bos_token = c.bos;
  m->inputs = {c.input};
}

}  // namespace

absl::Status Synthesize(const SynthOptions& o) {
  absl::Status s = CheckOptions(o);
  if (!s.ok()) return s;
  // About tokens / (seq_len + 2) sequences (each is seq_len + 1 tokens and its end-of-document),
  // at least one per split.
  const int64_t sequences = std::max<int64_t>(2, o.tokens / (o.seq_len + 2));
  const int64_t n_val = std::clamp<int64_t>(
      std::llround(static_cast<double>(sequences) * o.val_fraction), 1, sequences - 1);
  const int64_t n_train = sequences - n_val;

  DataManifest manifest;
  manifest.kind = "synthetic";
  json params = {{"task", o.kind},
                 {"seed", o.seed},
                 {"tokens", o.tokens},
                 {"seq_len", o.seq_len},
                 {"val_fraction", o.val_fraction},
                 {"sequences", {{"train", n_train}, {"val", n_val}}}};

  // Each task becomes: a vocabulary, and a generator of one sequence from a stream.
  int64_t vocab_size = 0, eod = 0;
  std::function<absl::Status(Rng&, std::vector<int32_t>*)> generate;
  std::optional<Corpus> corpus;
  std::unique_ptr<TokenReader> reader;  // passkey's filler
  BigramModel bigrams;
  MqarShape mqar;
  Encoder encode;
  PasskeyCounts passkey_counts[2];
  int split_index = 0;  // which of passkey_counts the generator adds to

  if (o.kind != kMqar) {
    absl::StatusOr<Corpus> c = OpenCorpus(o.from);
    if (!c.ok()) return c.status();
    corpus = std::move(*c);
    vocab_size = corpus->vocab_size;
    eod = corpus->eod;
    DescribeCorpusVocabulary(*corpus, &manifest);
    if (corpus->prepared) params["from_checksum"] = corpus->source.checksum;
  }
  if (o.kind == kBigramBackcopy) {
    absl::StatusOr<BigramModel> m = EstimateBigrams(*corpus, o.triggers);
    if (!m.ok()) return m.status();
    bigrams = std::move(*m);
    params["triggers"] = o.triggers;
    params["trigger_tokens"] = bigrams.triggers;
    params["corpus_distinct_tokens"] = bigrams.distinct;
    generate = [&](Rng& rng, std::vector<int32_t>* seq) {
      BigramBackcopySequence(bigrams, corpus->bos, o.seq_len, rng, seq);
      return absl::OkStatus();
    };
  } else if (o.kind == kMqar) {
    mqar.vocab = o.vocab != 0
                     ? o.vocab
                     : std::max<int64_t>(kMqarDefaultVocab, 2 * static_cast<int64_t>(o.pairs));
    mqar.eod = mqar.vocab;
    mqar.bos = mqar.vocab + 1;
    const int slots = (o.seq_len - 2 * o.pairs) / 2;
    for (int g = 1; g <= slots; ++g)
      mqar.slot_weight.push_back(std::pow(static_cast<double>(g), o.power_a - 1));
    vocab_size = mqar.vocab + 2;
    eod = mqar.eod;
    manifest.tokenizer = kNoTokenizer;
    manifest.bos_token = mqar.bos;
    params["pairs"] = o.pairs;
    params["queries"] = o.queries;
    params["vocab"] = mqar.vocab;
    params["power_a"] = o.power_a;
    params["keys"] = {0, mqar.vocab / 2};  // [lo, hi)
    params["values"] = {mqar.vocab / 2, mqar.vocab};
    generate = [&](Rng& rng, std::vector<int32_t>* seq) {
      MqarSequence(o, mqar, rng, seq);
      return absl::OkStatus();
    };
  } else {  // passkey
    absl::StatusOr<Encoder> e = CorpusEncoder(*corpus);
    if (!e.ok()) return e.status();
    encode = std::move(*e);
    // The longest key's sentences must fit (a SentencePiece key of other digits may take fewer).
    const uint64_t widest = PowerOfTen(o.key_digits) - 1;
    absl::StatusOr<std::vector<int32_t>> ids =
        encode(KeySentence(widest) + QuestionAndAnswer(widest));
    if (!ids.ok()) return ids.status();
    if (static_cast<int64_t>(ids->size()) > o.seq_len) {
      return InvalidFlag(
          absl::StrCat("--seq-len ", o.seq_len, " is too short for the pass key sentences: with ",
                       o.key_digits, "-digit keys they take ", ids->size(), " tokens"));
    }
    reader = std::make_unique<TokenReader>(*corpus);
    params["key_digits"] = o.key_digits;
    params["fraction"] = o.fraction;
    params["key_sentence"] = "The pass key is {key}. Remember it. {key} is the pass key.";
    params["question"] = "What is the pass key? The pass key is {key}.";
    generate = [&](Rng& rng, std::vector<int32_t>* seq) {
      return PasskeySequence(o, *corpus, encode, *reader, rng, seq, &passkey_counts[split_index]);
    };
  }

  absl::StatusOr<std::unique_ptr<PreparedWriter>> writer =
      PreparedWriter::Open(o.out, vocab_size, TokenBytesFor(vocab_size), eod, o.force);
  if (!writer.ok()) return writer.status();
  if (corpus && corpus->prepared && !corpus->source.tokenizer_file.empty()) {
    // The tokens are the corpus's: its tokenizer decodes them, so it goes beside them.
    std::error_code ec;
    const fs::path to = fs::path((*writer)->partial_dir()) / corpus->source.tokenizer_file;
    fs::copy_file(fs::path(corpus->from) / corpus->source.tokenizer_file, to, ec);
    if (ec)
      return absl::InternalError(
          absl::StrCat(to.string(), ": cannot copy the tokenizer: ", ec.message()));
  }
  std::vector<int32_t> seq;
  for (const auto& [split, count, stream] :
       {std::tuple{PreparedWriter::Split::kTrain, n_train, uint64_t{1}},
        std::tuple{PreparedWriter::Split::kVal, n_val, uint64_t{2}}}) {
    Rng rng(o.seed, stream);  // val from its own stream: not a copy of train
    split_index = split == PreparedWriter::Split::kTrain ? 0 : 1;
    for (int64_t i = 0; i < count; ++i) {
      s = generate(rng, &seq);
      if (!s.ok()) return s;
      s = (*writer)->AddDocument(split, seq);
      if (!s.ok()) return s;
    }
  }
  if (o.kind == kPasskey) {
    params["documents_with_key"] = {{"train", passkey_counts[0].carrying},
                                    {"val", passkey_counts[1].carrying}};
  }
  manifest.params = std::move(params);
  s = (*writer)->Commit(&manifest);
  if (!s.ok()) return s;
  if (!o.quiet) {
    std::cerr << fmt::format(
        "{}: {} sequences of {} tokens ({} train, {} val), {} tokens, vocabulary {}\n", o.out,
        sequences, o.seq_len + 1, n_train, n_val, manifest.train.tokens + manifest.val.tokens,
        vocab_size);
  }
  return absl::OkStatus();
}

void AddSynthCommand(CLI::App* app) {
  auto o = std::make_shared<SynthOptions>();
  CLI::App* cmd = app->add_subcommand(
      "synth",
      "Write a synthetic task as prepared data: bigram-backcopy, mqar or passkey (docs/data.md)");
  cmd->add_option("kind", o->kind, "bigram-backcopy | mqar | passkey")->required();
  cmd->add_option("--out", o->out, "The prepared directory to write (atomically)")->required();
  cmd->add_option("--tokens", o->tokens, "Total tokens, about: tokens / (seq-len + 2) sequences")
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed: the same seed writes the same files")
      ->capture_default_str();
  cmd->add_option(
      "--from", o->from,
      "Corpus (bigram-backcopy, passkey): a prepared directory, or a raw text file read as bytes");
  cmd->add_option("--seq-len", o->seq_len, "Tokens after BOS in every sequence")
      ->capture_default_str();
  cmd->add_option("--val-fraction", o->val_fraction, "Fraction of the sequences written to val.bin")
      ->capture_default_str();
  cmd->add_flag("--force", o->force,
                "Replace an existing --out (once the new directory is complete)");
  cmd->add_flag("--quiet", o->quiet, "No summary line on stderr");
  // Task flags, each with the one task that reads it.
  const std::vector<std::pair<std::string, std::string>> task_flags = {
      {"--triggers", kBigramBackcopy},
      {"--pairs", kMqar},
      {"--queries", kMqar},
      {"--vocab", kMqar},
      {"--power-a", kMqar},
      {"--key-digits", kPasskey},
      {"--fraction", kPasskey}};
  cmd->add_option("--triggers", o->triggers,
                  "bigram-backcopy: the K most frequent corpus tokens are triggers")
      ->capture_default_str();
  cmd->add_option("--pairs", o->pairs, "mqar: key-value pairs per sequence")->capture_default_str();
  cmd->add_option("--queries", o->queries, "mqar: keys queried per sequence (<= pairs)")
      ->capture_default_str();
  cmd->add_option("--vocab", o->vocab,
                  "mqar: task ids, half keys and half values; 0 = 8192 (or 2 * pairs if more)")
      ->capture_default_str();
  cmd->add_option("--power-a", o->power_a, "mqar: query slot g drawn ~ g^(a-1)")
      ->capture_default_str();
  cmd->add_option("--key-digits", o->key_digits, "passkey: digits of the pass key")
      ->capture_default_str();
  cmd->add_option("--fraction", o->fraction, "passkey: fraction of documents that carry a key")
      ->capture_default_str();
  cmd->callback([cmd, o, task_flags] {
    for (const auto& [flag, task] : task_flags) {
      if (cmd->count(flag) > 0 && o->kind != task) {
        std::cerr << "ablate data synth: " << flag << " is a flag of " << task << ", not of "
                  << o->kind << "\n";
        throw CLI::RuntimeError(1);
      }
    }
    const absl::Status s = Synthesize(*o);
    if (!s.ok()) {
      std::cerr << "ablate data synth: " << s.message() << "\n";
      throw CLI::RuntimeError(1);
    }
  });
}

}  // namespace ablate
