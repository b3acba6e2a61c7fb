// `ablate-data synth`: each task checked against the properties its defining paper states, read
// back from the written files (train.bin, val.bin, manifest.json), plus determinism and bad input.
#include "orchestrator/data/synth.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/token_files.h"
#include "gtest/gtest.h"
#include "orchestrator/data/prepared_writer.h"
#include "orchestrator/data/sentencepiece_tokenizer.h"

namespace ablate {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kEod = 256, kBos = 257;  // the byte-level ids of a raw text --from

// Text without digits (so a pass key is the only number in a document), varied enough for a
// bigram table with many rows.
std::string CorpusText() {
  const std::string paragraph =
      "In the beginning the small model read every line twice, and the attention heads learned "
      "where to look. Some heads rested on the first token when there was nothing to do; others "
      "copied what came before a trigger. The grass is green, the sky is blue, and the sun is "
      "yellow over quiet fields where the wind moves slowly.\n";
  std::string text;
  for (int i = 0; i < 12; ++i) text += paragraph;
  return text;
}

std::vector<int64_t> ReadTokens(const fs::path& file, int width) {
  std::ifstream in(file, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<int64_t> tokens;
  for (size_t i = 0; i + width <= bytes.size(); i += width) {
    uint64_t v = 0;
    for (int b = 0; b < width; ++b)
      v |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i + b])) << (8 * b);
    tokens.push_back(static_cast<int64_t>(v));
  }
  return tokens;
}

// The documents of a split file, end-of-document tokens removed.
std::vector<std::vector<int64_t>> ReadDocs(const fs::path& file, int width, int64_t eod) {
  std::vector<std::vector<int64_t>> docs(1);
  for (int64_t t : ReadTokens(file, width)) {
    if (t == eod) {
      docs.emplace_back();
    } else {
      docs.back().push_back(t);
    }
  }
  EXPECT_TRUE(docs.back().empty()) << file << " does not end with end-of-document";
  docs.pop_back();
  return docs;
}

std::string ReadFile(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

class SynthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) /
           (std::string("synth_test_") + info->name() + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    corpus_ = (dir_ / "corpus.txt").string();
    std::ofstream(corpus_) << CorpusText();
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A small task of each kind, from the text corpus where it reads one.
  SynthOptions Options(const std::string& kind, const std::string& out_name) const {
    SynthOptions o;
    o.kind = kind;
    o.out = (dir_ / out_name).string();
    o.seq_len = 64;
    o.tokens = 200 * (o.seq_len + 2);
    o.val_fraction = 0.1;
    o.quiet = true;
    if (kind != "mqar") o.from = corpus_;
    if (kind == "mqar") {
      o.pairs = 8;
      o.queries = 6;
      o.vocab = 128;
    }
    if (kind == "passkey") o.seq_len = 160;
    return o;
  }

  // Writes a prepared directory of byte-level documents (bos = -1 when `with_bos` is false).
  std::string Prepared(const std::string& name, const std::vector<std::string>& documents,
                       bool with_bos) {
    const std::string out = (dir_ / name).string();
    auto writer = PreparedWriter::Open(out, 258, 2, kEod, false);
    EXPECT_TRUE(writer.ok()) << writer.status();
    for (size_t i = 0; i < documents.size(); ++i) {
      std::vector<int32_t> ids(documents[i].begin(), documents[i].end());
      const auto split =
          i + 1 == documents.size() ? PreparedWriter::Split::kVal : PreparedWriter::Split::kTrain;
      EXPECT_TRUE((*writer)->AddDocument(split, ids).ok());
    }
    DataManifest m;
    m.tokenizer = "bytes";
    m.bos_token = with_bos ? kBos : -1;
    EXPECT_TRUE((*writer)->Commit(&m).ok());
    return out;
  }

  // No OUT, and nothing else named after it (the writer's hidden partial directory).
  void ExpectNoOutput(const std::string& out) const {
    EXPECT_FALSE(fs::exists(out)) << out;
    const std::string name = fs::path(out).filename().string();
    for (const auto& entry : fs::directory_iterator(fs::path(out).parent_path())) {
      EXPECT_EQ(entry.path().filename().string().find(name), std::string::npos)
          << "left behind: " << entry.path();
    }
  }

  fs::path dir_;
  std::string corpus_;
};

