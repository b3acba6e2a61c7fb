// Token data: deterministic batches, the split, nanoGPT files, and errors naming the file.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <utility>
#include <vector>

#include "config/model_config.h"
#include "tests/test_dir.h"
#include "worker/train/data.h"

namespace ablate {
namespace {

namespace fs = std::filesystem;

class DataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ablate::testing::FreshTestDir("ablate_data_test");
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path Write(const std::string& name, const std::string& bytes) {
    fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  // t.txt: 2000 letters, a to z over and over, so that each token's successor is known.
  fs::path WriteAlphabet() {
    std::string text;
    for (int i = 0; i < 2000; ++i) text += static_cast<char>('a' + i % 26);
    return Write("t.txt", text);
  }
  DataConfig Config(const fs::path& p) {
    DataConfig c = DefaultTrainConfig().data();
    c.set_path(p.string());
    return c;
  }
  // The first `count` windows of `len` tokens of the validation split, back to back: inputs, then
  // targets.
  static std::pair<std::vector<int64_t>, std::vector<int64_t>> ConsecutiveWindows(
      const TokenData& data, int64_t count, int64_t len) {
    std::vector<int64_t> x(count * len), y(count * len);
    data.Consecutive(TokenData::Split::kVal, count, len, x.data(), y.data());
    return {x, y};
  }
  fs::path dir_;
};

TEST_F(DataTest, BatchesArePureFunctionsOfSeedAndIndex) {
  auto data = TokenData::Load(Config(WriteAlphabet()), 256, 16);
  ASSERT_TRUE(data.ok()) << data.status();
  std::vector<int64_t> x1(4 * 16), y1(4 * 16), x2(4 * 16), y2(4 * 16);
  data->Batch(TokenData::Split::kTrain, 7, 4, x1.data(), y1.data());
  data->Batch(TokenData::Split::kTrain, 3, 4, x2.data(), y2.data());
  data->Batch(TokenData::Split::kTrain, 7, 4, x2.data(), y2.data());
  EXPECT_EQ(x1, x2);
  EXPECT_EQ(y1, y2);
  data->Batch(TokenData::Split::kTrain, 8, 4, x2.data(), y2.data());
  EXPECT_NE(x1, x2);
  // Targets are the inputs shifted by one.
  for (int b = 0; b < 4; ++b) {
    for (int t = 0; t + 1 < 16; ++t) EXPECT_EQ(y1[b * 16 + t], x1[b * 16 + t + 1]);
  }
}

// A fixed first token: every window, training and validation, starts with it; the rest is the
// same corpus window shifted, so the first target is the window's first corpus token.
TEST_F(DataTest, ABosTokenStartsEveryWindow) {
  DataConfig c = Config(WriteAlphabet());
  c.set_bos_token(2);
  auto data = TokenData::Load(c, 256, 16);
  ASSERT_TRUE(data.ok()) << data.status();
  for (TokenData::Split split : {TokenData::Split::kTrain, TokenData::Split::kVal}) {
    std::vector<int64_t> x(4 * 16), y(4 * 16);
    data->Batch(split, 5, 4, x.data(), y.data());
    for (int b = 0; b < 4; ++b) {
      EXPECT_EQ(x[b * 16], 2);
      for (int t = 1; t < 16; ++t) EXPECT_EQ(x[b * 16 + t], y[b * 16 + t - 1]);
      // Consecutive letters of the corpus: the targets continue the inputs' letters.
      for (int t = 1; t < 16; ++t) {
        EXPECT_EQ((y[b * 16 + t] - 'a') % 26, (y[b * 16 + t - 1] - 'a' + 1) % 26);
      }
    }
  }
  c.set_bos_token(256);
  const auto bad = TokenData::Load(c, 256, 16);
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("train.data.bos_token: 256 is outside the vocabulary"),
            std::string::npos)
      << bad.status();
}

// The windows of an evaluation length are the validation split's first tokens back to back, so
// every length reads the same text: 3 windows of 8 and 6 of 4 cover the same 24 tokens.
TEST_F(DataTest, ConsecutiveWindowsCoverTheSameTextAtEveryLength) {
  auto data = TokenData::Load(Config(WriteAlphabet()), 256, 8);
  ASSERT_TRUE(data.ok()) << data.status();
  const auto [x8, y8] = ConsecutiveWindows(*data, 3, 8);
  const auto [x4, y4] = ConsecutiveWindows(*data, 6, 4);
  EXPECT_EQ(x8, x4);
  EXPECT_EQ(y8, y4);
  for (int t = 0; t < 24; ++t) EXPECT_EQ((y8[t] - 'a') % 26, (x8[t] - 'a' + 1) % 26) << t;
  for (int t = 1; t < 24; ++t) EXPECT_EQ(x8[t], y8[t - 1]) << t;  // back to back, no gap
}

TEST_F(DataTest, HoldsOutTheLastFractionForValidation) {
  auto data = TokenData::Load(Config(Write("t.txt", std::string(1000, 'x'))), 256, 8);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->val_tokens(), 50);
  EXPECT_EQ(data->train_tokens(), 950);
}

