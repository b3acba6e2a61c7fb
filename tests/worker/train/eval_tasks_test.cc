// The tasks of train.evals (worker/train/eval_tasks.h) on models whose answers are known: oracles
// that copy perfectly score 1 (and a loss near 0), a uniform model scores ln V and 1/V, a random
// guesser among mqar's values scores its chance level within a binomial interval, and
// position_loss averages the positions of each bin. Then the items themselves, their
// determinism, the data checks, and a real TransformerImpl through Evaluate and the trainer.
#include "worker/train/eval_tasks.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/token_files.h"
#include "config/choice_task.h"
#include "config/eval_config.h"
#include "config/model_config.h"
#include "tests/worker/corpus_fixture.h"
#include "tests/worker/tiny_run_config.h"
#include "worker/model/transformer.h"
#include "worker/train/data.h"
#include "worker/train/evaluation.h"
#include "worker/train/trainer.h"

namespace ablate {
namespace {

namespace fs = std::filesystem;
using Metrics = std::map<std::string, double>;

// The logit an oracle gives the token it is sure of (the others 0): its loss, ln(1 + (V-1)
// e^-100), is 0 in float.
constexpr float kSure = 100;

// Logits (B, T, V): 0, and kSure on next[b][t] where it is >= 0.
torch::Tensor Sure(const std::vector<std::vector<int64_t>>& next, int64_t vocab) {
  const int64_t rows = static_cast<int64_t>(next.size());
  const int64_t len = static_cast<int64_t>(next[0].size());
  torch::Tensor logits = torch::zeros({rows, len, vocab});
  auto l = logits.accessor<float, 3>();
  for (int64_t b = 0; b < rows; ++b) {
    for (int64_t t = 0; t < len; ++t) {
      if (next[b][t] >= 0) l[b][t][next[b][t]] = kSure;
    }
  }
  return logits;
}

std::vector<std::vector<int64_t>> Rows(const torch::Tensor& tokens) {
  std::vector<std::vector<int64_t>> rows;
  auto t = tokens.accessor<int64_t, 2>();
  for (int64_t b = 0; b < tokens.size(0); ++b) {
    rows.emplace_back();
    for (int64_t i = 0; i < tokens.size(1); ++i) rows.back().push_back(t[b][i]);
  }
  return rows;
}

// A copier of a string repeated once: at position t it is sure of the token L positions before
// t + 1, for a sequence of [BOS] + 2L tokens.
LogitsFn Copier(int64_t vocab, int64_t bos) {
  return [=](const torch::Tensor& tokens, bool) {
    const std::vector<std::vector<int64_t>> rows = Rows(tokens);
    const int64_t len = (tokens.size(1) - bos) / 2;
    std::vector<std::vector<int64_t>> next(rows.size(), std::vector<int64_t>(rows[0].size(), -1));
    for (size_t b = 0; b < rows.size(); ++b) {
      for (int64_t t = bos + len - 1; t + 1 < tokens.size(1); ++t)
        next[b][t] = rows[b][t + 1 - len];
    }
    return Sure(next, vocab);
  };
}

// An induction oracle: at position t it finds the earlier position whose preceding tokens match
// the longest suffix of tokens[..t] (the latest on a tie), and is sure of the token that followed
// it; uniform where no token matched. It answers the pass key (the question ends as the key
// sentence begins: "The pass key is ") and mqar (a queried key was followed by its value).
LogitsFn Induction(int64_t vocab) {
  return [=](const torch::Tensor& tokens, bool) {
    const std::vector<std::vector<int64_t>> rows = Rows(tokens);
    const size_t len = rows[0].size();
    std::vector<std::vector<int64_t>> next(rows.size(), std::vector<int64_t>(len, -1));
    for (size_t b = 0; b < rows.size(); ++b) {
      const std::vector<int64_t>& x = rows[b];
      std::vector<int> match(len, 0), previous(len, 0);  // match[u]: suffix length ending at (t, u)
      for (size_t t = 0; t < len; ++t) {
        int best = 0;
        for (size_t u = 0; u < t; ++u) {
          match[u] = x[t] == x[u] ? (u > 0 ? previous[u - 1] : 0) + 1 : 0;
          if (match[u] > 0 && match[u] >= best) {
            best = match[u];
            next[b][t] = x[u + 1];
          }
        }
        match[t] = 0;
        previous = match;
      }
    }
    return Sure(next, vocab);
  };
}

// Flat logits: a model that knows nothing.
LogitsFn Uniform(int64_t vocab) {
  return [=](const torch::Tensor& tokens, bool) {
    return torch::zeros({tokens.size(0), tokens.size(1), vocab});
  };
}

// Wraps `model`, keeping a copy of every batch of tokens it is given, and each call's yarn flag.
struct Recording {
  std::vector<torch::Tensor> batches;
  std::vector<bool> yarn;
  LogitsFn Wrap(LogitsFn model) {
    return [this, model](const torch::Tensor& tokens, bool y) {
      batches.push_back(tokens.clone());
      yarn.push_back(y);
      return model(tokens, y);
    };
  }
  // Every row seen, in order.
  std::vector<std::vector<int64_t>> AllRows() const {
    std::vector<std::vector<int64_t>> all;
    for (const torch::Tensor& b : batches) {
      for (auto& r : Rows(b)) all.push_back(std::move(r));
    }
    return all;
  }
};

std::string Text(const std::vector<int64_t>& ids, size_t from, size_t to) {
  std::string s;
  for (size_t i = from; i < to; ++i) s += static_cast<char>(ids[i]);
  return s;
}

EvalTask Task(const std::string& name) {
  EvalTask t;
  t.set_task(name);
  return t;
}

// A test over both layouts of a sequence: without a BOS (byte-level text, vocabulary 256) and
// with one (vocabulary 258, BOS 257, as a prepared directory of bytes has it).
class EvalTasksTest : public testing::CorpusTest, public ::testing::WithParamInterface<bool> {
 protected:
  // 2000 lines of about 55 bytes: 5,600 validation tokens.
  EvalTasksTest() : CorpusTest("ablate_eval_tasks_test", kWordLine, 2000) {}

