// `ablate data prepare` on small corpora written here: every tokenizer decodes back to the
// documents it was given, the validation split is whole documents chosen by the seed, every bad
// input is an error naming the file and line or offset and leaves no directory, and the prepared
// directory appears whole or not at all (PreparedWriter). Plus the reason ablate-data exists: the
// binaries are checked with ldd for SentencePiece and protobuf never sharing a process.
#include "orchestrator/data/prepare.h"

#include <errno.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/token_files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "orchestrator/data/prepared_writer.h"
#include "orchestrator/data/sentencepiece_tokenizer.h"
#include "tests/test_dir.h"

namespace ablate {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string Slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void Write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

// A split file's documents: the tokens between end-of-document tokens (each document must end
// with one).
std::vector<std::vector<int32_t>> SplitDocuments(const fs::path& file, int token_bytes,
                                                 int64_t eod) {
  const std::string bytes = Slurp(file);
  std::vector<std::vector<int32_t>> docs(1);
  for (size_t i = 0; i + token_bytes <= bytes.size(); i += token_bytes) {
    uint32_t v = 0;
    for (int b = token_bytes - 1; b >= 0; --b)
      v = v << 8 | static_cast<unsigned char>(bytes[i + b]);
    if (v == eod) {
      docs.emplace_back();
    } else {
      docs.back().push_back(static_cast<int32_t>(v));
    }
  }
  EXPECT_TRUE(docs.back().empty()) << file << " does not end with the end-of-document token";
  docs.pop_back();
  return docs;
}

std::string BytesText(const std::vector<int32_t>& ids) {
  std::string text;
  for (int32_t id : ids) {
    EXPECT_LT(id, 256);
    text.push_back(static_cast<char>(id));
  }
  return text;
}

// A generated corpus of `n` documents, each a few lines of words (ASCII, accents, CJK, tabs,
// double spaces): what a SentencePiece model must give back exactly.
std::vector<std::string> GeneratedDocuments(int n, uint64_t seed) {
  std::vector<std::string> words = {
      "the",  "gate",  "attention", "head", "sink", "token", "value", "query",   "key",  "model",
      "café", "naïve", "日本語",    "über", "loss", "42",    "3.14",  "(paper)", "end.", "a,b;c"};
  std::mt19937_64 rng(seed);
  // Enough distinct words that a unigram model finds 400 pieces worth keeping.
  const std::vector<std::string> syllables = {"ka", "lo", "mi", "ne", "ru", "ta",
                                              "so", "vi", "pe", "da", "gu", "ho"};
  for (int i = 0; i < 150; ++i) {
    std::string word;
    for (int s = 0; s < 2 + i % 3; ++s) word += syllables[(i * 7 + s * 5 + i / 12) % 12];
    words.push_back(word);
  }
  std::vector<std::string> docs;
  for (int d = 0; d < n; ++d) {
    std::string doc;
    const int lines = 1 + static_cast<int>(rng() % 4);
    for (int l = 0; l < lines; ++l) {
      if (rng() % 7 == 0) doc += "  ";  // indentation
      const int count = 3 + static_cast<int>(rng() % 10);
      for (int w = 0; w < count; ++w) {
        if (w > 0) doc += rng() % 11 == 0 ? "\t" : rng() % 13 == 0 ? "  " : " ";
        doc += words[rng() % words.size()];
      }
      if (l + 1 < lines) doc += "\n";
    }
    docs.push_back(doc);
  }
  return docs;
}

class PrepareTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::FreshTestDir("ablate_prepare"); }
  void TearDown() override { fs::remove_all(dir_); }

  PrepareOptions Options(const std::string& out = "out") {
    PrepareOptions options;
    options.out = (dir_ / out).string();
    options.progress = false;
    options.threads = 2;
    return options;
  }

  // Documents separated by blank lines in one file (--docs blank).
  fs::path WriteParagraphs(const std::vector<std::string>& docs, const std::string& name) {
    std::string text;
    for (const std::string& doc : docs) text += doc + "\n\n";
    Write(dir_ / name, text);
    return dir_ / name;
  }

  // Neither OUT nor any partial directory of it.
  void ExpectNoOutput(const std::string& out = "out") {
    EXPECT_FALSE(fs::exists(dir_ / out)) << out << " was left behind";
    for (const auto& entry : fs::directory_iterator(dir_)) {
      EXPECT_THAT(entry.path().filename().string(), ::testing::Not(HasSubstr(".partial-")))
          << "a partial directory was left behind";
    }
  }

  // Prepares and returns the error, expecting one and no output.
  std::string PrepareError(const PrepareOptions& options) {
    absl::StatusOr<DataManifest> manifest = Prepare(options);
    EXPECT_FALSE(manifest.ok());
    ExpectNoOutput(fs::path(options.out).filename().string());
    return manifest.ok() ? "" : std::string(manifest.status().message());
  }

  // The documents of both splits, decoded (bytes tokenizer), in corpus order per split.
  std::pair<std::vector<std::string>, std::vector<std::string>> BytesSplits(const fs::path& out) {
    std::vector<std::string> train, val;
    for (const auto& ids : SplitDocuments(out / "train.bin", 2, 256))
      train.push_back(BytesText(ids));
    for (const auto& ids : SplitDocuments(out / "val.bin", 2, 256)) val.push_back(BytesText(ids));
    return {train, val};
  }

  fs::path dir_;
};

