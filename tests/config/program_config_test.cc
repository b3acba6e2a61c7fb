// Program runs' settings (config/program_config.h): params as JSON, their argv rendering, the
// command line and its placeholders, the run key text and ValidateProgramConfig.
#include "config/program_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace ablate {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// YamlToJson of one YAML document, or "ERROR: message".
std::string Json(const std::string& yaml) {
  absl::StatusOr<std::string> j = YamlToJson(YAML::Load(yaml));
  return j.ok() ? *j : "ERROR: " + std::string(j.status().message());
}

std::vector<std::string> Words(const std::string& text) {
  absl::StatusOr<std::vector<std::string>> w = SplitCommandWords(text);
  EXPECT_TRUE(w.ok()) << w.status();
  return w.ok() ? *w : std::vector<std::string>{};
}

ProgramConfig WithParams(const std::vector<std::pair<std::string, std::string>>& params,
                         ProgramArgs args = PROGRAM_ARGS_DASHDASH) {
  ProgramConfig c;
  c.set_args(args);
  for (const auto& [name, json] : params) SetProgramParam(name, json, &c);
  return c;
}

// A config ValidateProgramConfig accepts.
ProgramConfig ValidConfig() {
  ProgramConfig c = WithParams({{"max_iters", "100"}, {"dropout", "0.0"}});
  c.set_command("python3 train.py {args}");
  c.set_steps("max_iters");
  c.set_grace_s(60);
  return c;
}

TEST(YamlToJsonTest, ScalarsKeepTheirTypes) {
  // Floats stay floats ("0.0"); quoted scalars are strings as written.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"42", "42"}, {"-7", "-7"}, {"0.0", "0.0"}, {"3e-3", "0.003"}, {"2.5", "2.5"},
      {"true", "true"}, {"False", "false"}, {"TRUE", "true"}, {"null", "null"}, {"~", "null"},
      {"gpt2", "\"gpt2\""}, {"yes", "\"yes\""}, {"'1.0'", "\"1.0\""},
      {"\"true\"", "\"true\""}};
  for (const auto& [yaml, json] : cases) EXPECT_EQ(Json(yaml), json) << yaml;
}

TEST(YamlToJsonTest, SequencesAndMappingsRecursively) {
  EXPECT_EQ(Json("[1, 2.5, a, true, ~]"), "[1,2.5,\"a\",true,null]");
  EXPECT_EQ(Json("{a: 1, b: [x, '2']}"), "{\"a\":1,\"b\":[\"x\",\"2\"]}");
}

TEST(YamlToJsonTest, RefusesNonFiniteAndOversizedValues) {
  EXPECT_THAT(Json("1e999"), HasSubstr("not finite"));
  EXPECT_THAT(Json(std::string(kMaxParamJsonBytes + 10, 'x')), HasSubstr("bytes as JSON"));
  std::string deep = "1";
  for (int i = 0; i < 40; ++i) deep = "[" + deep + "]";
  EXPECT_THAT(Json(deep), HasSubstr("nested"));
}

TEST(ProgramParamTest, SetKeepsParamsSortedAndReplaces) {
  ProgramConfig c;
  SetProgramParam("n_head", "8", &c);
  SetProgramParam("batch_size", "12", &c);
  SetProgramParam("lr", "0.001", &c);
  SetProgramParam("n_head", "16", &c);
  ASSERT_EQ(c.params_size(), 3);
  EXPECT_EQ(c.params(0).name(), "batch_size");
  EXPECT_EQ(c.params(1).name(), "lr");
  EXPECT_EQ(c.params(2).name(), "n_head");
  EXPECT_EQ(ProgramParamJson(c, "n_head"), "16");
  EXPECT_EQ(ProgramParamJson(c, "lr"), "0.001");
  EXPECT_EQ(ProgramParamJson(c, "missing"), std::nullopt);
}

TEST(ProgramParamTest, NumberOnlyForNumbers) {
  const ProgramConfig c = WithParams(
      {{"i", "8"}, {"f", "0.25"}, {"s", "\"x\""}, {"b", "true"}, {"l", "[1]"}, {"n", "null"}});
  EXPECT_EQ(ProgramParamNumber(c, "i"), 8.0);
  EXPECT_EQ(ProgramParamNumber(c, "f"), 0.25);
  for (const char* name : {"s", "b", "l", "n", "missing"}) {
    EXPECT_EQ(ProgramParamNumber(c, name), std::nullopt) << name;
  }
}