  bool bos() const { return GetParam(); }
  int64_t vocab() const { return bos() ? 258 : 256; }

  // The tiny run of the trainer's tests, with room for 256-token sequences, and `tasks`.
  RunConfig Config(const std::vector<EvalTask>& tasks) const {
    RunConfig c = testing::TinyRunConfig(corpus_path(), 2);
    c.mutable_model()->set_max_seq_len(256);
    c.mutable_model()->set_vocab_size(vocab());
    if (bos()) c.mutable_train()->mutable_data()->set_bos_token(257);
    c.mutable_train()->set_batch_size(8);
    for (const EvalTask& t : tasks) *c.mutable_train()->add_evals() = t;
    return c;
  }
  TokenData Load(const RunConfig& c) const {
    absl::StatusOr<TokenData> data =
        TokenData::Load(c.train().data(), c.model().vocab_size(), c.train().seq_len());
    EXPECT_TRUE(data.ok()) << data.status();
    return *std::move(data);
  }
  Metrics Run(const LogitsFn& model, const RunConfig& c) {
    absl::StatusOr<EvalTaskResults> r = RunEvalTasks(model, Load(c), c, torch::kCPU);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return {};
    const Metrics& m = r->metrics;
    EXPECT_EQ(m.size(), EvalMetricNames(c).size());
    for (const std::string& name : EvalMetricNames(c)) EXPECT_EQ(m.count(name), 1u) << name;
    // Every accuracy (and log-probability) has its items, whose mean is the metric; the losses
    // have none.
    for (const std::string& name : EvalMetricNames(c)) {
      const bool accuracy = EvalMetricHigherIsBetter(name, c).value_or(false);
      EXPECT_EQ(r->items.count(name), accuracy ? 1u : 0u) << name;
      if (!accuracy || r->items.count(name) == 0) continue;
      const std::vector<float>& items = r->items.at(name);
      EXPECT_FALSE(items.empty()) << name;
      if (items.empty()) continue;
      double sum = 0;
      for (const float v : items) sum += v;
      EXPECT_NEAR(sum / static_cast<double>(items.size()), m.at(name), 1e-5) << name;
    }
    return m;
  }

