// The token formats read directly (llm.c shards and globs, Megatron indexed datasets, prepared
// directories), documents and doc_aligned windows, and the fingerprint a run is keyed by.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "common/token_files.h"
#include "config/data_source.h"
#include "config/model_config.h"
#include "tests/test_dir.h"
#include "worker/train/data.h"

namespace ablate {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

template <typename T>
void Append(std::string* bytes, const std::vector<T>& values) {
  bytes->append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

class DataFormatsTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = ablate::testing::FreshTestDir("ablate_data_formats_test"); }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path Write(const std::string& name, const std::string& bytes) {
    const fs::path p = dir_ / name;
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  // An llm.c shard of `tokens` (uint16), with the header's count `count` (-1: the right one).
  fs::path WriteShard(const std::string& name, const std::vector<uint16_t>& tokens, int count = -1,
                      int32_t magic = kLlmcMagic) {
    std::vector<int32_t> header(256, 0);
    header[0] = magic;
    header[1] = 1;
    header[2] = count < 0 ? static_cast<int32_t>(tokens.size()) : count;
    std::string bytes;
    Append(&bytes, header);
    Append(&bytes, tokens);
    return Write(name, bytes);
  }
  // A Megatron dataset of uint16 documents, each one sequence, or two when it is longer than 8.
  fs::path WriteMegatron(const std::string& prefix, const std::vector<std::vector<uint16_t>>& docs,
                         int64_t skew = 0) {
    std::vector<int32_t> lengths;
    std::vector<int64_t> pointers, documents = {0};
    std::string bin;
    for (const auto& doc : docs) {
      const size_t half = doc.size() > 8 ? doc.size() / 2 : doc.size();
      for (const auto& [begin, end] : {std::pair{size_t{0}, half}, {half, doc.size()}}) {
        if (begin == end) continue;
        pointers.push_back(static_cast<int64_t>(bin.size()) + (pointers.empty() ? 0 : skew));
        lengths.push_back(static_cast<int32_t>(end - begin));
        Append(&bin, std::vector<uint16_t>(doc.begin() + begin, doc.begin() + end));
      }
      documents.push_back(static_cast<int64_t>(lengths.size()));
    }
    std::string idx("MMIDIDX\0\0", 9);
    Append(&idx, std::vector<uint64_t>{1});
    idx.push_back(8);  // uint16
    Append(&idx, std::vector<uint64_t>{lengths.size(), documents.size()});
    Append(&idx, lengths);
    Append(&idx, pointers);
    Append(&idx, documents);
    Write(prefix + ".idx", idx);
    Write(prefix + ".bin", bin);
    return dir_ / prefix;
  }
  // A prepared directory: documents of `docs`, eod 1, vocabulary 64; the last `val` go to val.bin.
  fs::path WritePrepared(const std::string& name, const std::vector<std::vector<uint16_t>>& docs,
                         size_t val) {
    DataManifest m;
    m.tokenizer = "bytes";
    m.vocab_size = 64;
    m.eod_token = 1;
    m.bos_token = 2;
    std::string train, valbin;
    for (size_t d = 0; d < docs.size(); ++d) {
      std::string* out = d + val >= docs.size() ? &valbin : &train;
      SplitInfo* s = d + val >= docs.size() ? &m.val : &m.train;
      Append(out, docs[d]);
      Append(out, std::vector<uint16_t>{1});
      s->documents += 1;
      s->tokens += static_cast<int64_t>(docs[d].size()) + 1;
    }
    m.train.file = "train.bin";
    m.val.file = "val.bin";
    Write(name + "/train.bin", train);
    Write(name + "/val.bin", valbin);
    EXPECT_TRUE(WriteManifest((dir_ / name).string(), &m).ok());
    return dir_ / name;
  }
  static DataConfig Config(const fs::path& p) {
    DataConfig c = DefaultTrainConfig().data();
    c.set_path(p.string());
    return c;
  }
  static std::vector<int64_t> Inputs(const TokenData& data, TokenData::Split split, int64_t index,
                                     int64_t rows, int64_t len) {
    std::vector<int64_t> x(rows * len), y(rows * len);
    data.Batch(split, index, rows, len, x.data(), y.data());
    return x;
  }
  fs::path dir_;
};

// Document d of a test corpus: 10 + 3d tokens, [10 + d, 11 + d, ...] mod 60, never 1 (eod) or 2.
std::vector<std::vector<uint16_t>> Documents(int n) {
  std::vector<std::vector<uint16_t>> docs;
  for (int d = 0; d < n; ++d) {
    std::vector<uint16_t> doc;
    for (int t = 0; t < 10 + 3 * d; ++t) doc.push_back(static_cast<uint16_t>(3 + (d * 7 + t) % 60));
    docs.push_back(doc);
  }
  return docs;
}

TEST_F(DataFormatsTest, ReadsLlmcShardsByGlobWithoutTheirHeaders) {
  std::vector<uint16_t> a(300), b(200), v(100);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint16_t>(100 + i % 50);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint16_t>(200 + i % 50);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint16_t>(300 + i % 50);
  WriteShard("fineweb_train_000001.bin", a);
  WriteShard("fineweb_train_000002.bin", b);
  WriteShard("fineweb_val_000000.bin", v);
  DataConfig c = Config(dir_ / "fineweb_train_*.bin");
  c.set_val_path((dir_ / "fineweb_val_*.bin").string());
  auto data = TokenData::Load(c, 50304, 16);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->train_tokens(), 500);
  EXPECT_EQ(data->val_tokens(), 100);
  // Windows come from both shards and never from a header (whose magic would be 20240520's
  // low half, 36920, or 0).
  bool first = false, second = false;
  for (int64_t i = 0; i < 20; ++i) {
    for (const int64_t t : Inputs(*data, TokenData::Split::kTrain, i, 4, 16)) {
      ASSERT_GE(t, 100);
      ASSERT_LT(t, 250);
      (t < 200 ? first : second) = true;
    }
    for (const int64_t t : Inputs(*data, TokenData::Split::kVal, i, 4, 16)) {
      ASSERT_GE(t, 300);
      ASSERT_LT(t, 350);
    }
  }
  EXPECT_TRUE(first && second);
}

