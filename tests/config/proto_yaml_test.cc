// The reflection-based YAML/JSON loader, run config files and canonical JSON (no LibTorch).
#include "config/proto_yaml.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <limits>
#include <string>

#include "config/model_config.h"
#include "tests/test_configs.h"

namespace ablate {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

absl::Status Overlay(const std::string& text, google::protobuf::Message* m) {
  absl::StatusOr<YAML::Node> node = ParseYaml(text, "t.yaml");
  if (!node.ok()) return node.status();
  return OverlayYaml(*node, "t.yaml", "", m);
}

TEST(OverlayYamlTest, SetsScalarsNestedMessagesAndEnumsOverDefaults) {
  RunConfig c = DefaultRunConfig();
  const absl::Status s = Overlay(R"(
model:
  d_model: 64
  tie_embeddings: false
  gate: {position: G1, granularity: gate_headwise, activation: ns-sigmoid}
train:
  optimizer: {lr: 2e-2}
  data: {data_seed: 7, format: text}
  device: cuda:1
  steps: 1e3
)",
                                &c);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(c.model().d_model(), 64);
  EXPECT_FALSE(c.model().tie_embeddings());
  EXPECT_EQ(c.model().gate().position(), GATE_G1);
  EXPECT_EQ(c.model().gate().granularity(), GATE_HEADWISE);
  EXPECT_EQ(c.model().gate().activation(), GATE_NS_SIGMOID);
  EXPECT_DOUBLE_EQ(c.train().optimizer().lr(), 2e-2);
  EXPECT_EQ(c.train().data().data_seed(), 7u);
  EXPECT_EQ(c.train().data().format(), DATA_TEXT);
  EXPECT_EQ(c.train().device(), "cuda:1");
  EXPECT_EQ(c.train().steps(), 1000);
  // Untouched fields keep their defaults.
  EXPECT_EQ(c.model().num_layers(), DefaultModelConfig().num_layers());
  EXPECT_DOUBLE_EQ(c.train().optimizer().beta2(), 0.95);
}

TEST(OverlayYamlTest, RepeatedFieldsReplaceTheList) {
  Histogram h;
  h.add_counts(9);
  ASSERT_TRUE(Overlay("lo: -1\nhi: 1\ncounts: [1, 2, 3]\n", &h).ok());
  ASSERT_EQ(h.counts_size(), 3);
  EXPECT_EQ(h.counts(2), 3);
  Probes p;
  const absl::Status s = Overlay("layers:\n  - {layer: 0, gate_mean: 0.5}\n  - {layer: 1}\n", &p);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(p.layers_size(), 2);
  EXPECT_DOUBLE_EQ(p.layers(0).gate_mean(), 0.5);
  EXPECT_EQ(p.layers(1).layer(), 1);
}

TEST(OverlayYamlTest, JsonParsesToo) {
  RunConfig c = DefaultRunConfig();
  ASSERT_TRUE(Overlay(R"({"model": {"num_heads": 8, "numKvHeads": 2}, "train": {"seed": "5"}})", &c)
                  .ok());
  EXPECT_EQ(c.model().num_heads(), 8);
  EXPECT_EQ(c.model().num_kv_heads(), 2);
  EXPECT_EQ(c.train().seed(), 5u);
}

struct BadCase {
  const char* text;
  const char* fragment;  // expected in the error
};

TEST(OverlayYamlTest, ErrorsNameFileLineAndFieldPath) {
  const BadCase cases[] = {
      {"model:\n  gatee: {}\n", "t.yaml:2: model: unknown key \"gatee\" (did you mean \"gate\"?)"},
      {"model:\n  zzzzzzzzzzzz: 1\n", "known keys: vocab_size, num_layers"},
      {"model:\n  d_model: wide\n", "t.yaml:2: model.d_model: expected an integer, got \"wide\""},
      {"model:\n  d_model: 1.5\n", "t.yaml:2: model.d_model: expected an integer, got 1.5"},
      {"model:\n  d_model: 3000000000\n", "t.yaml:2: model.d_model: 3000000000 is out of range for int32"},
      {"train:\n  seed: -1\n", "t.yaml:2: train.seed: -1 is out of range for uint64"},
      {"train:\n  optimizer:\n    lr: fast\n", "t.yaml:3: train.optimizer.lr: expected a number"},
      {"model:\n  qk_norm: maybe\n", "t.yaml:2: model.qk_norm: expected true or false"},
      {"model:\n  gate:\n    position: G7\n",
       "t.yaml:3: model.gate.position: bad value \"G7\"; allowed: NONE, G1, G2, G3, G4, G5"},
      {"model:\n  gate: 3\n", "t.yaml:2: model.gate: expected a mapping of GateConfig fields"},
      {"model:\n  d_model: [1, 2]\n", "t.yaml:2: model.d_model: expected an integer, got a list"},
      {"model:\n  d_model: 1\n  d_model: 2\n", "t.yaml:3: model.d_model: duplicate key"},
      {"model:\n  d_model:\n", "t.yaml:2: model.d_model: missing value"},
  };
  for (const BadCase& c : cases) {
    RunConfig config = DefaultRunConfig();
    const absl::Status s = Overlay(c.text, &config);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.fragment)) << c.text;
  }
}