// Bigrams (a, b) of the corpus text, and the tokens it ever follows by something.
struct CorpusBigrams {
  std::set<std::pair<int64_t, int64_t>> pairs;
  std::set<int64_t> followed;
  std::map<int64_t, int64_t> unigram;
};
CorpusBigrams BigramsOf(const std::vector<std::string>& documents) {
  CorpusBigrams b;
  for (const std::string& doc : documents) {
    for (size_t i = 0; i < doc.size(); ++i) {
      const auto t = static_cast<unsigned char>(doc[i]);
      ++b.unigram[t];
      if (i + 1 < doc.size()) {
        b.pairs.insert({t, static_cast<unsigned char>(doc[i + 1])});
        b.followed.insert(t);
      }
    }
  }
  return b;
}

TEST_F(SynthTest, BigramBackcopyCopiesAfterTriggersAndOtherwiseWalksCorpusBigrams) {
  SynthOptions o = Options("bigram-backcopy", "bb");
  ASSERT_TRUE(Synthesize(o).ok());
  absl::StatusOr<DataManifest> m = ReadManifest(o.out);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->kind, "synthetic");
  EXPECT_EQ(m->tokenizer, "bytes");
  EXPECT_EQ(m->vocab_size, 258);
  EXPECT_EQ(m->eod_token, kEod);
  EXPECT_EQ(m->bos_token, kBos);

  // The triggers are the paper's: the K most frequent tokens of the corpus.
  const CorpusBigrams corpus = BigramsOf({CorpusText()});
  std::vector<std::pair<int64_t, int64_t>> by_count;  // (-count, id)
  for (const auto& [id, count] : corpus.unigram) by_count.push_back({-count, id});
  std::sort(by_count.begin(), by_count.end());
  std::set<int64_t> triggers;
  for (int i = 0; i < o.triggers; ++i) triggers.insert(by_count[static_cast<size_t>(i)].second);
  std::vector<int64_t> recorded = m->params.at("trigger_tokens").get<std::vector<int64_t>>();
  EXPECT_EQ(std::set<int64_t>(recorded.begin(), recorded.end()), triggers);

  int64_t copies = 0, draws = 0;
  for (const char* split : {"train.bin", "val.bin"}) {
    const auto docs = ReadDocs(fs::path(o.out) / split, 2, kEod);
    ASSERT_FALSE(docs.empty());
    for (const auto& doc : docs) {
      ASSERT_EQ(doc.size(), static_cast<size_t>(o.seq_len + 1));
      EXPECT_EQ(doc[0], kBos);
      EXPECT_EQ(triggers.count(doc[1]), 0u) << "the token after BOS is never a trigger";
      EXPECT_TRUE(corpus.unigram.count(doc[1]));
      for (size_t i = 2; i < doc.size(); ++i) {
        ASSERT_NE(doc[i], kBos);
        if (triggers.count(doc[i - 1])) {
          // The paper's backcopy: after a trigger, the token before the trigger.
          ASSERT_EQ(doc[i], doc[i - 2]) << "position " << i;
          ASSERT_EQ(triggers.count(doc[i - 2]), 0u) << "a copied token is never a trigger";
          ++copies;
        } else {
          // Otherwise a bigram seen in the corpus (or the unigram fallback of a token never
          // followed).
          ASSERT_TRUE(corpus.pairs.count({doc[i - 1], doc[i]}) ||
                      !corpus.followed.count(doc[i - 1]))
              << doc[i - 1] << " -> " << doc[i] << " at position " << i;
          ++draws;
        }
      }
    }
  }
  EXPECT_GT(copies, 100);
  EXPECT_GT(draws, 1000);
}

TEST_F(SynthTest, BigramBackcopyFromAPreparedDirectoryKeepsBigramsInsideDocuments) {
  // Each document alone is a two-cycle; only a bigram across the boundary would join them.
  const std::string from = Prepared("corpus", {"abababababab", "cdcdcdcdcdcd", "efef"}, true);
  SynthOptions o = Options("bigram-backcopy", "bb");
  o.from = from;
  o.triggers = 0;
  ASSERT_TRUE(Synthesize(o).ok());
  absl::StatusOr<DataManifest> m = ReadManifest(o.out);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->bos_token, kBos);
  ASSERT_EQ(m->inputs.size(), 1u);
  EXPECT_EQ(m->inputs[0].path, from);
  EXPECT_EQ(m->params.at("from_checksum").get<std::string>(), ReadManifest(from)->checksum);
  std::set<int64_t> starts;
  for (const auto& doc : ReadDocs(fs::path(o.out) / "train.bin", 2, kEod)) {
    starts.insert(doc[1]);
    for (size_t i = 2; i < doc.size(); ++i) {
      const bool same_cycle = (doc[i - 1] - 'a') / 2 == (doc[i] - 'a') / 2 && doc[i - 1] != doc[i];
      ASSERT_TRUE(same_cycle) << static_cast<char>(doc[i - 1]) << static_cast<char>(doc[i]);
    }
  }
  // Only the train split is read: 'e' and 'f' (the val document) never appear.
  EXPECT_EQ(starts.count('e') + starts.count('f'), 0u);
}