// ---- The bytes tokenizer and the inputs ---------------------------------------------------------

TEST_F(PrepareTest, BytesRoundTripOverADirectoryWithManifestAndCounts) {
  // Sorted by path, recursively; hidden files and directories skipped.
  Write(dir_ / "corpus/b.txt", "second document\nwith two lines\n");
  Write(dir_ / "corpus/a.txt", "first document");
  Write(dir_ / "corpus/sub/c.txt", std::string("bytes \xff\xfe are fine for bytes\n"));
  Write(dir_ / "corpus/empty.txt", "");  // no document
  Write(dir_ / "corpus/.hidden.txt", "never read");
  Write(dir_ / "corpus/.git/objects.txt", "never read");
  PrepareOptions options = Options();
  options.inputs = {(dir_ / "corpus").string()};
  options.val_fraction = 0.3;  // round(3 * 0.3) = 1
  absl::StatusOr<DataManifest> manifest = Prepare(options);
  ASSERT_TRUE(manifest.ok()) << manifest.status();

  const std::vector<std::string> corpus = {"first document", "second document\nwith two lines\n",
                                           "bytes \xff\xfe are fine for bytes\n"};
  auto [train, val] = BytesSplits(dir_ / "out");
  ASSERT_EQ(train.size(), 2u);
  ASSERT_EQ(val.size(), 1u);
  std::vector<std::string> all = train;
  all.insert(all.end(), val.begin(), val.end());
  EXPECT_THAT(all, ::testing::UnorderedElementsAreArray(corpus));

  absl::StatusOr<DataManifest> read = ReadManifest((dir_ / "out").string());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->checksum, manifest->checksum);
  EXPECT_EQ(read->kind, "prepared");
  EXPECT_EQ(read->tokenizer, "bytes");
  EXPECT_EQ(read->tokenizer_file, "");
  EXPECT_EQ(read->vocab_size, 258);
  EXPECT_EQ(read->token_bytes, 2);
  EXPECT_EQ(read->eod_token, 256);
  EXPECT_EQ(read->bos_token, 257);
  EXPECT_EQ(read->unk_token, -1);
  EXPECT_EQ(read->train.documents, 2);
  EXPECT_EQ(read->val.documents, 1);
  int64_t bytes = 0;
  for (const std::string& doc : corpus) bytes += static_cast<int64_t>(doc.size());
  EXPECT_EQ(read->train.tokens + read->val.tokens, bytes + 3);  // + one eod a document
  ASSERT_EQ(read->inputs.size(), 4u);  // a, b, empty, sub/c: sorted, hidden ones skipped
  EXPECT_EQ(read->inputs[0].path, (dir_ / "corpus/a.txt").string());
  EXPECT_EQ(read->inputs[1].path, (dir_ / "corpus/b.txt").string());
  EXPECT_EQ(read->inputs[3].path, (dir_ / "corpus/sub/c.txt").string());
  EXPECT_EQ(read->inputs[0].bytes, 14);
  EXPECT_EQ(read->inputs[0].sha256, *Sha256File((dir_ / "corpus/a.txt").string()));
  EXPECT_EQ(read->params["val_fraction"], 0.3);
  EXPECT_EQ(read->params["seed"], 1234);
  EXPECT_EQ(read->params["docs"], "file");
  EXPECT_EQ(read->params["replaced_sequences"], 0);
  EXPECT_FALSE(read->ablate_version.empty());
  EXPECT_EQ(read->train.sha256, *Sha256File((dir_ / "out/train.bin").string()));
  EXPECT_EQ(read->val.sha256, *Sha256File((dir_ / "out/val.bin").string()));
}