TEST(OverlayYamlTest, ReportsEveryProblemOnItsOwnLine) {
  RunConfig c = DefaultRunConfig();
  const absl::Status s = Overlay("model:\n  d_model: x\n  num_heads: y\n", &c);
  EXPECT_EQ(std::string(s.message()),
            "t.yaml:2: model.d_model: expected an integer, got \"x\"\n"
            "t.yaml:3: model.num_heads: expected an integer, got \"y\"");
}

// Found with tests/fuzz/spec_fuzz: a key, a value or yaml-cpp's own message quoting a control
// character broke the one-problem-per-line format.
TEST(OverlayYamlTest, ControlCharactersInProblemsAreEscaped) {
  RunConfig c = DefaultRunConfig();
  const absl::Status s = Overlay("model: {\"d_\\nmodel\": 1, \"\\tx\\x01\": 2}\n", &c);
  EXPECT_THAT(std::string(s.message()),
              StartsWith("t.yaml:1: model: unknown key \"d_\\nmodel\" (did you mean \"d_model\"?)\n"
                         "t.yaml:1: model: unknown key \"\\tx\\x01\"; known keys: vocab_size,"));
  EXPECT_EQ(std::string(s.message()).find('\t'), std::string::npos);
  const absl::StatusOr<YAML::Node> n = ParseYaml("sweep: \"bad\\\x01\"\n", "t.yaml");
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(std::string(n.status().message()).find('\n'), std::string::npos) << n.status();
  EXPECT_THAT(std::string(n.status().message()),
              HasSubstr("t.yaml:1: unknown escape character: \\x01"));
}

TEST(OverlayYamlTest, SyntaxErrorsHaveALine) {
  const absl::StatusOr<YAML::Node> n = ParseYaml("model:\n  d_model: [1, 2\n", "t.yaml");
  ASSERT_FALSE(n.ok());
  EXPECT_THAT(std::string(n.status().message()), HasSubstr("t.yaml:"));
}

TEST(OverlayYamlAtPathTest, SetsADottedField) {
  RunConfig c = DefaultRunConfig();
  ASSERT_TRUE(OverlayYamlAtPath(YAML::Load("8e-3"), "s.yaml", 4, "train.optimizer.lr", &c).ok());
  EXPECT_DOUBLE_EQ(c.train().optimizer().lr(), 8e-3);
  const absl::Status bad = OverlayYamlAtPath(YAML::Load("1"), "s.yaml", 4, "train.optimzer.lr", &c);
  EXPECT_THAT(std::string(bad.message()), HasSubstr("s.yaml:4: train.optimzer.lr: unknown key "
                                                    "\"optimzer\" (did you mean \"optimizer\"?)"));
  const absl::Status deep = OverlayYamlAtPath(YAML::Load("1"), "s.yaml", 4, "train.steps.x", &c);
  EXPECT_THAT(std::string(deep.message()), HasSubstr("train.steps has no fields below it"));
}