TEST_F(SynthTest, MqarFollowsEveryQueryWithItsValue) {
  SynthOptions o = Options("mqar", "mqar");
  ASSERT_TRUE(Synthesize(o).ok());
  absl::StatusOr<DataManifest> m = ReadManifest(o.out);
  ASSERT_TRUE(m.ok()) << m.status();
  const int64_t v = o.vocab;
  EXPECT_EQ(m->vocab_size, v + 2);
  EXPECT_EQ(m->eod_token, v);
  EXPECT_EQ(m->bos_token, v + 1);
  int64_t first_slot_sum = 0, queries = 0;
  for (const char* split : {"train.bin", "val.bin"}) {
    const auto docs = ReadDocs(fs::path(o.out) / split, 2, v);
    ASSERT_FALSE(docs.empty());
    for (const auto& doc : docs) {
      ASSERT_EQ(doc.size(), static_cast<size_t>(o.seq_len + 1));
      EXPECT_EQ(doc[0], v + 1);
      std::map<int64_t, int64_t> value_of;
      std::set<int64_t> values;
      for (int i = 0; i < o.pairs; ++i) {
        const int64_t key = doc[1 + 2 * i], value = doc[2 + 2 * i];
        EXPECT_GE(key, 0);
        EXPECT_LT(key, v / 2) << "keys come from the first half";
        EXPECT_GE(value, v / 2) << "values from the second";
        EXPECT_LT(value, v);
        EXPECT_TRUE(value_of.emplace(key, value).second) << "keys are distinct";
        EXPECT_TRUE(values.insert(value).second) << "values are distinct";
      }
      int64_t found = 0;
      for (size_t i = 1 + 2 * o.pairs; i < doc.size(); ++i) {
        ASSERT_LT(doc[i], v);
        const auto it = value_of.find(doc[i]);
        if (it == value_of.end()) continue;
        ASSERT_LT(i + 1, doc.size());
        ASSERT_EQ(doc[i + 1], it->second) << "query of key " << doc[i] << " at " << i;
        if (found == 0) first_slot_sum += static_cast<int64_t>(i - (1 + 2 * o.pairs)) / 2;
        ++found;
        ++i;  // the value is not a query
      }
      EXPECT_EQ(found, o.queries) << "every query once, and no other occurrence of a key";
      queries += found;
    }
  }
  // The power law puts queries near the pairs: the nearest query's mean slot is far below the
  // middle of the (seq_len - 2 pairs) / 2 = 24 slots.
  const double docs = static_cast<double>(queries) / o.queries;
  EXPECT_LT(first_slot_sum / docs, 6.0);
  EXPECT_EQ(m->params.at("pairs"), o.pairs);
  EXPECT_EQ(m->params.at("queries"), o.queries);
  EXPECT_EQ(m->params.at("vocab"), o.vocab);
}