TEST_F(DataFormatsTest, BadShardsNameTheFileAndWhatIsWrong) {
  std::vector<uint16_t> tokens(100, 7);
  const fs::path short_body = WriteShard("short.bin", tokens, 150);
  DataConfig c = Config(short_body);
  auto data = TokenData::Load(c, 512, 16);
  ASSERT_FALSE(data.ok());
  EXPECT_THAT(std::string(data.status().message()), HasSubstr(short_body.string()));
  EXPECT_THAT(std::string(data.status().message()), HasSubstr("short body"));

  const fs::path wrong = WriteShard("wrong.bin", tokens, -1, 12345);
  c = Config(wrong);
  c.set_format(DATA_LLMC);
  data = TokenData::Load(c, 512, 16);
  ASSERT_FALSE(data.ok());
  EXPECT_THAT(std::string(data.status().message()), HasSubstr("magic 12345"));

  c = Config(dir_ / "nothing_*.bin");
  data = TokenData::Load(c, 512, 16);
  ASSERT_FALSE(data.ok());
  EXPECT_THAT(std::string(data.status().message()), HasSubstr("no file matches"));

  std::vector<uint16_t> big(100, 600);
  c = Config(WriteShard("big.bin", big));
  data = TokenData::Load(c, 512, 16);
  ASSERT_FALSE(data.ok());
  EXPECT_THAT(std::string(data.status().message()), HasSubstr("byte 1024"));  // after the header
}

TEST_F(DataFormatsTest, ReadsMegatronDatasetsWithTheirDocuments) {
  const auto docs = Documents(12);
  const fs::path prefix = WriteMegatron("corpus_text_document", docs);
  DataConfig c = Config(prefix);
  c.set_doc_aligned(true);
  c.set_val_fraction(0.2);
  auto data = TokenData::Load(c, 64, 8);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->train_documents() + data->val_documents(), 12);
  EXPECT_GT(data->val_documents(), 0);
  // Every window starts at a document's first token.
  std::set<int64_t> firsts;
  for (const auto& doc : docs) firsts.insert(doc[0]);
  for (int64_t i = 0; i < 30; ++i) {
    const std::vector<int64_t> x = Inputs(*data, TokenData::Split::kTrain, i, 2, 8);
    EXPECT_TRUE(firsts.count(x[0])) << x[0];
    EXPECT_TRUE(firsts.count(x[8])) << x[8];
  }
  // The split is at a document start: validation begins with a document.
  const std::vector<int64_t> v = Inputs(*data, TokenData::Split::kVal, 0, 1, 8);
  EXPECT_TRUE(firsts.count(v[0]));
}

TEST_F(DataFormatsTest, AnIndexThatDisagreesWithItsBinIsRefused) {
  const fs::path skewed = WriteMegatron("skewed", Documents(4), 2);
  auto data = TokenData::Load(Config(skewed), 64, 8);
  ASSERT_FALSE(data.ok());
  EXPECT_THAT(std::string(data.status().message()), HasSubstr("skewed.idx"));
  EXPECT_THAT(std::string(data.status().message()), HasSubstr("starts at byte"));

  const fs::path longer = WriteMegatron("longer", Documents(4));
  std::ofstream(longer.string() + ".bin", std::ios::binary | std::ios::app) << "xx";
  data = TokenData::Load(Config(longer), 64, 8);
  ASSERT_FALSE(data.ok());
  EXPECT_THAT(std::string(data.status().message()), HasSubstr("disagree"));

  Write("bad.idx", "MMIDIDX\0\0");
  Write("bad.bin", "");
  data = TokenData::Load(Config(dir_ / "bad"), 64, 8);
  ASSERT_FALSE(data.ok());
  EXPECT_THAT(std::string(data.status().message()), HasSubstr("not a Megatron-LM index"));
}