TEST_F(PrepareTest, LineAndBlankDocumentsAndCrlf) {
  Write(dir_ / "lines.txt", "one\n\ntwo\r\n  \nthree");
  PrepareOptions options = Options();
  options.inputs = {(dir_ / "lines.txt").string()};
  options.docs = "line";
  ASSERT_TRUE(Prepare(options).ok());
  auto [train, val] = BytesSplits(dir_ / "out");
  std::vector<std::string> all = train;
  all.insert(all.end(), val.begin(), val.end());
  // The whitespace-only line is a document in line mode (it is not empty).
  EXPECT_THAT(all, ::testing::UnorderedElementsAre("one", "two", "  ", "three"));

  Write(dir_ / "paragraphs.txt", "\n\na\nb\n\n \t\nc\n\n\nd\ne");
  options = Options("out2");
  options.inputs = {(dir_ / "paragraphs.txt").string()};
  options.docs = "blank";
  ASSERT_TRUE(Prepare(options).ok());
  std::tie(train, val) = BytesSplits(dir_ / "out2");
  all = train;
  all.insert(all.end(), val.begin(), val.end());
  EXPECT_THAT(all, ::testing::UnorderedElementsAre("a\nb", "c", "d\ne"));
}

// A document larger than the pieces it is read and encoded in (1 MiB), with a line longer than
// a segment, comes back whole.
TEST_F(PrepareTest, AHugeDocumentIsReadInPiecesAndComesBackWhole) {
  std::string big;
  std::mt19937_64 rng(7);
  while (big.size() < (5u << 19)) {
    big += std::string(1 + rng() % 200, static_cast<char>('a' + rng() % 26));
    big += rng() % 3 == 0 ? "\n" : " ";
  }
  big += std::string(3u << 19, 'x');  // one line of 1.5 MiB
  big += "\nend";
  Write(dir_ / "big.txt", big);
  Write(dir_ / "small.txt", "small");
  PrepareOptions options = Options();
  options.inputs = {(dir_ / "big.txt").string(), (dir_ / "small.txt").string()};
  ASSERT_TRUE(Prepare(options).ok());
  auto [train, val] = BytesSplits(dir_ / "out");
  ASSERT_EQ(train.size() + val.size(), 2u);
  const std::string& big_back = train[0].size() > val[0].size() ? train[0] : val[0];
  EXPECT_TRUE(big_back == big) << "the huge document differs (" << big_back.size() << " of "
                               << big.size() << " bytes)";
}

TEST_F(PrepareTest, JsonLinesWithAField) {
  Write(dir_ / "docs.jsonl",
        "{\"body\": \"first\\nline two\", \"id\": 1}\n"
        "\n"
        "{\"body\": \"caf\\u00e9 \\u65e5\", \"id\": 2}\r\n"
        "{\"body\": \"\", \"id\": 3}\n"
        "{\"id\": 4, \"body\": \"last\"}");
  PrepareOptions options = Options();
  options.inputs = {(dir_ / "docs.jsonl").string()};
  options.field = "body";
  absl::StatusOr<DataManifest> manifest = Prepare(options);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->params["field"], "body");
  auto [train, val] = BytesSplits(dir_ / "out");
  std::vector<std::string> all = train;
  all.insert(all.end(), val.begin(), val.end());
  // The empty document is skipped.
  EXPECT_THAT(all, ::testing::UnorderedElementsAre("first\nline two", "café 日", "last"));
}

// ---- The validation split ---------------------------------------------------------------------