  static EvalTask Copying() {
    EvalTask t = Task("copying");
    t.add_lengths(16);
    t.add_lengths(100);
    t.set_samples(8);
    return t;
  }
  static EvalTask Passkey() {
    EvalTask t = Task("passkey");
    t.add_lengths(128);
    t.add_lengths(256);
    for (double d : {0.0, 0.3, 1.0}) t.add_depths(d);
    t.set_samples(4);
    t.set_key_digits(6);
    return t;
  }
  static EvalTask Multikey() {
    EvalTask t = Task("multikey");
    t.add_lengths(512);
    for (double d : {0.0, 0.5, 1.0}) t.add_depths(d);
    t.set_samples(4);
    t.set_pairs(4);
    return t;
  }
  static EvalTask Mqar(int pairs, int queries, int samples) {
    EvalTask t = Task("mqar");
    t.set_pairs(pairs);
    t.set_queries(queries);
    t.set_samples(samples);
    return t;
  }
  static EvalTask PositionLoss(std::vector<int> bins) {
    EvalTask t = Task("position_loss");
    for (int b : bins) t.add_bins(b);
    return t;
  }
};

INSTANTIATE_TEST_SUITE_P(Layouts, EvalTasksTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "Bos" : "NoBos";
                         });

TEST_P(EvalTasksTest, APerfectCopierScoresOneAndLosesNothing) {
  const RunConfig c = Config({Copying()});
  const Metrics m = Run(Copier(vocab(), bos() ? 1 : 0), c);
  for (const int len : {16, 100}) {
    EXPECT_DOUBLE_EQ(m.at("copying_acc@" + std::to_string(len)), 1.0);
    EXPECT_NEAR(m.at("copying@" + std::to_string(len)), 0.0, 1e-6);
  }
}

TEST_P(EvalTasksTest, AnInductionOracleRetrievesEveryPassKeyAndEveryValue) {
  const RunConfig c = Config({Passkey(), Mqar(16, 12, 16)});
  const Metrics m = Run(Induction(vocab()), c);
  for (const char* name :
       {"passkey@128", "passkey_exact@128", "passkey@256", "passkey_exact@256", "mqar@16"}) {
    EXPECT_DOUBLE_EQ(m.at(name), 1.0) << name;
  }
}

// Among four named keys, the induction oracle finds the one the question names (its name ends
// the question as it ends that key's sentence), at every depth; a model that knows nothing is at
// chance.
TEST_P(EvalTasksTest, MultikeyRetrievesTheKeyAskedForAmongOthers) {
  RunConfig c = Config({Multikey()});
  c.mutable_model()->set_max_seq_len(512);  // four key sentences take 384 tokens
  ASSERT_TRUE(ValidateRunConfig(c).ok()) << ValidateRunConfig(c);
  const Metrics m = Run(Induction(vocab()), c);
  EXPECT_DOUBLE_EQ(m.at("multikey@512"), 1.0);
  EXPECT_DOUBLE_EQ(m.at("multikey_exact@512"), 1.0);
  EXPECT_DOUBLE_EQ(*EvalChanceLevel("multikey_exact@512", c), 1.0 / 90000);
  const Metrics flat = Run(Uniform(vocab()), c);
  EXPECT_NEAR(flat.at("multikey@512"), 1.0 / vocab(), 1e-9);
  // Each sequence: four sentences "The pass key of NAME is K.", distinct names, the question
  // naming one of them, whose key ends the sequence.
  Recording rec;
  ASSERT_TRUE(RunEvalTasks(rec.Wrap(Uniform(vocab())), Load(c), c, torch::kCPU).ok());
  const std::vector<std::vector<int64_t>> rows = rec.AllRows();
  ASSERT_EQ(rows.size(), 12u);
  for (const std::vector<int64_t>& row : rows) {
    ASSERT_EQ(row.size(), 512u);
    const std::string text = Text(row, bos() ? 1 : 0, row.size());
    std::set<std::string> names;
    for (size_t at = text.find("The pass key of "); at != std::string::npos;
         at = text.find("The pass key of ", at + 1)) {
      names.insert(text.substr(at + 16, 6));
    }
    const size_t question = text.rfind("\nWhat is the pass key of ");
    ASSERT_NE(question, std::string::npos);
    const std::string asked = text.substr(question + 25, 6);
    // 4 sentences (each names its key twice: "of NAME is", "the pass key of NAME.") + the question.
    EXPECT_EQ(names.size(), 4u) << text;
    const std::string key = text.substr(text.size() - 5);
    EXPECT_NE(text.find("The pass key of " + asked + " is " + key + ". Remember it."),
              std::string::npos)
        << text;
  }
}

// A model that never gets the key right stays at 0 on exact match even when it gets most digits:
// sure of the key but for its last digit.
TEST_P(EvalTasksTest, ExactMatchNeedsEveryDigit) {
  EvalTask passkey = Passkey();
  passkey.clear_lengths();
  passkey.add_lengths(200);
  const RunConfig c = Config({passkey});
  const LogitsFn induction = Induction(vocab());
  const LogitsFn all_but_last = [&](const torch::Tensor& tokens, bool yarn) {
    torch::Tensor logits = induction(tokens, yarn);
    logits.select(1, tokens.size(1) - 2).zero_();  // the last digit's prediction: uniform
    return logits;
  };
  const Metrics m = Run(all_but_last, c);
  EXPECT_DOUBLE_EQ(m.at("passkey_exact@200"), 0.0);
  // 5 of 6 digits sure, the 6th shared by the V tied logits.
  EXPECT_NEAR(m.at("passkey@200"), (5.0 + 1.0 / static_cast<double>(vocab())) / 6.0, 1e-12);
}

TEST_P(EvalTasksTest, AUniformModelLosesLnVAndScoresOneInV) {
  EvalTask position = PositionLoss({0, 64, 256});
  position.set_samples(4);
  const RunConfig c = Config({position, Copying(), Passkey(), Mqar(8, 8, 16)});
  const Metrics m = Run(Uniform(vocab()), c);
  const double ln_v = std::log(static_cast<double>(vocab()));
  for (const char* name :
       {"position_loss@0-64", "position_loss@64-256", "copying@16", "copying@100"}) {
    EXPECT_NEAR(m.at(name), ln_v, 1e-5) << name;
    EXPECT_NEAR(*EvalChanceLevel(name, c), ln_v, 1e-12) << name;
  }
  // Ties are shared: the target is one of V maxima.
  for (const char* name : {"copying_acc@16", "copying_acc@100", "passkey@128", "mqar@8"}) {
    EXPECT_NEAR(m.at(name), 1.0 / static_cast<double>(vocab()), 1e-12) << name;
  }
  // Greedy decoding picks id 0, never a digit.
  EXPECT_DOUBLE_EQ(m.at("passkey_exact@128"), 0.0);
}

// A guesser who knows which ids are values but not which one: mqar's chance level, within four
// binomial standard errors of its 16 x 256 = 4,096 answers (a false alarm about once in 16,000
// seeds; the seeds here are fixed).
TEST_P(EvalTasksTest, ARandomGuesserAmongValuesScoresMqarChance) {
  const RunConfig c = Config({Mqar(16, 16, 256)});
  const TokenIdSet values = MqarValueIds(c);
  torch::manual_seed(7);
  const LogitsFn guesser = [&](const torch::Tensor& tokens, bool) {
    torch::Tensor logits = torch::full({tokens.size(0), tokens.size(1), vocab()}, -1e9);
    for (int64_t i = 0; i < values.size(); ++i) {
      logits.select(2, values.at(i)).copy_(torch::randn({tokens.size(0), tokens.size(1)}));
    }
    return logits;
  };
  const double chance = *EvalChanceLevel("mqar@16", c);
  EXPECT_DOUBLE_EQ(chance, 1.0 / static_cast<double>(values.size()));
  const double n = 16 * 256;
  const double tolerance = 4 * std::sqrt(chance * (1 - chance) / n);
  const Metrics m = Run(guesser, c);
  EXPECT_NEAR(m.at("mqar@16"), chance, tolerance);
}

// Sure of the next token at positions below 64 (it reads it from the input), flat from 64 on,
// and flat everywhere with YaRN: each bin's mean is the share of its positions below 64 times 0
// plus the rest times ln V.
TEST_P(EvalTasksTest, PositionLossAveragesTheTokensOfEachBin) {
  RunConfig c = Config({PositionLoss({0, 32, 48, 80, 128})});
  c.mutable_model()->mutable_yarn()->set_factor(2);
  c.mutable_model()->mutable_yarn()->set_original_seq_len(64);
  const int64_t v = vocab();
  const LogitsFn first_64 = [v](const torch::Tensor& tokens, bool yarn) {
    const std::vector<std::vector<int64_t>> rows = Rows(tokens);
    std::vector<std::vector<int64_t>> next(rows.size(), std::vector<int64_t>(rows[0].size(), -1));
    for (size_t b = 0; b < rows.size() && !yarn; ++b) {
      for (size_t t = 0; t < 64; ++t) next[b][t] = rows[b][t + 1];
    }
    return Sure(next, v);
  };
  Recording rec;
  const Metrics m = Run(rec.Wrap(first_64), c);
  const double ln_v = std::log(static_cast<double>(v));
  EXPECT_NEAR(m.at("position_loss@0-32"), 0.0, 1e-6);
  EXPECT_NEAR(m.at("position_loss@32-48"), 0.0, 1e-6);
  EXPECT_NEAR(m.at("position_loss@48-80"), ln_v / 2, 1e-5);
  EXPECT_NEAR(m.at("position_loss@80-128"), ln_v, 1e-5);
  for (const char* bin : {"0-32", "32-48", "48-80", "80-128"}) {
    EXPECT_NEAR(m.at(std::string("position_loss_yarn@") + bin), ln_v, 1e-5) << bin;
  }
  // 16 windows of 128 in calls of 8, without YaRN then with it, cut back to back from the
  // validation split's start: the windows' texts follow one another.
  ASSERT_EQ(rec.batches.size(), 4u);
  EXPECT_EQ(rec.yarn, (std::vector<bool>{false, false, true, true}));
  EXPECT_TRUE(torch::equal(rec.batches[0], rec.batches[2]));
  const std::vector<std::vector<int64_t>> rows = rec.AllRows();
  const size_t first = bos() ? 1 : 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    EXPECT_EQ(rows[r].size(), 128u);
    if (bos()) {
      EXPECT_EQ(rows[r][0], 257);
    }
  }
  const std::string w0 = Text(rows[0], first, 128), w1 = Text(rows[1], first, 128);
  EXPECT_NE(w0, w1);
}