TEST(ProgramParamTest, CheckParamName) {
  EXPECT_TRUE(CheckParamName("n_head").ok());
  EXPECT_TRUE(CheckParamName("model.n-layer2").ok());
  EXPECT_TRUE(CheckParamName(std::string(kMaxParamNameBytes, 'a')).ok());
  EXPECT_FALSE(CheckParamName("").ok());
  EXPECT_FALSE(CheckParamName(std::string(kMaxParamNameBytes + 1, 'a')).ok());
  for (const char* bad : {"a b", "a=b", "a/b", "$x", "a\"b"}) {
    const absl::Status s = CheckParamName(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(s.message(), HasSubstr("letters, digits")) << bad;
  }
}

TEST(RenderParamArgsTest, DashdashWritesPythonLiterals) {
  const ProgramConfig c = WithParams({{"bias", "false"},
                                      {"compile", "true"},
                                      {"dropout", "0.0"},
                                      {"init_from", "\"gpt2\""},
                                      {"lr", "3e-3"},
                                      {"n_head", "8"},
                                      {"none", "null"},
                                      {"sizes", "[1, 2.0, \"a\", true, null]"},
                                      {"warmup", "2.0"}});
  EXPECT_THAT(RenderParamArgs(c),
              ElementsAre("--bias=False", "--compile=True", "--dropout=0.0", "--init_from=gpt2",
                          "--lr=0.003", "--n_head=8", "--none=None",
                          "--sizes=[1, 2.0, \"a\", True, None]", "--warmup=2.0"));
}

TEST(RenderParamArgsTest, HydraWritesYamlLiteralsAndNoneWritesNothing) {
  ProgramConfig c = WithParams({{"bias", "false"},
                                {"dropout", "0.0"},
                                {"model.name", "\"gpt2\""},
                                {"x", "null"},
                                {"xs", "[1, true]"}},
                               PROGRAM_ARGS_HYDRA);
  EXPECT_THAT(RenderParamArgs(c), ElementsAre("bias=false", "dropout=0.0", "model.name=gpt2",
                                              "x=null", "xs=[1, true]"));
  c.set_args(PROGRAM_ARGS_NONE);
  EXPECT_THAT(RenderParamArgs(c), IsEmpty());
}

TEST(SplitCommandWordsTest, QuotesAndBackslashes) {
  EXPECT_THAT(Words("  python3\ttrain.py  a\n"), ElementsAre("python3", "train.py", "a"));
  EXPECT_THAT(Words("echo 'a b' \"c \\\"d\\\" $x\" e\\ f"),
              ElementsAre("echo", "a b", "c \"d\" $x", "e f"));
  // Single quotes keep backslashes; double quotes keep those before other characters.
  EXPECT_THAT(Words("'a\\b' \"c\\d\""), ElementsAre("a\\b", "c\\d"));
  EXPECT_THAT(Words("a '' b"), ElementsAre("a", "", "b"));
  EXPECT_THAT(Words("--x='1 2'3"), ElementsAre("--x=1 23"));
  EXPECT_THAT(Words(""), IsEmpty());
}

TEST(SplitCommandWordsTest, UnterminatedQuoteIsAnError) {
  for (const char* text : {"python3 'train.py", "a \"b c", "a \"b\\\""}) {
    absl::StatusOr<std::vector<std::string>> w = SplitCommandWords(text);
    ASSERT_FALSE(w.ok()) << text;
    EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(w.status().message(), HasSubstr("unterminated"));
  }
}

TEST(ProgramArgvTest, SubstitutesPlaceholdersAndPlacesArgs) {
  ProgramConfig c = WithParams({{"n_head", "8"}, {"dropout", "0.0"}});
  c.set_command(
      "python3 train.py --out_dir={checkpoint_dir}/ck --seed={seed} {args} --max={steps} "
      "--tag=run{run_id}");
  c.set_resume_args("--init_from=resume --note 'a b'");
  CommandContext ctx;
  ctx.checkpoint_dir = "/tmp/ck dir";
  ctx.seed = 42;
  ctx.steps = 100;
  ctx.run_id = 7;
  absl::StatusOr<std::vector<std::string>> argv = ProgramArgv(c, ctx);
  ASSERT_TRUE(argv.ok()) << argv.status();
  EXPECT_THAT(*argv, ElementsAre("python3", "train.py", "--out_dir=/tmp/ck dir/ck", "--seed=42",
                                 "--dropout=0.0", "--n_head=8", "--max=100", "--tag=run7"));
  ctx.resume = true;
  argv = ProgramArgv(c, ctx);
  ASSERT_TRUE(argv.ok()) << argv.status();
  EXPECT_THAT(*argv, ElementsAre("python3", "train.py", "--out_dir=/tmp/ck dir/ck", "--seed=42",
                                 "--dropout=0.0", "--n_head=8", "--max=100", "--tag=run7",
                                 "--init_from=resume", "--note", "a b"));
}

TEST(ProgramArgvTest, ArgsAppendedWhenCommandHasNoArgsWord) {
  ProgramConfig c = WithParams({{"n_head", "8"}});
  c.set_command("torchrun --nproc_per_node=2 train.py config/x.py");
  absl::StatusOr<std::vector<std::string>> argv = ProgramArgv(c, {});
  ASSERT_TRUE(argv.ok()) << argv.status();
  EXPECT_THAT(*argv, ElementsAre("torchrun", "--nproc_per_node=2", "train.py", "config/x.py",
                                 "--n_head=8"));
}

TEST(ProgramArgvTest, UnknownPlaceholderAndEmptyCommandAreErrors) {
  ProgramConfig c;
  c.set_command("python3 train.py --out={outdir}");
  absl::StatusOr<std::vector<std::string>> argv = ProgramArgv(c, {});
  ASSERT_FALSE(argv.ok());
  EXPECT_EQ(argv.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(argv.status().message(), HasSubstr("{outdir}"));
  c.set_command("   ");
  EXPECT_EQ(ProgramArgv(c, {}).status().code(), absl::StatusCode::kInvalidArgument);
  c.set_command("python3 'train.py");
  EXPECT_THAT(ProgramArgv(c, {}).status().message(), HasSubstr("unterminated"));
}

TEST(ProgramParamsJsonTest, OneObjectKeepingFloats) {
  const ProgramConfig c =
      WithParams({{"n_head", "8"}, {"dropout", "0.0"}, {"name", "\"x\""}, {"xs", "[1,true]"}});
  EXPECT_EQ(ProgramParamsJson(c), "{\"dropout\":0.0,\"n_head\":8,\"name\":\"x\",\"xs\":[1,true]}");
  EXPECT_EQ(ProgramParamsJson(ProgramConfig()), "{}");
}

TEST(ProgramRunKeyTextTest, ChangesWithWhatIsTrainedOnly) {
  ProgramConfig c = ValidConfig();
  c.set_code_hash(std::string(64, 'a'));
  const std::string base = ProgramRunKeyText(c, 1, 1);
  EXPECT_EQ(ProgramRunKeyText(c, 1, 1), base);
  EXPECT_EQ(ProgramRunKeyText(c, 1, 0), base);  // world size 0 counts as 1

  ProgramConfig other = c;
  other.set_dir("/somewhere/else");
  other.set_report(PROGRAM_REPORT_NANOGPT);
  other.set_grace_s(5);
  EXPECT_EQ(ProgramRunKeyText(other, 1, 1), base);

  other = c;
  other.set_code_hash(std::string(64, 'b'));
  EXPECT_NE(ProgramRunKeyText(other, 1, 1), base);
  other = c;
  SetProgramParam("dropout", "0.1", &other);
  EXPECT_NE(ProgramRunKeyText(other, 1, 1), base);
  other = c;
  SetProgramParam("bias", "false", &other);
  EXPECT_NE(ProgramRunKeyText(other, 1, 1), base);
  other = c;
  other.set_command("python3 train2.py {args}");
  EXPECT_NE(ProgramRunKeyText(other, 1, 1), base);
  EXPECT_NE(ProgramRunKeyText(c, 2, 1), base);
  EXPECT_NE(ProgramRunKeyText(c, 1, 2), base);
}

TEST(ProgramCodeVersionTest, PrefixAndCapabilities) {
  ProgramConfig c;
  c.set_code_hash("0123456789abcdef0123456789abcdef");
  EXPECT_EQ(ProgramCodeVersion(c), "program+0123456789abcdef");
  EXPECT_TRUE(IsProgramCodeVersion(ProgramCodeVersion(c)));
  EXPECT_FALSE(IsProgramCodeVersion("0.3.0+abc"));
  c.add_capabilities("pause");
  EXPECT_TRUE(HasCapability(c, "pause"));
  EXPECT_FALSE(HasCapability(c, "rollback"));
}

TEST(ValidateProgramConfigTest, AcceptsAValidConfig) {
  ProgramConfig c = ValidConfig();
  c.add_capabilities("pause");
  c.add_capabilities("rollback");
  EXPECT_TRUE(ValidateProgramConfig(c).ok()) << ValidateProgramConfig(c);
  c.set_report(PROGRAM_REPORT_REGEX);
  ProgramPattern* p = c.add_patterns();
  p->set_kind("step");
  p->set_regex(R"(it=(?P<step>\d+) l=(?P<loss>[0-9.]+))");
  p = c.add_patterns();
  p->set_kind("eval");
  p->set_regex(R"(ev (?P<step>\d+) vl=(?P<val_loss>[0-9.]+))");
  EXPECT_TRUE(ValidateProgramConfig(c).ok()) << ValidateProgramConfig(c);
}

// The message of ValidateProgramConfig(c), "" when it accepts it.
std::string Problems(const ProgramConfig& c) {
  const absl::Status s = ValidateProgramConfig(c);
  if (!s.ok()) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  }
  return std::string(s.message());
}

TEST(ValidateProgramConfigTest, CommandAndSteps) {
  ProgramConfig c = ValidConfig();
  c.set_command("");
  EXPECT_THAT(Problems(c), HasSubstr("program.command: missing"));
  c.set_command("python3 train.py {nope}");
  EXPECT_THAT(Problems(c), HasSubstr("program.command: unknown placeholder {nope}"));

  c = ValidConfig();
  c.set_steps("");
  EXPECT_THAT(Problems(c), HasSubstr("program.steps: missing"));
  c.set_steps("iters");
  EXPECT_THAT(Problems(c), HasSubstr("program.steps: names param iters"));
  for (const char* bad : {"100.0", "\"100\"", "0", "-5", "true", "1e12", "3000000000"}) {
    c = ValidConfig();
    SetProgramParam("max_iters", bad, &c);
    EXPECT_THAT(Problems(c), HasSubstr("must be a positive integer")) << bad;
  }
}

TEST(ValidateProgramConfigTest, CapabilitiesRangesAndResumeArgs) {
  ProgramConfig c = ValidConfig();
  c.add_capabilities("fly");
  c.set_grace_s(-1);
  c.set_max_log_bytes(-1);
  c.set_resume_args("--x 'y");
  const std::string p = Problems(c);
  EXPECT_THAT(p, HasSubstr("program.capabilities: unknown capability \"fly\""));
  EXPECT_THAT(p, HasSubstr("program.grace_s"));
  EXPECT_THAT(p, HasSubstr("program.max_log_bytes"));
  EXPECT_THAT(p, HasSubstr("program.resume_args: unterminated"));
  EXPECT_THAT(p, HasSubstr("; "));  // all problems, joined
}

TEST(ValidateProgramConfigTest, RegexPatterns) {
  ProgramConfig c = ValidConfig();
  c.set_report(PROGRAM_REPORT_REGEX);
  EXPECT_THAT(Problems(c), HasSubstr("program.patterns: report: regex needs patterns"));

  ProgramPattern* p = c.add_patterns();
  p->set_kind("step");
  p->set_regex("it=(\\d+");
  EXPECT_THAT(Problems(c), HasSubstr("program.patterns.step: not a valid regular expression"));
  p->set_regex(R"(it=(?P<step>\d+) l=([0-9.]+))");
  EXPECT_THAT(Problems(c), HasSubstr("program.patterns.step: needs a named group (?P<loss>...)"));
  p->set_kind("eval");
  p->set_regex(R"(ev (?P<step>\d+) loss=(?P<loss>[0-9.]+))");
  EXPECT_THAT(Problems(c), HasSubstr("needs a named group (?P<val_loss>...)"));
  p->set_kind("train");
  EXPECT_THAT(Problems(c), HasSubstr("program.patterns.train: unknown kind"));

  c.set_report(PROGRAM_REPORT_ABLATE);
  p->set_kind("step");
  p->set_regex(R"(it=(?P<step>\d+) l=(?P<loss>[0-9.]+))");
  EXPECT_THAT(Problems(c), HasSubstr("only report: regex reads patterns"));
}

}  // namespace
}  // namespace ablate