TEST(LoadRunConfigTest, OverlaysDefaultsAndValidatesAtTheRightLine) {
  absl::StatusOr<RunConfig> ok = LoadRunConfigText("model: {d_model: 64}\n", "r.yaml");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->model().d_model(), 64);
  EXPECT_EQ(ok->train().steps(), DefaultTrainConfig().steps());

  const absl::StatusOr<RunConfig> bad = LoadRunConfigText(
      "model:\n  gate:\n    position: G5\n    granularity: HEADWISE\ntrain:\n  seq_len: 999\n",
      "r.yaml");
  ASSERT_FALSE(bad.ok());
  const std::string msg(bad.status().message());
  EXPECT_THAT(msg, HasSubstr("r.yaml:4: model.gate.granularity: HEADWISE is not allowed at G5"));
  EXPECT_THAT(msg, HasSubstr("r.yaml:6: train.seq_len: 999 exceeds model.max_seq_len"));

  const absl::StatusOr<RunConfig> top = LoadRunConfigText("modle: {}\n", "r.yaml");
  EXPECT_THAT(std::string(top.status().message()),
              HasSubstr("r.yaml:1: unknown key \"modle\" (did you mean \"model\"?)"));
}

TEST(LoadRunConfigTest, UnreadableFileNamesThePath) {
  const absl::StatusOr<RunConfig> r = LoadRunConfigFile("/nonexistent/run.yaml");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("/nonexistent/run.yaml"));
  const absl::StatusOr<RunConfig> dir = LoadRunConfigFile("/tmp");
  EXPECT_EQ(dir.status().code(), absl::StatusCode::kNotFound);
}

TEST(LoadRunConfigTest, ReadsAFile) {
  const std::string path = ::testing::TempDir() + "/proto_yaml_test_run.json";
  {
    std::ofstream out(path);
    out << R"({"model": {"gate": {"position": "GATE_G1"}}, "train": {"steps": 10}})";
  }
  absl::StatusOr<RunConfig> r = LoadRunConfigFile(path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->model().gate().position(), GATE_G1);
  EXPECT_EQ(r->train().steps(), 10);
  std::remove(path.c_str());
}

TEST(CanonicalJsonTest, PrintsEveryFieldAndRoundTripsThroughTheLoader) {
  // Every preset variant: canonical JSON read back gives the same message and the same JSON.
  for (const VariantCase& v : AllVariantCases()) {
    RunConfig c = DefaultRunConfig();
    *c.mutable_model() = v.config;
    const std::string json = CanonicalJson(c);
    EXPECT_NE(json.find("\"shared_reduce\":\"GATE_AVERAGE_SCORES\""), std::string::npos) << json;
    EXPECT_NE(json.find("\"output_clamp\":"), std::string::npos) << json;
    RunConfig back = DefaultRunConfig();
    const absl::Status s = Overlay(json, &back);
    ASSERT_TRUE(s.ok()) << v.name << ": " << s;
    EXPECT_EQ(CanonicalJson(back), json) << v.name;
  }
}

TEST(CanonicalJsonTest, AbsentAndEmptySubmessagesPrintTheSame) {
  ModelConfig a;
  ModelConfig b;
  b.mutable_moe();
  b.mutable_gate();
  EXPECT_EQ(CanonicalJson(a), CanonicalJson(b));
  EXPECT_NE(CanonicalJson(a).find("\"moe\":{"), std::string::npos);
}

// What standalone runs write (metrics.jsonl, summary.json): numbers as numbers, nothing unset
// shown as a zero.
TEST(PlainJsonTest, IntegersAreNumbersAndWhatIsNotSetIsNull) {
  RunSummary summary;
  summary.set_state(DIVERGED);
  summary.set_steps_done(int64_t{1} << 40);
  summary.set_final_train_loss(std::numeric_limits<double>::quiet_NaN());
  summary.set_spike_score(0.25);
  const std::string json = PlainJson(summary);
  EXPECT_THAT(json, StartsWith("{\"state\":\"DIVERGED\",\"reason\":\"\",\"steps_done\":1099511627776,"));
  EXPECT_THAT(json, HasSubstr("\"final_train_loss\":null,\"final_eval\":null,"));
  EXPECT_THAT(json, HasSubstr("\"spike_score\":0.25,"));
  summary.mutable_final_eval()->set_step(20);
  summary.mutable_final_eval()->set_val_loss(2.5);
  EXPECT_THAT(PlainJson(summary), HasSubstr("\"final_eval\":{\"step\":20,\"val_loss\":2.5,"));
  summary.mutable_final_eval()->mutable_probes()->set_m_act(3);
  EXPECT_THAT(PlainJson(summary), HasSubstr("\"gate_score_mean\":null,"));  // no gate
  summary.mutable_final_eval()->mutable_probes()->set_gate_score_mean(0);
  EXPECT_THAT(PlainJson(summary), HasSubstr("\"gate_score_mean\":0"));
}

}  // namespace
}  // namespace ablate