TEST_P(EvalTasksTest, CopyingStringsArePrintableAndRepeatedOnce) {
  const RunConfig c = Config({Copying()});
  Recording rec;
  Run(rec.Wrap(Uniform(vocab())), c);
  const std::vector<std::vector<int64_t>> rows = rec.AllRows();
  ASSERT_EQ(rows.size(), 16u);  // 8 samples of each length
  const int64_t b = bos() ? 1 : 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    const int64_t len = r < 8 ? 16 : 100;
    ASSERT_EQ(static_cast<int64_t>(rows[r].size()), b + 2 * len);
    if (bos()) {
      EXPECT_EQ(rows[r][0], 257);
    }
    for (int64_t i = 0; i < len; ++i) {
      EXPECT_GE(rows[r][b + i], 32);
      EXPECT_LE(rows[r][b + i], 126);
      EXPECT_EQ(rows[r][b + i], rows[r][b + len + i]);
    }
  }
  EXPECT_NE(rows[0], rows[1]);
}

TEST_P(EvalTasksTest, PasskeySequencesHideTheKeyAtItsDepthAndAskForItLast) {
  const RunConfig c = Config({Passkey()});
  Recording rec;
  Run(rec.Wrap(Uniform(vocab())), c);
  const std::vector<std::vector<int64_t>> rows = rec.AllRows();
  ASSERT_EQ(rows.size(), 2u * 3 * 4);  // lengths x depths x samples, by depth then sample
  const size_t b = bos() ? 1 : 0;
  std::set<std::string> keys;
  for (size_t r = 0; r < rows.size(); ++r) {
    const size_t len = r < 12 ? 128 : 256;
    const double depth = std::vector<double>{0.0, 0.3, 1.0}[(r % 12) / 4];
    ASSERT_EQ(rows[r].size(), len);
    if (bos()) {
      EXPECT_EQ(rows[r][0], 257);
    }
    const std::string text = Text(rows[r], b, len);
    const std::string key = text.substr(text.size() - 6);
    EXPECT_EQ(key.find_first_not_of("0123456789"), std::string::npos) << key;
    EXPECT_NE(key[0], '0');
    keys.insert(key);
    const std::string ending = PasskeyQuestion() + key;
    EXPECT_EQ(text.substr(text.size() - ending.size()), ending);
    const std::string sentence = PasskeyKeySentence(key);
    const size_t filler = len - b - sentence.size() - ending.size();
    EXPECT_EQ(text.find(sentence), static_cast<size_t>(std::floor(depth * filler + 0.5))) << r;
    // The filler is the validation text: lines of the corpus (one whole line in 256 tokens).
    if (len == 256) {
      EXPECT_NE(text.find("the word was"), std::string::npos);
    }
    for (int64_t id : rows[r]) EXPECT_LT(id, bos() ? 258 : 256);
  }
  // One key per sample, shared by its depths; the samples differ.
  EXPECT_EQ(keys.size(), 8u);
  EXPECT_EQ(Text(rows[0], 128 - 6, 128), Text(rows[4], 128 - 6, 128));
}