TEST_F(SynthTest, PasskeyDocumentsRepeatTheirKeyAndTheFractionIsBinomial) {
  SynthOptions o = Options("passkey", "passkey");
  o.tokens = 600 * (o.seq_len + 2);
  o.fraction = 0.3;
  ASSERT_TRUE(Synthesize(o).ok());
  absl::StatusOr<DataManifest> m = ReadManifest(o.out);
  ASSERT_TRUE(m.ok()) << m.status();
  int64_t carrying = 0, total = 0;
  for (const char* split : {"train.bin", "val.bin"}) {
    for (const auto& doc : ReadDocs(fs::path(o.out) / split, 2, kEod)) {
      ASSERT_EQ(doc.size(), static_cast<size_t>(o.seq_len + 1));
      ASSERT_EQ(doc[0], kBos);
      std::string text;
      for (size_t i = 1; i < doc.size(); ++i) {
        ASSERT_LT(doc[i], 256);
        text += static_cast<char>(doc[i]);
      }
      ++total;
      const size_t at = text.find("The pass key is ");
      if (at == std::string::npos) {
        EXPECT_EQ(text.find_first_of("0123456789"), std::string::npos) << "filler only: " << text;
        continue;
      }
      ++carrying;
      const std::string key = text.substr(at + 16, o.key_digits);
      ASSERT_EQ(key.find_first_not_of("0123456789"), std::string::npos) << text;
      EXPECT_NE(key[0], '0');
      const std::string sentence =
          "The pass key is " + key + ". Remember it. " + key + " is the pass key.";
      const std::string answer = "What is the pass key? The pass key is " + key + ".";
      EXPECT_EQ(text.find(sentence), at) << text;
      EXPECT_EQ(text.find(sentence, at + 1), std::string::npos);
      ASSERT_GE(text.size(), answer.size());
      EXPECT_EQ(text.substr(text.size() - answer.size()), answer)
          << "the document ends with the answer";
      // The key stands in the sentence and in the answer, and nowhere else.
      size_t n = 0;
      for (size_t p = text.find(key); p != std::string::npos; p = text.find(key, p + 1)) ++n;
      EXPECT_EQ(n, 3u) << text;
    }
  }
  // Within 4.5 standard deviations of the binomial count.
  const double sd = std::sqrt(total * o.fraction * (1 - o.fraction));
  EXPECT_NEAR(static_cast<double>(carrying), total * o.fraction, 4.5 * sd);
  const auto& with_key = m->params.at("documents_with_key");
  EXPECT_EQ(with_key.at("train").get<int64_t>() + with_key.at("val").get<int64_t>(), carrying);
  EXPECT_EQ(m->params.at("key_digits"), o.key_digits);
  EXPECT_EQ(m->params.at("fraction"), o.fraction);
}

// A corpus shorter than a document is repeated as filler; one of only special tokens is refused.
TEST_F(SynthTest, PasskeyFillerWrapsAroundASmallCorpus) {
  std::ofstream((dir_ / "short.txt").string()) << "A short text. ";
  SynthOptions o = Options("passkey", "passkey");
  o.from = (dir_ / "short.txt").string();
  o.fraction = 0;
  ASSERT_TRUE(Synthesize(o).ok());
  for (const auto& doc : ReadDocs(fs::path(o.out) / "train.bin", 2, kEod)) {
    std::string text(doc.begin() + 1, doc.end());
    const size_t at = text.find("A short text. ");
    ASSERT_NE(at, std::string::npos);
    EXPECT_NE(text.find("A short text. A short text. "), std::string::npos) << text;
  }
  const std::string only_special = Prepared("only_special", {"", ""}, true);
  o.from = only_special;
  o.out = (dir_ / "refused").string();
  const absl::Status s = Synthesize(o);
  EXPECT_NE(s.message().find("only end-of-document and BOS tokens"), std::string::npos) << s;
  ExpectNoOutput(o.out);
}