TEST_F(PrepareTest, ValidationIsWholeDocumentsChosenByTheSeed) {
  std::string text;
  for (int i = 0; i < 40; ++i) text += absl::StrCat("document ", i, "\n");
  Write(dir_ / "docs.txt", text);
  auto val_of = [&](uint64_t seed, double fraction, const std::string& out) {
    PrepareOptions options = Options(out);
    options.inputs = {(dir_ / "docs.txt").string()};
    options.docs = "line";
    options.seed = seed;
    options.val_fraction = fraction;
    absl::StatusOr<DataManifest> manifest = Prepare(options);
    EXPECT_TRUE(manifest.ok()) << manifest.status();
    auto [train, val] = BytesSplits(dir_ / out);
    EXPECT_EQ(train.size() + val.size(), 40u);
    EXPECT_EQ(manifest->val.documents, static_cast<int64_t>(val.size()));
    // Corpus order within each split.
    auto number = [](const std::string& doc) { return std::stoi(doc.substr(9)); };
    for (size_t i = 1; i < train.size(); ++i) EXPECT_LT(number(train[i - 1]), number(train[i]));
    for (size_t i = 1; i < val.size(); ++i) EXPECT_LT(number(val[i - 1]), number(val[i]));
    return std::set<std::string>(val.begin(), val.end());
  };
  const std::set<std::string> a = val_of(1234, 0.1, "a");
  EXPECT_EQ(a.size(), 4u);  // round(40 * 0.1)
  EXPECT_EQ(val_of(1234, 0.1, "b"), a);
  EXPECT_NE(val_of(99, 0.1, "c"), a);
  EXPECT_EQ(val_of(1234, 0.0, "d").size(), 1u);    // at least one
  EXPECT_EQ(val_of(1234, 0.01, "e").size(), 1u);   // round(0.4) = 0 -> 1
  EXPECT_EQ(val_of(1234, 0.33, "f").size(), 13u);  // round(13.2)
}

// ---- SentencePiece ------------------------------------------------------------------------------

class SentencePieceTest : public PrepareTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(SentencePieceTest, TrainedOnTheCorpusAndDecodesBackToIt) {
  const std::vector<std::string> docs = GeneratedDocuments(300, 11);
  PrepareOptions options = Options();
  options.inputs = {WriteParagraphs(docs, "corpus.txt").string()};
  options.docs = "blank";
  options.tokenizer = GetParam();
  options.vocab_size = 400;
  absl::StatusOr<DataManifest> manifest = Prepare(options);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->tokenizer, GetParam());
  EXPECT_EQ(manifest->tokenizer_file, "tokenizer.model");
  EXPECT_EQ(manifest->vocab_size, 400);
  EXPECT_EQ(manifest->unk_token, 0);
  EXPECT_EQ(manifest->bos_token, 1);
  EXPECT_EQ(manifest->eod_token, 2);
  EXPECT_EQ(manifest->params["vocab_size_requested"], 400);
  EXPECT_EQ(manifest->tokenizer_sha256, *Sha256File((dir_ / "out/tokenizer.model").string()));
  ASSERT_TRUE(ReadManifest((dir_ / "out").string()).ok());

  std::string error;
  auto tokenizer = SentencePieceTokenizer::Load(Slurp(dir_ / "out/tokenizer.model"), &error);
  ASSERT_NE(tokenizer, nullptr) << error;
  std::vector<std::string> decoded;
  for (const char* split : {"train.bin", "val.bin"}) {
    for (const auto& ids : SplitDocuments(dir_ / "out" / split, 2, manifest->eod_token)) {
      std::string text;
      ASSERT_TRUE(tokenizer->Decode(ids, &text, &error)) << error;
      decoded.push_back(text);
    }
  }
  EXPECT_EQ(manifest->val.documents, 15);  // round(300 * 0.05)
  EXPECT_THAT(decoded, ::testing::UnorderedElementsAreArray(docs));

  // The model given back as --tokenizer FILE encodes to the same tokens.
  options = Options("again");
  options.inputs = {(dir_ / "corpus.txt").string()};
  options.docs = "blank";
  options.tokenizer = (dir_ / "out/tokenizer.model").string();
  absl::StatusOr<DataManifest> again = Prepare(options);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->tokenizer, "model");
  EXPECT_EQ(again->tokenizer_sha256, manifest->tokenizer_sha256);
  EXPECT_EQ(Slurp(dir_ / "again/train.bin"), Slurp(dir_ / "out/train.bin"));
  EXPECT_EQ(Slurp(dir_ / "again/val.bin"), Slurp(dir_ / "out/val.bin"));
  EXPECT_EQ(again->params["vocab_size_requested"], nullptr);

  // A document over the 1 MiB pieces it is encoded in gets the tokens of the whole: the models
  // never learn a piece across a newline.
  std::string big;
  for (size_t i = 0; big.size() < (3u << 19); ++i) big += docs[i % docs.size()] + "\n";
  big.pop_back();
  Write(dir_ / "big/1.txt", big);
  Write(dir_ / "big/2.txt", "another");
  options = Options("big_out");
  options.inputs = {(dir_ / "big").string()};
  options.tokenizer = (dir_ / "out/tokenizer.model").string();
  options.val_fraction = 0;
  options.seed = 1;
  ASSERT_TRUE(Prepare(options).ok());
  std::vector<int> whole;
  ASSERT_TRUE(tokenizer->Encode(big, &whole, &error));
  std::vector<std::vector<int32_t>> train = SplitDocuments(dir_ / "big_out/train.bin", 2, 2);
  std::vector<std::vector<int32_t>> val = SplitDocuments(dir_ / "big_out/val.bin", 2, 2);
  const std::vector<int32_t>& big_ids = train[0].size() > val[0].size() ? train[0] : val[0];
  EXPECT_TRUE(big_ids == whole) << big_ids.size() << " tokens, " << whole.size() << " whole";
}