TEST_P(EvalTasksTest, MqarPairsDistinctKeysAndValuesThenQueriesThem) {
  const RunConfig c = Config({Mqar(16, 12, 8)});
  Recording rec;
  Run(rec.Wrap(Uniform(vocab())), c);
  const std::vector<std::vector<int64_t>> rows = rec.AllRows();
  ASSERT_EQ(rows.size(), 8u);
  const size_t b = bos() ? 1 : 0;
  for (const std::vector<int64_t>& row : rows) {
    ASSERT_EQ(row.size(), b + 2 * 16 + 2 * 12);
    std::map<int64_t, int64_t> value_of;
    std::set<int64_t> values;
    for (size_t i = 0; i < 16; ++i) {
      const int64_t k = row[b + 2 * i], v = row[b + 2 * i + 1];
      EXPECT_GE(k, 0);
      EXPECT_LT(k, 128);  // the lower half of 256 usable ids, with or without BOS 257
      EXPECT_GE(v, 128);  // the upper half: 128..255, and 256 where it is no special id
      EXPECT_LT(v, bos() ? 257 : 256);
      EXPECT_TRUE(value_of.emplace(k, v).second) << "key " << k << " twice";
      EXPECT_TRUE(values.insert(v).second) << "value " << v << " twice";
    }
    std::set<int64_t> queried;
    for (size_t q = 0; q < 12; ++q) {
      const int64_t k = row[b + 32 + 2 * q], v = row[b + 32 + 2 * q + 1];
      ASSERT_EQ(value_of.count(k), 1u);
      EXPECT_EQ(v, value_of[k]);
      EXPECT_TRUE(queried.insert(k).second);
    }
  }
  EXPECT_NE(rows[0], rows[1]);
}

TEST_P(EvalTasksTest, ItemsArePureFunctionsOfTheSeedAndTheSetting) {
  RunConfig c = Config({Copying(), Passkey(), Mqar(8, 8, 4)});
  Recording first, again;
  const Metrics m1 = Run(first.Wrap(Induction(vocab())), c);
  const Metrics m2 = Run(again.Wrap(Induction(vocab())), c);
  EXPECT_EQ(m1, m2);
  EXPECT_EQ(first.AllRows(), again.AllRows());

  RunConfig seeded = c;
  for (EvalTask& t : *seeded.mutable_train()->mutable_evals()) t.set_seed(99);
  Recording other;
  Run(other.Wrap(Uniform(vocab())), seeded);
  const auto a = first.AllRows(), o = other.AllRows();
  ASSERT_EQ(a.size(), o.size());
  for (size_t r = 0; r < a.size(); ++r) EXPECT_NE(a[r], o[r]) << r;

  // Another length added to copying leaves the strings of the first as they were.
  RunConfig more = c;
  more.mutable_train()->mutable_evals(0)->add_lengths(32);
  Recording added;
  Run(added.Wrap(Uniform(vocab())), more);
  const auto with = added.AllRows();
  for (size_t r = 0; r < 8; ++r) EXPECT_EQ(with[r], a[r]) << r;
}

// The whole path through the real model: a tiny TransformerImpl evaluated by Evaluate reports
// every metric the config names, finite, the losses near ln V (an untrained model is close to
// uniform).
TEST_P(EvalTasksTest, EvaluateRunsEveryTaskOnATransformer) {
  EvalTask position = PositionLoss({0, 64, 128, 256});
  position.set_samples(4);
  EvalTask passkey = Passkey();
  passkey.set_samples(2);
  RunConfig c = Config({position, Copying(), passkey, Mqar(8, 8, 8)});
  c.mutable_model()->mutable_yarn()->set_factor(2);
  c.mutable_model()->mutable_yarn()->set_original_seq_len(128);
  ASSERT_TRUE(ValidateRunConfig(c).ok()) << ValidateRunConfig(c);
  torch::manual_seed(1);
  Transformer model(c.model());
  const TokenData data = Load(c);
  absl::StatusOr<EvalResult> r = Evaluate(*model, data, c, torch::kCPU, false, 7);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(model->is_training());
  const std::vector<std::string> names = EvalMetricNames(c);
  EXPECT_EQ(names.size(), 3u * 2 + 2 * 2 + 2 * 2 + 1);
  EXPECT_EQ(static_cast<size_t>(r->metrics_size()), names.size());
  const double ln_v = std::log(static_cast<double>(vocab()));
  for (const std::string& name : names) {
    ASSERT_EQ(r->metrics().count(name), 1u) << name;
    const double value = r->metrics().at(name);
    EXPECT_TRUE(std::isfinite(value)) << name;
    if (name.rfind("position_loss", 0) == 0 || name.rfind("copying@", 0) == 0) {
      EXPECT_NEAR(value, ln_v, 0.5) << name;
    } else {
      EXPECT_GE(value, 0) << name;
      EXPECT_LE(value, 1) << name;
    }
  }
  // The same model, the same metrics.
  absl::StatusOr<EvalResult> again = Evaluate(*model, data, c, torch::kCPU, false, 7);
  ASSERT_TRUE(again.ok());
  for (const std::string& name : names) {
    EXPECT_DOUBLE_EQ(again->metrics().at(name), r->metrics().at(name)) << name;
  }
}