// Over a SentencePiece corpus (as `ablate data prepare --tokenizer bpe` writes one), the sentences
// are encoded with its model, and the model goes beside the tokens.
TEST_F(SynthTest, PasskeyOverASentencePieceCorpusUsesItsModel) {
  std::string error;
  const std::vector<std::string> lines(12, CorpusText().substr(0, CorpusText().find('\n')));
  const std::string model = TrainSentencePiece({{"model_type", "bpe"},
                                                {"vocab_size", "320"},
                                                {"hard_vocab_limit", "false"},
                                                {"byte_fallback", "true"},
                                                {"normalization_rule_name", "identity"},
                                                {"remove_extra_whitespaces", "false"},
                                                {"add_dummy_prefix", "false"},
                                                {"num_threads", "1"}},
                                               lines, 1, &error);
  ASSERT_FALSE(model.empty()) << error;
  std::unique_ptr<SentencePieceTokenizer> spm = SentencePieceTokenizer::Load(model, &error);
  ASSERT_NE(spm, nullptr) << error;
  const std::string from = (dir_ / "spm").string();
  {
    auto writer = PreparedWriter::Open(from, spm->vocab_size(), 2, spm->eos_id(), false);
    ASSERT_TRUE(writer.ok()) << writer.status();
    std::ofstream((fs::path((*writer)->partial_dir()) / "tokenizer.model").string(),
                  std::ios::binary)
        << model;
    for (const auto split : {PreparedWriter::Split::kTrain, PreparedWriter::Split::kVal}) {
      std::vector<int> ids;
      ASSERT_TRUE(spm->Encode(CorpusText(), &ids, &error)) << error;
      ASSERT_TRUE((*writer)->AddDocument(split, std::vector<int32_t>(ids.begin(), ids.end())).ok());
    }
    DataManifest m;
    m.tokenizer = "bpe";
    m.tokenizer_file = "tokenizer.model";
    m.tokenizer_sha256 =
        *Sha256File((fs::path((*writer)->partial_dir()) / "tokenizer.model").string());
    m.bos_token = spm->bos_id();
    m.unk_token = spm->unk_id();
    ASSERT_TRUE((*writer)->Commit(&m).ok());
  }
  SynthOptions o = Options("passkey", "passkey");
  o.from = from;
  o.fraction = 0.5;
  ASSERT_TRUE(Synthesize(o).ok());
  absl::StatusOr<DataManifest> m = ReadManifest(o.out);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->tokenizer, "bpe");
  EXPECT_EQ(m->vocab_size, spm->vocab_size());
  EXPECT_EQ(m->bos_token, spm->bos_id());
  EXPECT_EQ(*Sha256File((fs::path(o.out) / "tokenizer.model").string()), m->tokenizer_sha256);
  int64_t carrying = 0;
  for (const auto& doc : ReadDocs(fs::path(o.out) / "train.bin", 2, spm->eos_id())) {
    ASSERT_EQ(doc.size(), static_cast<size_t>(o.seq_len + 1));
    ASSERT_EQ(doc[0], spm->bos_id());
    std::string text;
    ASSERT_TRUE(spm->Decode(std::vector<int>(doc.begin() + 1, doc.end()), &text, &error)) << error;
    const size_t at = text.find("The pass key is ");
    if (at == std::string::npos) continue;
    ++carrying;
    const std::string key = text.substr(at + 16, o.key_digits);
    EXPECT_NE(
        text.find("\nThe pass key is " + key + ". Remember it. " + key + " is the pass key.\n"),
        std::string::npos)
        << text;
    const std::string answer = "\nWhat is the pass key? The pass key is " + key + ".";
    EXPECT_EQ(text.substr(text.size() - answer.size()), answer) << text;
  }
  EXPECT_GT(carrying, 0);
}

// Every task, the same checks: the seed alone decides the files; val is not a copy of train; the
// manifest records the task and its settings.
TEST_F(SynthTest, EveryTaskIsDeterministicPerSeedAndRecordsItsParameters) {
  for (const std::string kind : {"bigram-backcopy", "mqar", "passkey"}) {
    SCOPED_TRACE(kind);
    SynthOptions a = Options(kind, kind + "_a"), b = Options(kind, kind + "_b"),
                 c = Options(kind, kind + "_c");
    c.seed = a.seed + 1;
    for (const SynthOptions* o : {&a, &b, &c}) {
      const absl::Status s = Synthesize(*o);
      ASSERT_TRUE(s.ok()) << s;
    }
    for (const char* split : {"train.bin", "val.bin"}) {
      EXPECT_EQ(ReadFile(fs::path(a.out) / split), ReadFile(fs::path(b.out) / split)) << split;
      EXPECT_NE(ReadFile(fs::path(a.out) / split), ReadFile(fs::path(c.out) / split)) << split;
    }
    absl::StatusOr<DataManifest> m = ReadManifest(a.out);
    ASSERT_TRUE(m.ok()) << m.status();
    const int64_t eod = m->eod_token;
    const auto train = ReadDocs(fs::path(a.out) / "train.bin", m->token_bytes, eod);
    const auto val = ReadDocs(fs::path(a.out) / "val.bin", m->token_bytes, eod);
    EXPECT_NE(train.front(), val.front()) << "val comes from its own stream";
    EXPECT_EQ(static_cast<int64_t>(train.size() + val.size()), a.tokens / (a.seq_len + 2));
    EXPECT_EQ(static_cast<int64_t>(val.size()),
              std::llround((train.size() + val.size()) * a.val_fraction));
    EXPECT_EQ(m->params.at("task").get<std::string>(), kind);
    EXPECT_EQ(m->params.at("seed"), a.seed);
    EXPECT_EQ(m->params.at("tokens"), a.tokens);
    EXPECT_EQ(m->params.at("seq_len"), a.seq_len);
    EXPECT_EQ(m->params.at("val_fraction"), a.val_fraction);
    if (kind == "mqar") {
      EXPECT_TRUE(m->inputs.empty());
    } else {
      ASSERT_EQ(m->inputs.size(), 1u);
      EXPECT_EQ(m->inputs[0].path, corpus_);
      EXPECT_EQ(m->inputs[0].sha256, *Sha256File(corpus_));
    }
  }
}