INSTANTIATE_TEST_SUITE_P(BpeAndUnigram, SentencePieceTest, ::testing::Values("bpe", "unigram"));

// ---- Bad input ----------------------------------------------------------------------------------

TEST_F(PrepareTest, InvalidUtf8IsRefusedWithFileLineAndOffset) {
  const std::string text = "good line\nsecond \xc3\x28 bad\n";
  Write(dir_ / "bad.txt", text);
  Write(dir_ / "ok.txt", "fine");
  PrepareOptions options = Options();
  options.inputs = {(dir_ / "ok.txt").string(), (dir_ / "bad.txt").string()};
  options.tokenizer = "bpe";
  const std::string error = PrepareError(options);
  EXPECT_THAT(error,
              HasSubstr(absl::StrCat((dir_ / "bad.txt").string(), ":2: invalid UTF-8 at byte 17")));

  // The bytes tokenizer takes any byte.
  options.tokenizer = "bytes";
  EXPECT_TRUE(Prepare(options).ok());
}

TEST_F(PrepareTest, InvalidUtf8ReplacedIsCountedInTheManifest) {
  std::vector<std::string> docs = GeneratedDocuments(60, 3);
  docs[5] += " \xc3\x28 and \xed\xa0\x80 and \xf0\x9f";  // three bad sequences
  PrepareOptions options = Options();
  options.inputs = {WriteParagraphs(docs, "corpus.txt").string()};
  options.docs = "blank";
  options.tokenizer = "unigram";
  options.vocab_size = 350;
  options.invalid_utf8 = "replace";
  absl::StatusOr<DataManifest> manifest = Prepare(options);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  // Each maximal invalid subpart is one U+FFFD: \xc3 (the "(" after it is kept); \xed, \xa0 and
  // \x80 one each (ED must be followed by 80-9F: a surrogate otherwise); the truncated \xf0\x9f.
  EXPECT_EQ(manifest->params["replaced_sequences"], 5);
  EXPECT_EQ(manifest->params["invalid_utf8"], "replace");
  std::string error;
  auto tokenizer = SentencePieceTokenizer::Load(Slurp(dir_ / "out/tokenizer.model"), &error);
  ASSERT_NE(tokenizer, nullptr);
  bool found = false;
  for (const char* split : {"train.bin", "val.bin"}) {
    for (const auto& ids : SplitDocuments(dir_ / "out" / split, 2, 2)) {
      std::string text;
      ASSERT_TRUE(tokenizer->Decode(ids, &text, &error));
      found |= text.find(
                   " \xef\xbf\xbd( and \xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd and "
                   "\xef\xbf\xbd") != std::string::npos;
    }
  }
  EXPECT_TRUE(found);
}

TEST_F(PrepareTest, AnEmptyCorpusIsAnError) {
  Write(dir_ / "corpus/empty.txt", "");
  Write(dir_ / "corpus/blank.txt", "\n\n  \n");
  PrepareOptions options = Options();
  options.inputs = {(dir_ / "corpus").string()};
  options.docs = "blank";
  EXPECT_THAT(PrepareError(options), HasSubstr("empty corpus"));
  options.docs = "file";  // blank.txt is one document: not enough for two splits
  EXPECT_THAT(PrepareError(options), HasSubstr("holds 1 document"));
}