// And through the trainer: the final evaluation of a run carries the metrics.
TEST_P(EvalTasksTest, ARunReportsTheTasksInItsEvaluations) {
  EvalTask copying = Task("copying");
  copying.add_lengths(16);
  copying.set_samples(2);
  const RunConfig c = Config({copying, Mqar(4, 4, 2)});
  TrainerOptions options;
  options.checkpoint_dir = (dir_ / "run").string();
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(c, options);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  absl::StatusOr<RunSummary> summary = (*trainer)->Run(nullptr);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->state(), SUCCEEDED);
  for (const char* name : {"copying@16", "copying_acc@16", "mqar@4"}) {
    EXPECT_EQ(summary->final_eval().metrics().count(name), 1u) << name;
  }
}

// ---- multiple_choice ---------------------------------------------------------------------------

// A task file in lm-evaluation-harness's format with `docs` as its JSON Lines data, in `dir`.
std::string WriteChoiceTask(const fs::path& dir, const std::vector<std::string>& docs) {
  fs::create_directories(dir);
  {
    std::ofstream data(dir / "docs.jsonl");
    for (const std::string& d : docs) data << d << "\n";
  }
  std::ofstream(dir / "task.yaml") << "task: toy_choice\n"
                                      "dataset_path: json\n"
                                      "dataset_kwargs:\n"
                                      "  data_files:\n"
                                      "    test: docs.jsonl\n"
                                      "test_split: test\n"
                                      "output_type: multiple_choice\n"
                                      "doc_to_text: \"Q: {{question}}\\nA:\"\n"
                                      "doc_to_choice: \"{{choices}}\"\n"
                                      "doc_to_target: label\n"
                                      "metric_list:\n"
                                      "  - metric: acc\n"
                                      "  - metric: acc_norm\n";
  return (dir / "task.yaml").string();
}

// A model sure of byte 'a' at every position (logit `sure`, the others 0).
LogitsFn LikesA(int64_t vocab, float sure) {
  return [=](const torch::Tensor& tokens, bool) {
    torch::Tensor logits = torch::zeros({tokens.size(0), tokens.size(1), vocab});
    logits.select(2, 'a').fill_(sure);
    return logits;
  };
}

class ChoiceEvalTest : public EvalTasksTest {
 protected:
  RunConfig ChoiceConfig(const std::vector<std::string>& docs, int samples = 0) {
    EvalTask t = Task("multiple_choice");
    t.set_file(WriteChoiceTask(fs::path(corpus_path()).parent_path() / "task", docs));
    t.set_samples(samples);
    RunConfig c = Config({t});
    EXPECT_TRUE(ApplyChoiceTasks(&c).ok());
    return c;
  }
};

// The right answers are all a's, wherever they stand: a model that likes 'a' answers every
// document, and the right answer's log-probability is the delimiter's and its bytes', exactly.
TEST_P(ChoiceEvalTest, AModelThatKnowsTheAnswersScoresOneWithItsExactLogProbability) {
  const RunConfig c = ChoiceConfig({
      R"({"question": "first?", "choices": ["aaa", "bbb", "ccc"], "label": 0})",
      R"({"question": "second?", "choices": ["bcb", "aaa", "ccb", "dda"], "label": 1})",
      R"({"question": "third?", "choices": ["xyz", "aa"], "label": 1})",
  });
  ASSERT_EQ(EvalMetricNames(c),
            (std::vector<std::string>{"toy_choice", "toy_choice@acc_norm", "toy_choice@logprob"}));
  const float sure = 5;
  const Metrics m = Run(LikesA(vocab(), sure), c);
  EXPECT_DOUBLE_EQ(m.at("toy_choice"), 1.0);
  EXPECT_DOUBLE_EQ(m.at("toy_choice@acc_norm"), 1.0);
  const double z = std::exp(double{sure}) + static_cast<double>(vocab() - 1);
  const double log_a = sure - std::log(z), log_other = -std::log(z);
  // " aaa", " aaa", " aa": the delimiter, then the a's.
  const double expected = (3 * log_other + (3 + 3 + 2) * log_a) / 3;
  EXPECT_NEAR(m.at("toy_choice@logprob"), expected, 1e-4);
}

// A model that knows nothing scores the chance level on choices of equal length: the tie among
// them is shared (1/k each), as the config's chance says.
TEST_P(ChoiceEvalTest, AUniformModelScoresTheChanceLevel) {
  const RunConfig c = ChoiceConfig({
      R"({"question": "a", "choices": ["yes", "no!"], "label": 0})",
      R"({"question": "b", "choices": ["one", "two", "six", "ten"], "label": 3})",
  });
  const Metrics m = Run(Uniform(vocab()), c);
  const double chance = (1.0 / 2 + 1.0 / 4) / 2;
  EXPECT_DOUBLE_EQ(c.train().evals(0).chance(), chance);
  EXPECT_DOUBLE_EQ(*EvalChanceLevel("toy_choice", c), chance);
  EXPECT_DOUBLE_EQ(m.at("toy_choice"), chance);
  EXPECT_DOUBLE_EQ(m.at("toy_choice@acc_norm"), chance);
  EXPECT_NEAR(m.at("toy_choice@logprob"), -4 * std::log(static_cast<double>(vocab())), 1e-4);
}