TEST_F(SynthTest, BadInputIsNamedAndLeavesNoOutput) {
  fs::create_directories(dir_ / "not_prepared");
  const std::string no_bos = Prepared("no_bos", {"abcabc", "abc"}, false);
  struct Case {
    std::string name;
    std::function<void(SynthOptions*)> change;
    std::string kind;
    std::string message;  // a part of the error
  };
  const std::vector<Case> cases = {
      {"unknown task", [](SynthOptions* o) { o->kind = "bigram"; }, "mqar",
       "unknown task \"bigram\""},
      {"no --from", [](SynthOptions* o) { o->from.clear(); }, "bigram-backcopy", "--from"},
      {"no --from", [](SynthOptions* o) { o->from.clear(); }, "passkey", "--from"},
      {"missing --from", [this](SynthOptions* o) { o->from = (dir_ / "nothing.txt").string(); },
       "passkey", "nothing.txt: no such file"},
      {"directory without manifest",
       [this](SynthOptions* o) { o->from = (dir_ / "not_prepared").string(); }, "bigram-backcopy",
       "not_prepared is a directory without manifest.json"},
      {"prepared without BOS", [&](SynthOptions* o) { o->from = no_bos; }, "bigram-backcopy",
       "no BOS token"},
      {"mqar seq_len too small", [](SynthOptions* o) { o->seq_len = 20; }, "mqar",
       "--seq-len 20 is too short for --pairs 8 and --queries 6"},
      {"mqar vocab too small", [](SynthOptions* o) { o->vocab = 10; }, "mqar",
       "--vocab 10 is too small"},
      {"mqar queries above pairs", [](SynthOptions* o) { o->queries = 9; }, "mqar", "--queries 9"},
      {"mqar with --from", [this](SynthOptions* o) { o->from = corpus_; }, "mqar", "--from"},
      {"passkey seq_len too small", [](SynthOptions* o) { o->seq_len = 50; }, "passkey",
       "--seq-len 50 is too short for the pass key sentences"},
      {"too many triggers", [](SynthOptions* o) { o->triggers = 1000; }, "bigram-backcopy",
       "--triggers 1000"},
      {"val fraction", [](SynthOptions* o) { o->val_fraction = 0; }, "mqar", "--val-fraction 0"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name + " (" + c.kind + ")");
    SynthOptions o = Options(c.kind, "out");
    c.change(&o);
    const absl::Status s = Synthesize(o);
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find(c.message), std::string::npos) << s;
    ExpectNoOutput(o.out);
  }
}

TEST_F(SynthTest, ExistingOutputNeedsForce) {
  SynthOptions o = Options("mqar", "mqar");
  ASSERT_TRUE(Synthesize(o).ok());
  const absl::Status again = Synthesize(o);
  EXPECT_EQ(again.code(), absl::StatusCode::kAlreadyExists) << again;
  o.force = true;
  o.seed = 99;
  ASSERT_TRUE(Synthesize(o).ok());
  absl::StatusOr<DataManifest> m = ReadManifest(o.out);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->params.at("seed"), 99);
}

TEST_F(SynthTest, CommandParsesFlagsAndRefusesAnotherTasksFlag) {
  {
    CLI::App app;
    AddSynthCommand(&app);
    const std::string out = (dir_ / "cli").string();
    app.parse("synth mqar --out " + out +
                  " --tokens 2000 --seq-len 32 --pairs 4 --queries 2 --vocab 64 --quiet",
              false);
    absl::StatusOr<DataManifest> m = ReadManifest(out);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->params.at("pairs"), 4);
    EXPECT_EQ(m->vocab_size, 66);
  }
  {
    CLI::App app;
    AddSynthCommand(&app);
    const std::string out = (dir_ / "cli_bad").string();
    EXPECT_THROW(app.parse("synth mqar --out " + out + " --triggers 2", false), CLI::RuntimeError);
    ExpectNoOutput(out);
  }
}

}  // namespace
}  // namespace ablate