TEST_F(PrepareTest, BadJsonLinesNameTheFileAndLine) {
  const std::string path = (dir_ / "docs.jsonl").string();
  PrepareOptions options = Options();
  options.inputs = {path};
  Write(path, "{\"text\": \"ok\"}\n{\"text\": nope}\n");
  EXPECT_THAT(PrepareError(options), HasSubstr(path + ":2: not JSON: "));
  Write(path, "{\"text\": \"ok\"}\n\n{\"body\": \"no text\"}\n");
  EXPECT_THAT(PrepareError(options), HasSubstr(path + ":3: no field \"text\""));
  Write(path, "{\"text\": 7}\n");
  EXPECT_THAT(PrepareError(options), HasSubstr(path + ":1: field \"text\" is a number"));
  Write(path, "[\"text\"]\n");
  EXPECT_THAT(PrepareError(options), HasSubstr(path + ":1: a JSON array, not an object"));
}

TEST_F(PrepareTest, AVocabularyLargerThanTheCorpusSupportsNamesVocabSize) {
  PrepareOptions options = Options();
  options.inputs = {WriteParagraphs(GeneratedDocuments(20, 5), "corpus.txt").string()};
  options.docs = "blank";
  options.tokenizer = "bpe";
  options.vocab_size = 5000;
  const std::string error = PrepareError(options);
  EXPECT_THAT(error, HasSubstr("--vocab-size 5000"));
  EXPECT_THAT(error, HasSubstr("Vocabulary size too high"));
  options.tokenizer = "unigram";
  EXPECT_THAT(PrepareError(options), HasSubstr("--vocab-size 5000"));
}

TEST_F(PrepareTest, MissingInputsExistingOutputAndBadOptions) {
  Write(dir_ / "a.txt", "a\nb\n");
  PrepareOptions options = Options();
  options.docs = "line";
  options.inputs = {(dir_ / "a.txt").string(), (dir_ / "missing.txt").string()};
  absl::StatusOr<DataManifest> missing = Prepare(options);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("missing.txt"));
  ExpectNoOutput();

  options.inputs = {(dir_ / "a.txt").string()};
  options.tokenizer = (dir_ / "no.model").string();
  EXPECT_THAT(PrepareError(options), HasSubstr("no.model: no such file"));
  options.tokenizer = (dir_ / "a.txt").string();
  EXPECT_THAT(PrepareError(options), HasSubstr("not a SentencePiece model"));
  options.tokenizer = "bytes";
  options.val_fraction = 1;
  EXPECT_THAT(PrepareError(options), HasSubstr("--val-fraction"));

  fs::create_directories(dir_ / "out");
  Write(dir_ / "out/mine.txt", "keep");
  options.val_fraction = 0.5;
  absl::StatusOr<DataManifest> exists = Prepare(options);
  EXPECT_EQ(exists.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(exists.status().message(), HasSubstr("--force"));
  EXPECT_EQ(Slurp(dir_ / "out/mine.txt"), "keep");

  options.force = true;
  ASSERT_TRUE(Prepare(options).ok());
  EXPECT_FALSE(fs::exists(dir_ / "out/mine.txt"));
  EXPECT_TRUE(ReadManifest((dir_ / "out").string()).ok());
  for (const auto& entry : fs::directory_iterator(dir_)) {
    EXPECT_THAT(entry.path().filename().string(), ::testing::Not(HasSubstr(".partial-")));
  }
}

// ---- PreparedWriter -----------------------------------------------------------------------------

TEST_F(PrepareTest, AWriterDestroyedWithoutCommitLeavesNothing) {
  {
    auto writer = PreparedWriter::Open((dir_ / "out").string(), 100, 2, 0, false);
    ASSERT_TRUE(writer.ok()) << writer.status();
    ASSERT_TRUE((*writer)->AddDocument(PreparedWriter::Split::kTrain, {5, 6}).ok());
    EXPECT_TRUE(fs::exists((*writer)->partial_dir()));
    EXPECT_THAT((*writer)->partial_dir(), HasSubstr("/.out.partial-"));
    EXPECT_FALSE(fs::exists(dir_ / "out"));
  }
  ExpectNoOutput();
}