// A context longer than the model's window is cut from its start; the choices are scored whole.
TEST_P(ChoiceEvalTest, ALongContextIsCutFromItsStart) {
  const std::string question(600, 'q');
  const RunConfig c = ChoiceConfig({
      absl::StrCat(R"({"question": ")", question, R"(", "choices": ["ab", "aa"], "label": 1})"),
  });
  Recording rec;
  absl::StatusOr<EvalTaskResults> r =
      RunEvalTasks(rec.Wrap(LikesA(vocab(), 5)), Load(c), c, torch::kCPU);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->metrics.at("toy_choice"), 1.0);
  for (const std::vector<int64_t>& row : rec.AllRows()) {
    ASSERT_EQ(row.size(), 256u);
    EXPECT_EQ(Text(row, 253, 256).substr(0, 1), " ");  // the continuation, whole, at the end
    EXPECT_EQ(row[0], 'q');                            // the BOS went with the start
  }
}

// The task file changed since the run was keyed: the worker refuses to score the new one.
TEST_P(ChoiceEvalTest, AChangedTaskFileIsRefused) {
  RunConfig c = ChoiceConfig({R"({"question": "a", "choices": ["x", "y"], "label": 0})"});
  c.mutable_train()->mutable_evals(0)->set_fingerprint("0123456789abcdef");
  const absl::StatusOr<EvalTaskResults> r = RunEvalTasks(Uniform(vocab()), Load(c), c, torch::kCPU);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("changed since the run was keyed"), std::string::npos)
      << r.status();
}

