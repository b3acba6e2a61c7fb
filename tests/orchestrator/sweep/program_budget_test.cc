// Budget matching of program runs (orchestrator/sweep/program_budget.h): the search over an
// integer param against a counter, its refusals, and the counters that run a command or answer
// from what one answered.
#include "orchestrator/sweep/program_budget.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "config/program_config.h"
#include "nlohmann/json.hpp"
#include "tests/test_dir.h"

namespace ablate {
namespace {

using ::testing::HasSubstr;

// A model whose count is 1000 + 128 * ffn (+ 4096 with a gate), as a counter would answer.
ProgramCounter AffineCounter(int* calls) {
  return
      [calls](const std::vector<std::string>& objects) -> absl::StatusOr<std::vector<ParamCount>> {
        ++*calls;
        std::vector<ParamCount> out;
        for (const std::string& o : objects) {
          const nlohmann::json j = nlohmann::json::parse(o);
          ParamCount c;
          c.set_total(1000 + 128 * j.value("ffn", 0) + (j.value("gate", "") == "g1" ? 4096 : 0));
          c.set_activated(c.total());
          out.push_back(c);
        }
        return out;
      };
}

BudgetRule Rule(const std::string& param) {
  BudgetRule rule;
  rule.set_match(BUDGET_FFN);
  rule.set_param(param);
  rule.set_tolerance(0.01);
  rule.set_multiple(1);
  return rule;
}

ProgramConfig Gated(int ffn) {
  ProgramConfig p;
  SetProgramParam("ffn", std::to_string(ffn), &p);
  SetProgramParam("gate", "\"g1\"", &p);
  return p;
}

TEST(ProgramBudgetTest, SolvesTheParamToTheReferencesCountInFewCalls) {
  int calls = 0;
  ProgramConfig p = Gated(256);
  // The reference: ffn 256 without the gate: 1000 + 32768. The gate costs 4096 = 32 ffn.
  absl::StatusOr<BudgetSolution> s =
      SolveProgramBudget(Rule("ffn"), 1000 + 128 * 256, "baseline", AffineCounter(&calls), &p);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->to(), 224);
  EXPECT_EQ(s->residual(), 0);
  EXPECT_EQ(ProgramParamJson(p, "ffn"), "224");
  EXPECT_EQ(s->text(), "ffn 256 -> 224 (residual 0 vs baseline)");
  EXPECT_LE(calls, 5);
}

TEST(ProgramBudgetTest, GrowsTheParamWhenTheVariantIsSmaller) {
  int calls = 0;
  ProgramConfig p;
  SetProgramParam("ffn", "100", &p);
  absl::StatusOr<BudgetSolution> s =
      SolveProgramBudget(Rule("ffn"), 1000 + 128 * 3000, "big", AffineCounter(&calls), &p);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->to(), 3000);
}

TEST(ProgramBudgetTest, KeepsToTheMultiple) {
  int calls = 0;
  ProgramConfig p = Gated(256);
  BudgetRule rule = Rule("ffn");
  rule.set_multiple(64);
  rule.set_tolerance(0.2);
  absl::StatusOr<BudgetSolution> s =
      SolveProgramBudget(rule, 1000 + 128 * 256, "baseline", AffineCounter(&calls), &p);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->to() % 64, 0);
  EXPECT_EQ(s->to(), 192);  // 224 is no multiple of 64; 192 and 256 are 4096 off each way
}

TEST(ProgramBudgetTest, RefusesACountThatIsNotMonotone) {
  ProgramCounter zigzag =
      [](const std::vector<std::string>& objects) -> absl::StatusOr<std::vector<ParamCount>> {
    std::vector<ParamCount> out;
    for (const std::string& o : objects) {
      const int ffn = nlohmann::json::parse(o).value("ffn", 0);
      ParamCount c;
      c.set_total(ffn % 2 == 0 ? 1000 * ffn : 10);
      out.push_back(c);
    }
    return out;
  };
  ProgramConfig p;
  SetProgramParam("ffn", "3", &p);
  absl::StatusOr<BudgetSolution> s = SolveProgramBudget(Rule("ffn"), 20000, "r", zigzag, &p);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("not monotone in params.ffn"));
  EXPECT_EQ(ProgramParamJson(p, "ffn"), "3");  // unchanged
}

TEST(ProgramBudgetTest, RefusesWhatNoValueReaches) {
  int calls = 0;
  ProgramConfig p = Gated(256);
  BudgetRule rule = Rule("ffn");
  rule.set_multiple(1000);
  absl::StatusOr<BudgetSolution> s =
      SolveProgramBudget(rule, 1000 + 128 * 256, "baseline", AffineCounter(&calls), &p);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("impossible: no params.ffn (multiple of 1000)"));
}

TEST(ProgramBudgetTest, RefusesAParamThatIsNotAPositiveInteger) {
  int calls = 0;
  ProgramConfig p;
  SetProgramParam("ffn", "2.5", &p);
  EXPECT_THAT(
      SolveProgramBudget(Rule("ffn"), 100, "r", AffineCounter(&calls), &p).status().message(),
      HasSubstr("params.ffn must be a positive integer"));
  EXPECT_THAT(
      SolveProgramBudget(Rule("nope"), 100, "r", AffineCounter(&calls), &p).status().message(),
      HasSubstr("params.nope must be a positive integer"));
}

class CommandCounterTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::FreshTestDir("ablate_count"); }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void Script(const std::string& text) { std::ofstream(dir_ / "count.sh") << text; }
  std::filesystem::path dir_;
};