TEST_F(PrepareTest, WriterRefusesIdsOutsideTheVocabularyAndEmptySplits) {
  auto writer = PreparedWriter::Open((dir_ / "out").string(), 70000, 4, 69999, false);
  ASSERT_TRUE(writer.ok());
  using Split = PreparedWriter::Split;
  const absl::Status too_big = (*writer)->AddDocument(Split::kTrain, {1, 70000});
  EXPECT_EQ(too_big.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_big.message(), HasSubstr("token id 70000 of document 0"));
  EXPECT_THAT(too_big.message(), HasSubstr("train.bin"));
  EXPECT_FALSE((*writer)->AddDocument(Split::kVal, {-1}).ok());
  ASSERT_TRUE((*writer)->AddDocument(Split::kTrain, {65536, 3}).ok());
  DataManifest manifest;
  const absl::Status empty = (*writer)->Commit(&manifest);
  EXPECT_THAT(empty.message(), HasSubstr("val.bin would hold no document"));
  ASSERT_TRUE((*writer)->AddDocument(Split::kVal, {}).ok());
  manifest.tokenizer = "model";
  ASSERT_TRUE((*writer)->Commit(&manifest).ok());
  absl::StatusOr<DataManifest> read = ReadManifest((dir_ / "out").string());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->token_bytes, 4);
  EXPECT_EQ(read->train.tokens, 3);
  EXPECT_EQ(read->val.tokens, 1);
  EXPECT_EQ(SplitDocuments(dir_ / "out/train.bin", 4, 69999),
            (std::vector<std::vector<int32_t>>{{65536, 3}}));
  EXPECT_FALSE(PreparedWriter::Open((dir_ / "x").string(), 70000, 2, 0, false).ok());  // too wide
}

TEST_F(PrepareTest, OpenRemovesThePartialDirectoryOfADeadWriter) {
  // A pid that names no process: what a writer killed mid-way leaves behind.
  pid_t dead = 999999;
  while (::kill(dead, 0) == 0 || errno != ESRCH) --dead;
  const fs::path stale = dir_ / absl::StrCat(".out.partial-", dead);
  Write(stale / "train.bin", "half");
  const fs::path live = dir_ / ".out.partial-1";  // init: alive, left alone
  fs::create_directories(live);
  auto writer = PreparedWriter::Open((dir_ / "out").string(), 258, 2, 256, false);
  ASSERT_TRUE(writer.ok());
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(live));
  fs::remove_all(live);
}

// ---- The protobuf clash -------------------------------------------------------------------------

std::string Ldd(const std::string& binary) {
  std::string output;
  FILE* pipe = ::popen(("ldd '" + binary + "' 2>&1").c_str(), "r");
  if (pipe == nullptr) return "";
  char buffer[4096];
  while (size_t n = std::fread(buffer, 1, sizeof(buffer), pipe)) output.append(buffer, n);
  ::pclose(pipe);
  return output;
}

// SentencePiece's library embeds a protobuf whose symbols clash with gRPC's libprotobuf: the two
// must never be loaded into one process. ablate-data has SentencePiece and no protobuf or gRPC;
// ablate and ablate-worker have gRPC and no SentencePiece.
TEST(DataBinariesTest, SentencePieceAndProtobufNeverShareAProcess) {
  const std::string data = Ldd(ABLATE_DATA_BIN);
  EXPECT_THAT(data, HasSubstr("libsentencepiece")) << data;
  EXPECT_THAT(data, ::testing::Not(HasSubstr("libprotobuf"))) << data;
  EXPECT_THAT(data, ::testing::Not(HasSubstr("libgrpc"))) << data;
  EXPECT_THAT(data, ::testing::Not(HasSubstr("libtorch"))) << data;
  for (const std::string binary : {ABLATE_BIN, ABLATE_WORKER_BIN}) {
    const std::string libs = Ldd(binary);
    EXPECT_THAT(libs, HasSubstr("libgrpc")) << binary << " (is this still the gRPC binary?)";
    EXPECT_THAT(libs, ::testing::Not(HasSubstr("libsentencepiece"))) << binary << "\n" << libs;
  }
}

}  // namespace
}  // namespace ablate
