// train.evals (config/eval_config.h): every bad setting refused by name, the metric names in
// order, the limit of 64 metrics, duplicate names, the ids the tasks draw from and chance levels.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "config/eval_config.h"
#include "config/model_config.h"
#include "config/program_config.h"

namespace ablate {
namespace {

// The default run (byte-level text, vocab 256, max_seq_len 256) with `tasks` as its evals.
RunConfig WithEvals(const std::vector<EvalTask>& tasks) {
  RunConfig c = DefaultRunConfig();
  for (const EvalTask& t : tasks) *c.mutable_train()->add_evals() = t;
  return c;
}

EvalTask PositionLoss(std::vector<int> bins) {
  EvalTask t;
  t.set_task("position_loss");
  for (int b : bins) t.add_bins(b);
  return t;
}
EvalTask Lengths(const std::string& task, std::vector<int> lengths) {
  EvalTask t;
  t.set_task(task);
  for (int l : lengths) t.add_lengths(l);
  return t;
}
EvalTask Mqar(int pairs, int queries) {
  EvalTask t;
  t.set_task("mqar");
  t.set_pairs(pairs);
  t.set_queries(queries);
  return t;
}

// The message of ValidateEvalTasks for `c`, "" when it passes.
std::string Problems(const RunConfig& c) {
  const absl::Status s = ValidateEvalTasks(c);
  EXPECT_TRUE(s.ok() || s.code() == absl::StatusCode::kInvalidArgument) << s;
  return std::string(s.message());
}

#define EXPECT_REFUSED(config, text)                        \
  do {                                                      \
    const std::string message = Problems(config);           \
    EXPECT_NE(message.find(text), std::string::npos)        \
        << "expected \"" << (text) << "\" in: " << message; \
  } while (0)

TEST(EvalConfigTest, TheIssueExampleIsValidAndNamesItsMetricsInOrder) {
  EvalTask passkey = Lengths("passkey", {128, 256});
  passkey.add_depths(0.1);
  passkey.add_depths(0.9);
  passkey.set_samples(64);
  const RunConfig c = WithEvals(
      {PositionLoss({0, 64, 128, 256}), passkey, Lengths("copying", {64, 127}), Mqar(16, 16)});
  EXPECT_EQ(Problems(c), "");
  EXPECT_EQ(EvalMetricNames(c),
            (std::vector<std::string>{
                "position_loss@0-64", "position_loss@64-128", "position_loss@128-256",
                "passkey@128", "passkey_exact@128", "passkey@256", "passkey_exact@256",
                "copying@64", "copying_acc@64", "copying@127", "copying_acc@127", "mqar@16"}));
  EXPECT_TRUE(ValidateEvalTasks(DefaultRunConfig()).ok());
  EXPECT_TRUE(EvalMetricNames(DefaultRunConfig()).empty());
}

TEST(EvalConfigTest, YarnAddsTheYarnBinsAfterThePlainOnes) {
  RunConfig c = WithEvals({PositionLoss({0, 128, 256})});
  c.mutable_model()->mutable_yarn()->set_factor(2);
  c.mutable_model()->mutable_yarn()->set_original_seq_len(128);
  EXPECT_EQ(EvalMetricNames(c),
            (std::vector<std::string>{"position_loss@0-128", "position_loss@128-256",
                                      "position_loss_yarn@0-128", "position_loss_yarn@128-256"}));
}

TEST(EvalConfigTest, DefaultsFillInTheProtoComments) {
  EvalTask t;
  EXPECT_EQ(EvalSamples(t), 16);
  EXPECT_EQ(PasskeyDepths(t), std::vector<double>{0.5});
  EXPECT_EQ(PasskeyDigits(t), 5);
  EXPECT_EQ(MqarPairs(t), 8);
  EXPECT_EQ(MqarQueries(t), 8);
  t.set_pairs(4);  // fewer pairs than the default queries: every key queried, not an error
  EXPECT_EQ(MqarQueries(t), 4);
  EXPECT_EQ(Problems(WithEvals({Mqar(4, 0)})), "");
}

TEST(EvalConfigTest, UnknownAndMissingTasksListTheKnownOnes) {
  EvalTask t;
  t.set_task("mmlu");
  EXPECT_REFUSED(WithEvals({t}),
                 "train.evals[0].task: unknown task \"mmlu\"; the tasks are "
                 "position_loss, passkey, copying, mqar");
  EXPECT_REFUSED(WithEvals({PositionLoss({0, 64}), EvalTask()}),
                 "train.evals[1].task: required: one of position_loss");
}

TEST(EvalConfigTest, FieldsATaskDoesNotReadAreRefusedByName) {
  EvalTask t = PositionLoss({0, 64});
  t.add_lengths(64);
  t.set_seed(3);
  const std::string message = Problems(WithEvals({t}));
  EXPECT_NE(message.find("train.evals[0].lengths: position_loss does not read it (it reads bins, "
                         "samples)"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("train.evals[0].seed: position_loss does not read it"), std::string::npos)
      << message;
  EvalTask copying = Lengths("copying", {16});
  copying.add_depths(0.5);
  EXPECT_REFUSED(WithEvals({copying}), "train.evals[0].depths: copying does not read it");
  EvalTask mqar = Mqar(4, 4);
  mqar.set_key_digits(3);
  EXPECT_REFUSED(WithEvals({mqar}), "train.evals[0].key_digits: mqar does not read it");
  EvalTask passkey = Lengths("passkey", {256});
  passkey.add_bins(0);
  EXPECT_REFUSED(WithEvals({passkey}), "train.evals[0].bins: passkey does not read it");
}

TEST(EvalConfigTest, BinsIncreaseFromZeroOrMoreAndFitTheModel) {
  EXPECT_REFUSED(WithEvals({PositionLoss({64})}),
                 "train.evals[0].bins: position_loss needs at least two edges (one bin), got 1");
  EXPECT_REFUSED(WithEvals({PositionLoss({-1, 64})}),
                 "train.evals[0].bins[0]: must be >= 0, got -1");
  EXPECT_REFUSED(WithEvals({PositionLoss({0, 64, 64})}),
                 "train.evals[0].bins[2]: must be greater than bins[1] (64)");
  EXPECT_REFUSED(WithEvals({PositionLoss({0, 128, 64})}),
                 "train.evals[0].bins[2]: must be greater than bins[1] (128)");
  EXPECT_REFUSED(WithEvals({PositionLoss({0, 128, 512})}),
                 "train.evals[0].bins[2]: the windows are as long as the last edge, 512 tokens, "
                 "which must fit model.max_seq_len 256");
  EXPECT_EQ(Problems(WithEvals({PositionLoss({16, 256})})), "");
}

TEST(EvalConfigTest, SamplesAreDefaultOrOneTo4096) {
  for (int bad : {-1, 4097}) {
    EvalTask t = PositionLoss({0, 64});
    t.set_samples(bad);
    EXPECT_REFUSED(WithEvals({t}), "train.evals[0].samples: must be 1 to 4096 (0: the default 16)");
  }
  EvalTask t = Lengths("copying", {16});
  t.set_samples(4096);
  EXPECT_EQ(Problems(WithEvals({t})), "");
}

TEST(EvalConfigTest, CopyingLengthsArePositiveOnceAndFitTwice) {
  EXPECT_REFUSED(WithEvals({Lengths("copying", {})}),
                 "train.evals[0].lengths: copying needs at least one length");
  EXPECT_REFUSED(WithEvals({Lengths("copying", {0})}),
                 "train.evals[0].lengths[0]: must be > 0, got 0");
  EXPECT_REFUSED(WithEvals({Lengths("copying", {1})}), "train.evals[0].lengths[0]: must be >= 2");
  EXPECT_REFUSED(WithEvals({Lengths("copying", {16, 16})}),
                 "train.evals[0].lengths[1]: 16 is listed twice");
  EXPECT_EQ(Problems(WithEvals({Lengths("copying", {128})})), "");  // 2 x 128 = 256
  EXPECT_REFUSED(
      WithEvals({Lengths("copying", {129})}),
      "train.evals[0].lengths[0]: a copying sequence is the string twice, 258 tokens for "
      "strings of 129, which must fit model.max_seq_len 256");
  RunConfig bos = WithEvals({Lengths("copying", {128})});
  bos.mutable_model()->set_vocab_size(258);
  bos.mutable_train()->mutable_data()->set_bos_token(257);
  EXPECT_REFUSED(bos,
                 "a copying sequence is BOS + the string twice, 257 tokens for strings of 128");
}

TEST(EvalConfigTest, PasskeyLengthsHoldTheTextsAndFitTheModel) {
  // [BOS] + "\nThe pass key is K. Remember it. K is the pass key.\n" + the question + K.
  EXPECT_EQ(PasskeyFixedTokens(5, false), 50 + 2 * 5 + 39 + 5);
  EXPECT_EQ(PasskeyFixedTokens(5, true), 1 + 50 + 2 * 5 + 39 + 5);
  EXPECT_EQ(PasskeyKeySentence("71432"),
            "\nThe pass key is 71432. Remember it. 71432 is the pass key.\n");
  EXPECT_EQ(PasskeyQuestion(), "\nWhat is the pass key? The pass key is ");

  EXPECT_EQ(Problems(WithEvals({Lengths("passkey", {104, 256})})), "");
  EXPECT_REFUSED(WithEvals({Lengths("passkey", {103})}),
                 "train.evals[0].lengths[0]: 103 tokens cannot hold the key sentence, the question "
                 "and a 5-digit key: they take 104 tokens");
  EXPECT_REFUSED(WithEvals({Lengths("passkey", {257})}),
                 "train.evals[0].lengths[0]: a passkey sequence is exactly its length, 257 tokens, "
                 "which must fit model.max_seq_len 256");
  EXPECT_REFUSED(WithEvals({Lengths("passkey", {-5})}), "train.evals[0].lengths[0]: must be > 0");
  EXPECT_REFUSED(WithEvals({Lengths("passkey", {})}),
                 "train.evals[0].lengths: passkey needs at least one length");
}

// multikey: `pairs` named keys (2 to 64, default 4), each sentence naming its key.
TEST(EvalConfigTest, MultikeyHoldsItsKeysAndNamesItsMetrics) {
  EXPECT_EQ(MultikeySentence("qxzvbn", "71432"),
            "\nThe pass key of qxzvbn is 71432. Remember it. 71432 is the pass key of qxzvbn.\n");
  EXPECT_EQ(MultikeyQuestion("qxzvbn"),
            "\nWhat is the pass key of qxzvbn? The pass key of qxzvbn is ");
  // 4 sentences of 80 bytes, the question's 59 and the key's 5.
  EXPECT_EQ(MultikeyFixedTokens(5, 4, false), 4 * 80 + 59 + 5);
  RunConfig c = WithEvals({Lengths("multikey", {512})});
  c.mutable_model()->set_max_seq_len(512);
  EXPECT_EQ(Problems(c), "");
  EXPECT_EQ(EvalMetricNames(c), (std::vector<std::string>{"multikey@512", "multikey_exact@512"}));
  EXPECT_DOUBLE_EQ(*EvalChanceLevel("multikey@512", c), 0.1);
  EXPECT_REFUSED(WithEvals({Lengths("multikey", {256})}),
                 "train.evals[0].lengths[0]: 256 tokens cannot hold 4 key sentences, the question "
                 "and a 5-digit key: they take 384 tokens");
  EvalTask one = Lengths("multikey", {512});
  one.set_pairs(1);
  c.mutable_train()->clear_evals();
  *c.mutable_train()->add_evals() = one;
  EXPECT_REFUSED(c, "train.evals[0].pairs: multikey hides 2 to 64 keys (0: the default 4), got 1");
}

TEST(EvalConfigTest, PasskeyDepthsAndDigitsAreInRange) {
  for (double bad : {-0.1, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
    EvalTask t = Lengths("passkey", {256});
    t.add_depths(0.5);
    t.add_depths(bad);
    EXPECT_REFUSED(WithEvals({t}), "train.evals[0].depths[1]: must be in [0, 1]");
  }
  for (int bad : {-1, 21}) {
    EvalTask t = Lengths("passkey", {256});
    t.set_key_digits(bad);
    EXPECT_REFUSED(WithEvals({t}), "train.evals[0].key_digits: must be 1 to 20 (0: the default 5)");
  }
  EvalTask t = Lengths("passkey", {256});
  t.set_key_digits(20);
  t.add_depths(0);
  t.add_depths(1);
  EXPECT_EQ(Problems(WithEvals({t})), "");
  // 20-digit keys take 50 + 40 + 39 + 20 tokens.
  t.set_key_digits(20);
  t.set_lengths(0, 148);
  EXPECT_REFUSED(WithEvals({t}), "and a 20-digit key: they take 149 tokens");
}

TEST(EvalConfigTest, PasskeyNeedsAByteLevelVocabulary) {
  RunConfig small = WithEvals({Lengths("passkey", {128})});
  small.mutable_model()->set_vocab_size(128);
  EXPECT_REFUSED(small, "train.evals[0].task: passkey needs byte-level data");
  RunConfig bin = WithEvals({Lengths("passkey", {128})});
  bin.mutable_model()->set_vocab_size(50304);
  bin.mutable_train()->mutable_data()->set_format(DATA_NANOGPT_BIN);
  EXPECT_REFUSED(bin, "train.data.format DATA_NANOGPT_BIN");
}

TEST(EvalConfigTest, MqarQueriesPairsLengthAndVocabulary) {
  EXPECT_REFUSED(WithEvals({Mqar(4, 5)}),
                 "train.evals[0].queries: 5 queries of 4 pairs: each key is queried at most once");
  EXPECT_REFUSED(WithEvals({Mqar(-1, 0)}), "train.evals[0].pairs: must be >= 0");
  EXPECT_REFUSED(WithEvals({Mqar(4, -2)}), "train.evals[0].queries: must be >= 0");
  EXPECT_EQ(Problems(WithEvals({Mqar(64, 64)})), "");  // 4 x 64 = 256 tokens, 128 ids
  EXPECT_REFUSED(WithEvals({Mqar(64, 65)}), "queries");
  RunConfig small = WithEvals({Mqar(40, 8)});
  small.mutable_model()->set_vocab_size(64);
  small.mutable_train()->mutable_data()->set_format(DATA_NANOGPT_BIN);
  EXPECT_REFUSED(small,
                 "train.evals[0].pairs: 40 distinct keys (the lower half of the usable ids) "
                 "and 40 distinct values (the upper half) need 80 usable ids; "
                 "model.vocab_size 64 less BOS and EOD leaves 64");
  small.mutable_train()->mutable_evals(0)->set_pairs(31);
  small.mutable_train()->mutable_data()->set_eod_token(0);
  small.mutable_train()->mutable_data()->set_bos_token(1);
  EXPECT_EQ(Problems(small), "");  // 62 usable ids: 31 keys, 31 values
  small.mutable_train()->mutable_evals(0)->set_pairs(32);
  EXPECT_REFUSED(small, "need 64 usable ids; model.vocab_size 64 less BOS and EOD leaves 62");
}

TEST(EvalConfigTest, AnMqarSequenceThatFitsExactlyPasses) {
  EXPECT_EQ(Problems(WithEvals({Mqar(100, 28)})), "");  // 200 + 56 = 256
  EXPECT_REFUSED(WithEvals({Mqar(100, 29)}),
                 "train.evals[0].pairs: an mqar sequence is 2 x 100 pairs + 2 x 29 queries = 258 "
                 "tokens, which must fit model.max_seq_len 256");
}

TEST(EvalConfigTest, MoreThan64MetricsAreRefusedWithTheirCount) {
  std::vector<int> edges;
  for (int e = 0; e <= 65; ++e) edges.push_back(e);  // 65 bins
  EXPECT_REFUSED(WithEvals({PositionLoss(edges)}),
                 "train.evals: the tasks produce 65 metrics; an evaluation stores at most 64");
  edges.pop_back();  // 64 bins
  EXPECT_EQ(Problems(WithEvals({PositionLoss(edges)})), "");
  EXPECT_EQ(static_cast<int>(EvalMetricNames(WithEvals({PositionLoss(edges)})).size()),
            kMaxEvalMetrics);
  // With YaRN each bin is two metrics.
  RunConfig yarn = WithEvals({PositionLoss(edges)});
  yarn.mutable_model()->mutable_yarn()->set_factor(2);
  yarn.mutable_model()->mutable_yarn()->set_original_seq_len(128);
  EXPECT_REFUSED(yarn, "the tasks produce 128 metrics");
}

TEST(EvalConfigTest, TwoTasksProducingOneNameAreRefused) {
  EXPECT_REFUSED(WithEvals({Lengths("copying", {16, 64}), Lengths("copying", {64})}),
                 "train.evals[1]: produces the metric copying@64, as train.evals[0] does");
  EXPECT_REFUSED(WithEvals({Mqar(8, 8), Mqar(8, 4)}),
                 "train.evals[1]: produces the metric mqar@8, as train.evals[0] does");
  EXPECT_EQ(Problems(WithEvals({PositionLoss({0, 64}), PositionLoss({64, 128})})), "");
  EXPECT_REFUSED(WithEvals({PositionLoss({0, 64}), PositionLoss({0, 64, 128})}),
                 "produces the metric position_loss@0-64");
}

TEST(EvalConfigTest, ErrorsAreJoinedAndNameEachTask) {
  const std::string message =
      Problems(WithEvals({PositionLoss({0, 64}), Lengths("copying", {0}), Mqar(4, 5)}));
  EXPECT_EQ(message,
            "train.evals[1].lengths[0]: must be > 0, got 0; train.evals[2].queries: 5 queries of 4 "
            "pairs: each key is queried at most once, so queries <= pairs");
}

TEST(EvalConfigTest, TokenIdSetsSkipTheSpecialIds) {
  TokenIdSet s{10, 20, {12, 15}};
  EXPECT_EQ(s.size(), 8);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < s.size(); ++i) ids.push_back(s.at(i));
  EXPECT_EQ(ids, (std::vector<int64_t>{10, 11, 13, 14, 16, 17, 18, 19}));

  RunConfig c = DefaultRunConfig();  // text: printable ASCII for copying, bytes for mqar
  EXPECT_EQ(CopyingTokenIds(c).size(), 95);
  EXPECT_EQ(CopyingTokenIds(c).at(0), 32);
  EXPECT_EQ(MqarKeyIds(c).size(), 128);
  EXPECT_EQ(MqarValueIds(c).size(), 128);
  EXPECT_EQ(MqarValueIds(c).at(0), 128);

  // A prepared directory of bytes: EOD 256 and BOS 257 after the bytes.
  c.mutable_model()->set_vocab_size(258);
  c.mutable_train()->mutable_data()->set_eod_token(256);
  c.mutable_train()->mutable_data()->set_bos_token(257);
  EXPECT_EQ(UsableTokenIds(c).size(), 256);
  EXPECT_EQ(CopyingTokenIds(c).size(), 95);
  EXPECT_EQ(MqarKeyIds(c).size(), 128);
  EXPECT_EQ(MqarValueIds(c).at(127), 255);

  // A special id inside the range: skipped by every set.
  c.mutable_model()->set_vocab_size(1000);
  c.mutable_train()->mutable_data()->set_format(DATA_NANOGPT_BIN);
  c.mutable_train()->mutable_data()->set_eod_token(0);
  c.mutable_train()->mutable_data()->set_bos_token(600);
  EXPECT_EQ(CopyingTokenIds(c).size(), 998);  // not byte-level: every usable id
  const TokenIdSet keys = MqarKeyIds(c), values = MqarValueIds(c);
  EXPECT_EQ(keys.size(), 499);
  EXPECT_EQ(values.size(), 499);
  EXPECT_EQ(keys.at(0), 1);
  EXPECT_EQ(keys.at(498), 499);
  EXPECT_EQ(values.at(0), 500);
  EXPECT_EQ(values.at(100), 601);
  EXPECT_EQ(values.at(498), 999);
}

TEST(EvalConfigTest, ChanceLevels) {
  EvalTask passkey = Lengths("passkey", {128});
  passkey.set_key_digits(3);
  const RunConfig c =
      WithEvals({PositionLoss({0, 64}), Lengths("copying", {16}), passkey, Mqar(8, 8)});
  const double ln_v = std::log(256.0);
  EXPECT_DOUBLE_EQ(*EvalChanceLevel("position_loss@0-64", c), ln_v);
  EXPECT_DOUBLE_EQ(*EvalChanceLevel("copying@16", c), ln_v);
  EXPECT_DOUBLE_EQ(*EvalChanceLevel("copying_acc@16", c), 1.0 / 95);
  EXPECT_DOUBLE_EQ(*EvalChanceLevel("passkey@128", c), 0.1);
  EXPECT_DOUBLE_EQ(*EvalChanceLevel("passkey_exact@128", c), 1.0 / 900);
  EXPECT_DOUBLE_EQ(*EvalChanceLevel("mqar@8", c), 1.0 / 128);
  EXPECT_FALSE(EvalChanceLevel("mqar@16", c).has_value());
  EXPECT_FALSE(EvalChanceLevel("val_loss", c).has_value());
}

}  // namespace
}  // namespace ablate