TEST_F(DataTest, ReadsNanoGptTokenFiles) {
  std::vector<uint16_t> train(500), val(100);
  for (size_t i = 0; i < train.size(); ++i) train[i] = static_cast<uint16_t>(i % 1000);
  for (size_t i = 0; i < val.size(); ++i) val[i] = static_cast<uint16_t>(999 - i);
  Write("train.bin", std::string(reinterpret_cast<char*>(train.data()), train.size() * 2));
  Write("val.bin", std::string(reinterpret_cast<char*>(val.data()), val.size() * 2));
  auto data = TokenData::Load(Config(dir_), 1000, 8);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->train_tokens(), 500);
  std::vector<int64_t> x(8), y(8);
  data->Batch(TokenData::Split::kVal, 0, 1, x.data(), y.data());
  EXPECT_EQ(y[0], x[0] - 1);  // val counts down
  // A token outside the vocabulary names the file and the token.
  auto small = TokenData::Load(Config(dir_), 100, 8);
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("train.bin"), std::string::npos) << small.status();
  EXPECT_NE(small.status().message().find("vocabulary"), std::string::npos);
}

// train.data.token_dtype: uint32 token files (Qwen's 151,936-token vocabulary does not fit
// uint16), mapped rather than read; every id checked against the vocabulary in one pass, the
// first one outside it named by file and offset.
TEST_F(DataTest, ReadsUint32TokenFilesOfAnyVocabulary) {
  fs::create_directories(dir_ / "qwen");
  std::vector<uint32_t> train(3000), val(300);
  for (size_t i = 0; i < train.size(); ++i) train[i] = static_cast<uint32_t>(100000 + i * 17);
  for (size_t i = 0; i < val.size(); ++i) val[i] = static_cast<uint32_t>(151935 - i);
  Write("qwen/train.bin", std::string(reinterpret_cast<char*>(train.data()), train.size() * 4));
  Write("qwen/val.bin", std::string(reinterpret_cast<char*>(val.data()), val.size() * 4));
  DataConfig c = Config(dir_ / "qwen");
  c.set_token_dtype(TOKEN_UINT32);
  auto data = TokenData::Load(c, 151936, 8);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->train_tokens(), 3000);
  EXPECT_EQ(data->val_tokens(), 300);
  std::vector<int64_t> x(8), y(8);
  data->Batch(TokenData::Split::kTrain, 0, 1, x.data(), y.data());
  EXPECT_GE(x[0], 100000);
  EXPECT_EQ(y[0], x[0] + 17);  // ids above 65,535 read whole
  data->Consecutive(TokenData::Split::kVal, 1, 8, x.data(), y.data());
  EXPECT_EQ(x[0], 151935);
  EXPECT_EQ(y[7], 151935 - 8);

  // The same files as uint16 (the default) read other ids, and the message says why.
  auto as16 = TokenData::Load(Config(dir_ / "qwen"), 151936, 8);
  ASSERT_TRUE(as16.ok()) << as16.status();  // every half of these ids is below the vocabulary
  // An id outside the vocabulary: the first one, by token and byte offset.
  train[2345] = 151936;
  Write("qwen/train.bin", std::string(reinterpret_cast<char*>(train.data()), train.size() * 4));
  auto bad = TokenData::Load(c, 151936, 8);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("train.bin: token 151936 at token offset 2345 (byte 9380)"),
            std::string::npos)
      << bad.status();
  // A uint16 file with an id of the vocabulary's size says that uint32 files need the setting.
  std::vector<uint16_t> small = {1, 2, 3, 900, 5, 6, 7, 8, 9, 10, 11};
  fs::create_directories(dir_ / "u16");
  Write("u16/train.bin", std::string(reinterpret_cast<char*>(small.data()), small.size() * 2));
  Write("u16/val.bin", std::string(reinterpret_cast<char*>(small.data()), small.size() * 2));
  auto hint = TokenData::Load(Config(dir_ / "u16"), 500, 4);
  ASSERT_FALSE(hint.ok());
  EXPECT_NE(hint.status().message().find("token 900 at token offset 3"), std::string::npos)
      << hint.status();
  EXPECT_NE(hint.status().message().find("token_dtype: uint32"), std::string::npos);
  // A size that is no whole number of uint32 tokens.
  train[2345] = 7;
  Write("qwen/train.bin", std::string(reinterpret_cast<char*>(train.data()), train.size() * 4));
  Write("qwen/val.bin", "abcdef");
  auto odd = TokenData::Load(c, 151936, 1);
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.status().message().find("val.bin: 6 bytes is not a whole number of uint32 tokens"),
            std::string::npos)
      << odd.status();
}