TEST_F(DataFormatsTest, APreparedDirectoryGivesItsVocabularyAndDocuments) {
  const auto docs = Documents(10);
  const fs::path dir = WritePrepared("prepared", docs, 3);
  DataConfig c = Config(dir);
  c.set_doc_aligned(true);
  c.set_bos_token(2);
  auto data = TokenData::Load(c, 64, 8);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->train_documents(), 7);
  EXPECT_EQ(data->val_documents(), 3);
  std::set<int64_t> firsts;
  for (const auto& doc : docs) firsts.insert(doc[0]);
  for (int64_t i = 0; i < 30; ++i) {
    std::vector<int64_t> x(8), y(8);
    data->Batch(TokenData::Split::kTrain, i, 1, x.data(), y.data());
    EXPECT_EQ(x[0], 2);                       // the BOS
    EXPECT_TRUE(firsts.count(y[0])) << y[0];  // then a document's first token
  }
  // A smaller model vocabulary than the manifest's is an error naming both.
  data = TokenData::Load(c, 32, 8);
  ASSERT_FALSE(data.ok());
  EXPECT_THAT(std::string(data.status().message()), HasSubstr("32"));
  EXPECT_THAT(std::string(data.status().message()), HasSubstr("64"));
}

TEST_F(DataFormatsTest, AManifestEditedByHandOrATruncatedSplitIsRefused) {
  const fs::path dir = WritePrepared("prepared", Documents(6), 2);
  std::string text;
  {
    std::ifstream in(dir / "manifest.json");
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::string edited =
      std::regex_replace(text, std::regex("\"vocab_size\": 64"), "\"vocab_size\": 65");
  ASSERT_NE(edited, text);
  std::ofstream(dir / "manifest.json") << edited;
  auto data = TokenData::Load(Config(dir), 128, 8);
  ASSERT_FALSE(data.ok());
  EXPECT_THAT(std::string(data.status().message()), HasSubstr("edited"));

  std::ofstream(dir / "manifest.json") << text;
  ASSERT_TRUE(TokenData::Load(Config(dir), 128, 8).ok());
  fs::resize_file(dir / "train.bin", fs::file_size(dir / "train.bin") - 2);
  data = TokenData::Load(Config(dir), 128, 8);
  ASSERT_FALSE(data.ok());
  EXPECT_THAT(std::string(data.status().message()), HasSubstr("train.bin"));
  EXPECT_THAT(std::string(data.status().message()), HasSubstr("changed after it was prepared"));
}

TEST_F(DataFormatsTest, DocAlignedNeedsDocuments) {
  std::vector<uint16_t> tokens(200, 7);
  DataConfig c = Config(WriteShard("one.bin", tokens));
  c.set_doc_aligned(true);
  auto data = TokenData::Load(c, 512, 16);
  ASSERT_FALSE(data.ok());
  EXPECT_THAT(std::string(data.status().message()), HasSubstr("eod_token"));
  // With the token that ends documents, it has them.
  for (size_t i = 39; i < tokens.size(); i += 40) tokens[i] = 9;
  c = Config(WriteShard("two.bin", tokens));
  c.set_val_fraction(0.25);
  c.set_doc_aligned(true);
  c.set_eod_token(9);
  data = TokenData::Load(c, 512, 16);
  ASSERT_TRUE(data.ok()) << data.status();
  for (int64_t i = 0; i < 10; ++i) {
    const std::vector<int64_t> x = Inputs(*data, TokenData::Split::kTrain, i, 1, 16);
    EXPECT_EQ(x[0], 7);  // the first token, or the one after an eod
  }
}

TEST_F(DataFormatsTest, TheFingerprintFollowsTheContentsNotThePath) {
  std::string bytes(300000, 'a');
  const fs::path file = Write("corpus/text.txt", bytes);
  DataConfig c = Config(dir_ / "corpus");
  auto first = ResolveDataSource(c, c.path(), true);
  ASSERT_TRUE(first.ok()) << first.status();
  // Moved (rename keeps the bytes and the time): the same fingerprint.
  fs::rename(dir_ / "corpus", dir_ / "moved");
  auto moved = ResolveDataSource(Config(dir_ / "moved"), (dir_ / "moved").string(), true);
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(moved->fingerprint, first->fingerprint);
  // Rewritten with one byte changed: another.
  bytes[150000] = 'b';
  Write("moved/text.txt", bytes);
  auto rewritten = ResolveDataSource(Config(dir_ / "moved"), (dir_ / "moved").string(), true);
  ASSERT_TRUE(rewritten.ok());
  EXPECT_NE(rewritten->fingerprint, first->fingerprint);
  // A run keyed by the old fingerprint refuses the new data.
  DataConfig keyed = Config(dir_ / "moved");
  keyed.set_fingerprint(first->fingerprint);
  auto data = TokenData::Load(keyed, 256, 16);
  ASSERT_FALSE(data.ok());
  EXPECT_EQ(data.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(data.status().message()), HasSubstr("changed after the sweep"));
  keyed.set_fingerprint(rewritten->fingerprint);
  EXPECT_TRUE(TokenData::Load(keyed, 256, 16).ok());
}

}  // namespace
}  // namespace ablate