TEST_F(CommandCounterTest, AnswersEachObjectAndRecordsAndCaches) {
  // One line per input line; counts the runs in a file so that caching shows.
  Script("echo run >> calls; while read line; do echo '{\"total\": 7, \"activated\": 5}'; done\n");
  auto record = std::make_shared<std::map<std::string, ParamCount>>();
  ProgramCounter count = CommandCounter("sh count.sh", dir_.string(), absl::Seconds(30), record);
  absl::StatusOr<std::vector<ParamCount>> got = count({"{\"a\":1}", "{\"a\":2}"});
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 2u);
  EXPECT_EQ((*got)[1].total(), 7);
  EXPECT_EQ((*got)[1].activated(), 5);
  ASSERT_TRUE(count({"{\"a\":2}"}).ok());  // cached: no second run
  EXPECT_EQ(record->size(), 2u);
  std::ifstream calls(dir_ / "calls");
  std::string all((std::istreambuf_iterator<char>(calls)), std::istreambuf_iterator<char>());
  EXPECT_EQ(all, "run\n");
  // What the coordinator answers from.
  ProgramCounter recorded = RecordedCounter(record);
  EXPECT_EQ((*recorded({"{\"a\":1}"}))[0].total(), 7);
  EXPECT_THAT(recorded({"{\"a\":3}"}).status().message(), HasSubstr("carries no count of"));
}

TEST_F(CommandCounterTest, RefusesTooFewLinesBadLinesFailuresAndHangs) {
  Script("read line; echo '{\"total\": 1}'\n");
  EXPECT_THAT(
      CommandCounter("sh count.sh", dir_.string(), absl::Seconds(30), nullptr)({"{}", "{\"b\":1}"})
          .status()
          .message(),
      HasSubstr("answered 1 lines for 2 configs"));
  Script("cat > /dev/null; echo 'twelve'\n");
  EXPECT_THAT(CommandCounter("sh count.sh", dir_.string(), absl::Seconds(30), nullptr)({"{}"})
                  .status()
                  .message(),
              HasSubstr("line 1 is not {\"total\": N"));
  Script("exit 4\n");
  EXPECT_THAT(CommandCounter("sh count.sh", dir_.string(), absl::Seconds(30), nullptr)({"{}"})
                  .status()
                  .message(),
              HasSubstr("exited with code 4"));
  Script("sleep 600\n");
  EXPECT_THAT(CommandCounter("sh count.sh", dir_.string(), absl::Seconds(1), nullptr)({"{}"})
                  .status()
                  .message(),
              HasSubstr("no answer within 1s (killed)"));
  EXPECT_THAT(CommandCounter("no-such-counter-x", dir_.string(), absl::Seconds(1), nullptr)({"{}"})
                  .status()
                  .message(),
              HasSubstr("no-such-counter-x not found"));
}

TEST(ProgramBudgetTest, ASiblingCounterAsksAboutEveryAxisPointInOneCall) {
  // The search at four learning rates: the first point's calls answer the other three's.
  int calls = 0;
  auto cache = std::make_shared<std::map<std::string, ParamCount>>();
  std::vector<std::map<std::string, std::string>> lrs;
  for (const char* lr : {"0.001", "0.003", "0.01", "0.03"}) lrs.push_back({{"lr", lr}});
  // A caching counter in front of the affine one, as CommandCounter caches.
  ProgramCounter inner = [&](const std::vector<std::string>& objects)
      -> absl::StatusOr<std::vector<ParamCount>> {
    std::vector<std::string> missing;
    for (const std::string& o : objects) {
      if (!cache->count(o)) missing.push_back(o);
    }
    if (!missing.empty()) {
      absl::StatusOr<std::vector<ParamCount>> got = AffineCounter(&calls)(missing);
      if (!got.ok()) return got.status();
      for (size_t i = 0; i < missing.size(); ++i) (*cache)[missing[i]] = (*got)[i];
    }
    std::vector<ParamCount> out;
    for (const std::string& o : objects) out.push_back(cache->at(o));
    return out;
  };
  ProgramCounter count = SiblingCounter(inner, lrs);
  int first = 0;
  for (const auto& point : lrs) {
    ProgramConfig p = Gated(256);
    SetProgramParam("lr", point.at("lr"), &p);
    absl::StatusOr<BudgetSolution> s = SolveProgramBudget(Rule("ffn"), 1000 + 128 * 256,
                                                          "baseline", count, &p);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->to(), 224);
    if (first == 0) first = calls;
  }
  EXPECT_GT(first, 0);
  EXPECT_EQ(calls, first);  // the other points asked nothing new
  // Answers are the objects' own, in order, whatever was asked besides.
  ProgramConfig a = Gated(10), b = Gated(20);
  absl::StatusOr<std::vector<ParamCount>> got =
      count({ProgramParamsJson(a), ProgramParamsJson(b)});
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 2u);
  EXPECT_EQ((*got)[0].total(), 1000 + 128 * 10 + 4096);
  EXPECT_EQ((*got)[1].total(), 1000 + 128 * 20 + 4096);
  // A counter that fails on a sibling still answers the objects alone.
  ProgramCounter picky = [&](const std::vector<std::string>& objects)
      -> absl::StatusOr<std::vector<ParamCount>> {
    if (objects.size() > 1) return absl::InvalidArgumentError("too many");
    return AffineCounter(&calls)(objects);
  };
  got = SiblingCounter(picky, lrs)({ProgramParamsJson(a)});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)[0].total(), 1000 + 128 * 10 + 4096);
  EXPECT_FALSE(SiblingCounter(ProgramCounter(), lrs));  // no counter stays no counter
}

}  // namespace
}  // namespace ablate
