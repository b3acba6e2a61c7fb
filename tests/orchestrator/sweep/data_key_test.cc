// The data in run keys and configs at expansion (config/data_source.h): a prepared directory's
// manifest gives the vocabulary, token width and end-of-document token; raw files are keyed by
// their fingerprint, prepared data by its manifest, and never by the path alone.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/token_files.h"
#include "orchestrator/sweep/expand.h"
#include "orchestrator/sweep/spec.h"
#include "tests/test_dir.h"

namespace ablate {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class DataKeyTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = ablate::testing::FreshTestDir("ablate_data_key_test"); }
  void TearDown() override { fs::remove_all(dir_); }

  absl::StatusOr<ExpandedSweep> Expand(const std::string& data, const std::string& model = "") {
    const std::string text = absl::StrCat(
        "sweep: d\nbase:\n  model: {num_layers: 1, d_model: 32, num_heads: 2, num_kv_heads: 2, "
        "head_dim: 16, ffn_dim: 64",
        model, "}\n  train: {steps: 10, seq_len: 16, data: ", data,
        "}\nvariants: [baseline, g1_elementwise]\n");
    absl::StatusOr<SweepSpec> spec = ParseSweepSpecText(text, "s.yaml");
    if (!spec.ok()) return spec.status();
    return ExpandSweep(*spec, {"test"});
  }
  void WriteTokens(const fs::path& file, uint16_t first, int n) {
    fs::create_directories(file.parent_path());
    std::ofstream out(file, std::ios::binary);
    for (int i = 0; i < n; ++i) {
      const uint16_t t = static_cast<uint16_t>((first + i) % 200);
      out.write(reinterpret_cast<const char*>(&t), 2);
    }
  }
  // A prepared directory of vocabulary 300 (uint16, eod 299).
  fs::path WritePrepared(const std::string& name) {
    const fs::path d = dir_ / name;
    WriteTokens(d / "train.bin", 0, 400);
    WriteTokens(d / "val.bin", 7, 100);
    DataManifest m;
    m.tokenizer = "bytes";
    m.vocab_size = 300;
    m.eod_token = 299;
    m.train = {"train.bin", 1, 400, ""};
    m.val = {"val.bin", 1, 100, ""};
    EXPECT_TRUE(WriteManifest(d.string(), &m).ok());
    return d;
  }
  fs::path dir_;
};

TEST_F(DataKeyTest, APreparedDirectorySetsVocabularyWidthAndEod) {
  const fs::path d = WritePrepared("prep");
  absl::StatusOr<ExpandedSweep> s = Expand(absl::StrCat("{path: ", d.string(), "}"));
  ASSERT_TRUE(s.ok()) << s.status();
  const RunConfig& c = s->runs(0).config();
  EXPECT_EQ(c.model().vocab_size(), 300);
  EXPECT_EQ(c.train().data().format(), DATA_PREPARED);
  EXPECT_EQ(c.train().data().eod_token(), 299);
  EXPECT_EQ(c.train().data().fingerprint().size(), 16u);
  // The counts see the manifest's vocabulary: 300 x 32 embedding parameters.
  EXPECT_GE(s->runs(0).params().total(), 300 * 32);

  // A larger vocabulary is padding; a smaller one is an error naming both.
  s = Expand(absl::StrCat("{path: ", d.string(), "}"), ", vocab_size: 320");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->runs(0).config().model().vocab_size(), 320);
  s = Expand(absl::StrCat("{path: ", d.string(), "}"), ", vocab_size: 256");
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("256 is smaller than the vocabulary"));
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("300"));
}

TEST_F(DataKeyTest, RewrittenDataGivesNewKeysAndMovedDataKeepsThem) {
  WriteTokens(dir_ / "nano" / "train.bin", 0, 400);
  WriteTokens(dir_ / "nano" / "val.bin", 3, 100);
  absl::StatusOr<ExpandedSweep> before =
      Expand(absl::StrCat("{path: ", (dir_ / "nano").string(), "}"));
  ASSERT_TRUE(before.ok()) << before.status();

  // Moved: the same bytes under another path keep every key.
  fs::rename(dir_ / "nano", dir_ / "elsewhere");
  absl::StatusOr<ExpandedSweep> moved =
      Expand(absl::StrCat("{path: ", (dir_ / "elsewhere").string(), "}"));
  ASSERT_TRUE(moved.ok()) << moved.status();
  for (int i = 0; i < before->runs_size(); ++i) {
    EXPECT_EQ(moved->runs(i).run_key(), before->runs(i).run_key());
  }
  // Rewritten: new keys.
  WriteTokens(dir_ / "elsewhere" / "train.bin", 1, 400);
  absl::StatusOr<ExpandedSweep> rewritten =
      Expand(absl::StrCat("{path: ", (dir_ / "elsewhere").string(), "}"));
  ASSERT_TRUE(rewritten.ok());
  for (int i = 0; i < before->runs_size(); ++i) {
    EXPECT_NE(rewritten->runs(i).run_key(), before->runs(i).run_key());
  }

  // Prepared data is keyed by its manifest: a second preparation of other tokens, other keys.
  const fs::path p = WritePrepared("p1");
  absl::StatusOr<ExpandedSweep> one = Expand(absl::StrCat("{path: ", p.string(), "}"));
  fs::remove_all(p);
  WriteTokens(p / "train.bin", 5, 400);
  WriteTokens(p / "val.bin", 7, 100);
  DataManifest m;
  m.tokenizer = "bytes";
  m.vocab_size = 300;
  m.eod_token = 299;
  m.train = {"train.bin", 1, 400, "other"};
  m.val = {"val.bin", 1, 100, ""};
  ASSERT_TRUE(WriteManifest(p.string(), &m).ok());
  absl::StatusOr<ExpandedSweep> two = Expand(absl::StrCat("{path: ", p.string(), "}"));
  ASSERT_TRUE(one.ok() && two.ok());
  EXPECT_NE(one->runs(0).run_key(), two->runs(0).run_key());
}

TEST_F(DataKeyTest, DataThatIsNotThereOrHasNoDocumentsIsAnErrorAtExpansion) {
  absl::StatusOr<ExpandedSweep> s = Expand(absl::StrCat("{path: ", (dir_ / "none").string(), "}"));
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("train.data.path"));
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("no such file"));

  WriteTokens(dir_ / "nano" / "train.bin", 0, 400);
  WriteTokens(dir_ / "nano" / "val.bin", 3, 100);
  s = Expand(absl::StrCat("{path: ", (dir_ / "nano").string(), ", doc_aligned: true}"));
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("eod_token"));
  s = Expand(
      absl::StrCat("{path: ", (dir_ / "nano").string(), ", doc_aligned: true, eod_token: 0}"));
  EXPECT_TRUE(s.ok()) << s.status();
}

}  // namespace
}  // namespace ablate