INSTANTIATE_TEST_SUITE_P(Layouts, ChoiceEvalTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Bos" : "NoBos"; });

class EvalDataTest : public testing::CorpusTest {
 protected:
  EvalDataTest() : CorpusTest("ablate_eval_data_test", kWordLine, 400) {}

  static RunConfig WithPasskey(const fs::path& data, int vocab) {
    RunConfig c = testing::TinyRunConfig(data, 2);
    c.mutable_model()->set_max_seq_len(256);
    c.mutable_model()->set_vocab_size(vocab);
    EvalTask t = Task("passkey");
    t.add_lengths(128);
    t.set_samples(2);
    *c.mutable_train()->add_evals() = t;
    return c;
  }
  // A prepared directory (manifest.json) of `tokenizer`: the corpus's bytes, one document per
  // line, each ended by EOD 256; BOS 257; the last 50 lines in val.bin.
  fs::path WritePrepared(const std::string& name, const std::string& tokenizer,
                         nlohmann::json params = nlohmann::json::object()) {
    DataManifest m;
    m.params = std::move(params);
    m.tokenizer = tokenizer;
    m.vocab_size = 258;
    m.eod_token = 256;
    m.bos_token = 257;
    std::string train, val;
    std::ifstream in(corpus_path());
    std::string line;
    for (int i = 0; std::getline(in, line); ++i) {
      std::string* out = i >= 350 ? &val : &train;
      SplitInfo* split = i >= 350 ? &m.val : &m.train;
      for (const unsigned char ch : line + "\n") {
        out->push_back(static_cast<char>(ch));
        out->push_back(0);
      }
      out->push_back(static_cast<char>(0));  // 256, little-endian
      out->push_back(static_cast<char>(1));
      split->documents += 1;
      split->tokens += static_cast<int64_t>(line.size()) + 2;
    }
    m.train.file = "train.bin";
    m.val.file = "val.bin";
    const fs::path dir = dir_ / name;
    fs::create_directories(dir);
    std::ofstream(dir / "train.bin", std::ios::binary) << train;
    std::ofstream(dir / "val.bin", std::ios::binary) << val;
    EXPECT_TRUE(WriteManifest(dir.string(), &m).ok());
    return dir;
  }
  static absl::Status Check(const RunConfig& c) {
    absl::StatusOr<TokenData> data =
        TokenData::Load(c.train().data(), c.model().vocab_size(), c.train().seq_len());
    EXPECT_TRUE(data.ok()) << data.status();
    if (!data.ok()) return data.status();
    if (absl::Status s = CheckEvalTasksData(*data, c); !s.ok()) return s;
    return RunEvalTasks(Uniform(c.model().vocab_size()), *data, c, torch::kCPU).status();
  }
};

TEST_F(EvalDataTest, PasskeyRunsOnTextAndOnPreparedBytes) {
  EXPECT_TRUE(Check(WithPasskey(corpus_path(), 256)).ok());
  RunConfig prepared = WithPasskey(WritePrepared("bytes", "bytes"), 258);
  prepared.mutable_train()->mutable_data()->set_eod_token(256);
  const absl::Status s = Check(prepared);
  EXPECT_TRUE(s.ok()) << s;
}

// The filler of a prepared directory is its text without its end-of-document ids.
TEST_F(EvalDataTest, PasskeyFillerSkipsEndOfDocumentIds) {
  RunConfig c = WithPasskey(WritePrepared("bytes", "bytes"), 258);
  c.mutable_train()->mutable_data()->set_eod_token(256);
  c.mutable_train()->mutable_data()->set_bos_token(257);
  absl::StatusOr<TokenData> data = TokenData::Load(c.train().data(), 258, c.train().seq_len());
  ASSERT_TRUE(data.ok()) << data.status();
  Recording rec;
  ASSERT_TRUE(RunEvalTasks(rec.Wrap(Uniform(258)), *data, c, torch::kCPU).ok());
  for (const std::vector<int64_t>& row : rec.AllRows()) {
    EXPECT_EQ(row[0], 257);
    for (size_t i = 1; i < row.size(); ++i) EXPECT_LT(row[i], 256) << i;
  }
}

TEST_F(EvalDataTest, PasskeyRefusesDataThatIsNotBytes) {
  const absl::Status bpe = Check(WithPasskey(WritePrepared("bpe", "bpe"), 258));
  EXPECT_EQ(bpe.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bpe.message().find("train.evals[0] (passkey): passkey needs byte-level data"),
            std::string::npos)
      << bpe;
  EXPECT_NE(bpe.message().find("cannot tokenize them for a SentencePiece vocabulary"),
            std::string::npos)
      << bpe;
  EXPECT_NE(bpe.message().find("DATA_PREPARED with tokenizer \"bpe\""), std::string::npos) << bpe;

  // And the trainer refuses it before training.
  TrainerOptions options;
  options.checkpoint_dir = (dir_ / "run").string();
  const auto trainer = Trainer::Create(WithPasskey(dir_ / "bpe", 258), options);
  ASSERT_FALSE(trainer.ok());
  EXPECT_NE(trainer.status().message().find("passkey needs byte-level data"), std::string::npos)
      << trainer.status();
}

TEST_F(EvalDataTest, PositionLossNeedsItsWindowsInTheValidationSplit) {
  RunConfig c = testing::TinyRunConfig(corpus_path(), 2);
  c.mutable_model()->set_max_seq_len(256);
  EvalTask t = Task("position_loss");
  t.add_bins(0);
  t.add_bins(256);
  t.set_samples(64);  // 16,384 tokens; the split holds about 1,100
  *c.mutable_train()->add_evals() = t;
  const absl::Status s = Check(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("train.evals[0] (position_loss): samples x the last bin edge (64 x "
                             "256 = 16384 tokens)"),
            std::string::npos)
      << s;
}

// Bigram-backcopy data (its manifest's trigger tokens) splits the probes by query class: every
// query position > 0 is a trigger or not, counted as the data has them, the layer's F-Attn is
// the classes' mean weighted by their queries, and the split is reported by name too.
TEST_F(EvalDataTest, BigramBackcopyDataSplitsTheProbesByQueryClass) {
  const nlohmann::json params = {{"task", "bigram-backcopy"}, {"trigger_tokens", {32, 101}}};
  RunConfig c = testing::TinyRunConfig(WritePrepared("bb", "bytes", params), 2);
  c.mutable_model()->set_vocab_size(258);  // TinyRunConfig's model has a G1 gate
  c.mutable_train()->set_eval_batches(2);
  ASSERT_TRUE(ValidateRunConfig(c).ok()) << ValidateRunConfig(c);
  absl::StatusOr<TokenData> data = TokenData::Load(c.train().data(), 258, c.train().seq_len());
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->triggers(), (std::vector<int32_t>{32, 101}));
  int64_t triggers = 0, others = 0;
  for (int64_t i = 0; i < c.train().eval_batches(); ++i) {
    const torch::Tensor x =
        GetBatch(*data, c.train(), TokenData::Split::kVal, i, torch::kCPU).first.slice(1, 1);
    const int64_t t = ((x == 32) | (x == 101)).sum().item<int64_t>();
    triggers += t;
    others += x.numel() - t;
  }
  ASSERT_GT(triggers, 0);
  torch::manual_seed(1);
  Transformer model(c.model());
  absl::StatusOr<EvalResult> r = Evaluate(*model, *data, c, torch::kCPU, false, 2);
  ASSERT_TRUE(r.ok()) << r.status();
  for (const LayerProbes& l : r->probes().layers()) {
    ASSERT_EQ(l.classes_size(), 2);
    EXPECT_EQ(l.classes(0).name(), "non_trigger");
    EXPECT_EQ(l.classes(0).queries(), others);
    EXPECT_EQ(l.classes(1).name(), "trigger");
    EXPECT_EQ(l.classes(1).queries(), triggers);
    const double weighted = (l.classes(0).first_token_attention() * others +
                             l.classes(1).first_token_attention() * triggers) /
                            static_cast<double>(others + triggers);
    EXPECT_NEAR(l.first_token_attention(), weighted, 1e-9);
    EXPECT_TRUE(l.classes(1).has_gate_mean());
    EXPECT_EQ(l.first_token_attention_by_head_size(), c.model().num_heads());
  }
  EXPECT_DOUBLE_EQ(r->metrics().at("f_attn@trigger"),
                   r->probes().classes(1).first_token_attention());
  EXPECT_DOUBLE_EQ(r->metrics().at("gate_score@non_trigger"), r->probes().classes(0).gate_mean());
  EXPECT_EQ(r->metrics().count("f_attn@non_trigger"), 1u);
  EXPECT_TRUE(r->probes().has_sink_rate());

  // Other data defines no classes.
  RunConfig plain = c;
  plain.mutable_train()->mutable_data()->set_path(WritePrepared("plain", "bytes").string());
  absl::StatusOr<TokenData> plain_data =
      TokenData::Load(plain.train().data(), 258, plain.train().seq_len());
  ASSERT_TRUE(plain_data.ok()) << plain_data.status();
  absl::StatusOr<EvalResult> p = Evaluate(*model, *plain_data, plain, torch::kCPU, false, 2);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->probes().classes_size(), 0);
  EXPECT_EQ(p->metrics().count("f_attn@trigger"), 0u);
}

TEST_F(EvalDataTest, AnInvalidConfigIsRefusedWithItsProblems) {
  RunConfig c = WithPasskey(corpus_path(), 256);
  c.mutable_train()->mutable_evals(0)->set_lengths(0, 512);
  const absl::Status s = Check(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("train.evals[0].lengths[0]: a passkey sequence is exactly its length, "
                             "512 tokens"),
            std::string::npos)
      << s;
}

}  // namespace
}  // namespace ablate