TEST_F(DataTest, BadDataGivesAnErrorNamingTheFile) {
  struct Case {
    fs::path path;
    int64_t seq_len;
    const char* message;
  };
  const Case cases[] = {
      {dir_ / "missing.txt", 8, "no such file"},
      {Write("empty.txt", ""), 8, "(empty)"},
      {Write("short.txt", std::string(40, 'x')), 64, "fewer than train.seq_len + 1"},
  };
  for (const Case& c : cases) {
    auto data = TokenData::Load(Config(c.path), 256, c.seq_len);
    ASSERT_FALSE(data.ok()) << c.path;
    EXPECT_NE(data.status().message().find(c.path.filename().string()), std::string::npos)
        << data.status();
    EXPECT_NE(data.status().message().find(c.message), std::string::npos) << data.status();
  }
  fs::create_directories(dir_ / "odd");
  Write("odd/train.bin", "abc");
  Write("odd/val.bin", "abcd");
  auto odd = TokenData::Load(Config(dir_ / "odd"), 256, 1);
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.status().message().find("whole number of uint16"), std::string::npos);
}

// The default corpus is found from any working directory: beside an installed binary, in the
// build tree's data/, or where ABLATE_DATA_DIR says (and then only there).
TEST_F(DataTest, TheDefaultCorpusIsLookedForBesideTheBinaries) {
  const std::vector<std::string> installed =
      DefaultCorpusCandidates("/opt/ablate/bin/ablate-worker", nullptr);
  ASSERT_GE(installed.size(), 3u);
  EXPECT_EQ(installed[0], "/opt/ablate/share/ablate/kjv.txt");
  EXPECT_EQ(installed[1], "/opt/ablate/data/kjv.txt");  // a build dir inside the repository
  EXPECT_EQ(installed.back(), "data/kjv.txt");
  EXPECT_EQ(DefaultCorpusCandidates("/opt/ablate/bin/ablate-worker", "/corpora"),
            std::vector<std::string>{"/corpora/kjv.txt"});
  EXPECT_EQ(DefaultCorpusCandidates("/opt/ablate/bin/ablate-worker", ""), installed);
}

}  // namespace
}  // namespace ablate
