// What a program run reports, read from its output lines (worker/program/output_parser.h):
// `report: ablate`, `report: nanogpt` (karpathy/nanoGPT's own lines) and `report: regex`.
#include "worker/program/output_parser.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace ablate {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using Kind = ProgramEvent::Kind;

ProgramConfig Report(ProgramReport report) {
  ProgramConfig c;
  c.set_report(report);
  return c;
}

// The one event of `line`.
ProgramEvent One(OutputParser& parser, const std::string& line) {
  std::vector<ProgramEvent> events = parser.Parse(line);
  EXPECT_EQ(events.size(), 1u) << line;
  return events.empty() ? ProgramEvent() : events[0];
}

TEST(AblateReportTest, StepEvalCkptParamsEndError) {
  OutputParser p(Report(PROGRAM_REPORT_ABLATE));
  ProgramEvent e = One(p, R"(@ablate {"t":"step","step":12,"loss":3.1,"grad_norm":0.8,"lr":0.001,"tokens":4096})");
  ASSERT_EQ(e.kind, Kind::kStep) << e.message;
  EXPECT_EQ(e.step.step(), 12);
  EXPECT_DOUBLE_EQ(e.step.loss(), 3.1);
  EXPECT_DOUBLE_EQ(e.step.grad_norm(), 0.8);
  EXPECT_DOUBLE_EQ(e.step.lr(), 0.001);
  EXPECT_EQ(e.tokens, 4096);

  e = One(p, R"(@ablate {"t":"eval","step":500,"val_loss":2.1})");
  ASSERT_EQ(e.kind, Kind::kEval) << e.message;
  EXPECT_EQ(e.eval.step(), 500);
  EXPECT_DOUBLE_EQ(e.eval.val_loss(), 2.1);
  EXPECT_DOUBLE_EQ(e.eval.val_ppl(), std::exp(2.1));
  EXPECT_FALSE(e.eval.probes().has_gate_score_mean());

  e = One(p, R"(@ablate {"t":"ckpt","step":500})");
  ASSERT_EQ(e.kind, Kind::kCheckpoint);
  EXPECT_EQ(e.checkpoint_step, 500);

  e = One(p, R"(@ablate {"t":"params","total":124000000,"activated":85000000})");
  ASSERT_EQ(e.kind, Kind::kParams);
  EXPECT_EQ(e.params.total(), 124000000);
  EXPECT_EQ(e.params.activated(), 85000000);
  e = One(p, R"(@ablate {"t":"params","total":1000})");
  ASSERT_EQ(e.kind, Kind::kParams);
  EXPECT_EQ(e.params.activated(), 1000);  // dense: activated is the total

  EXPECT_EQ(One(p, R"(@ablate {"t":"end"})").kind, Kind::kEnd);
  e = One(p, R"(@ablate {"t":"error","msg":"CUDA out of memory","permanent":true})");
  ASSERT_EQ(e.kind, Kind::kError);
  EXPECT_EQ(e.message, "CUDA out of memory");
  EXPECT_TRUE(e.permanent);
  e = One(p, R"(@ablate {"t":"error","msg":"flaky"})");
  EXPECT_FALSE(e.permanent);
}

TEST(AblateReportTest, MarkerAnywhereAndOtherLinesIgnored) {
  OutputParser p(Report(PROGRAM_REPORT_ABLATE));
  ProgramEvent e = One(p, R"([rank0]: @ablate {"t":"step","step":3,"loss":2.5})");
  ASSERT_EQ(e.kind, Kind::kStep) << e.message;
  EXPECT_EQ(e.step.step(), 3);
  EXPECT_EQ(One(p, R"(2024-01-01 INFO @ablate {"t":"ckpt","step":7.0})").checkpoint_step, 7);
  EXPECT_THAT(p.Parse("iter 10: loss 3.1234, time 12.34ms, mfu -100.00%"), IsEmpty());
  EXPECT_THAT(p.Parse("number of parameters: 123.59M"), IsEmpty());
  EXPECT_THAT(p.Parse(""), IsEmpty());
  EXPECT_THAT(p.Parse(R"(@ablate{"t":"end"})"), IsEmpty());  // the marker is "@ablate "
}

TEST(AblateReportTest, NanAndInfStrings) {
  OutputParser p(Report(PROGRAM_REPORT_ABLATE));
  ProgramEvent e = One(p, R"(@ablate {"t":"step","step":4,"loss":"nan","grad_norm":"inf","lr":"-inf"})");
  ASSERT_EQ(e.kind, Kind::kStep) << e.message;
  EXPECT_TRUE(std::isnan(e.step.loss()));
  EXPECT_TRUE(std::isinf(e.step.grad_norm()) && e.step.grad_norm() > 0);
  EXPECT_TRUE(std::isinf(e.step.lr()) && e.step.lr() < 0);
  e = One(p, R"(@ablate {"t":"eval","step":5,"val_loss":"inf"})");
  ASSERT_EQ(e.kind, Kind::kEval) << e.message;
  EXPECT_TRUE(std::isinf(e.eval.val_loss()));
  EXPECT_TRUE(std::isinf(e.eval.val_ppl()));
}

TEST(AblateReportTest, MetricsLandInProbes) {
  OutputParser p(Report(PROGRAM_REPORT_ABLATE));
  ProgramEvent e = One(p, R"(@ablate {"t":"eval","step":500,"val_loss":2.1,"metrics":)"
                          R"({"m_act":12.5,"f_attn":0.04,"gate_score":0.3,"my_metric":9,"x":"y",)"
                          R"("sink_rate":0.25}})");
  ASSERT_EQ(e.kind, Kind::kEval) << e.message;
  ASSERT_TRUE(e.eval.probes().has_gate_score_mean());
  EXPECT_DOUBLE_EQ(e.eval.probes().gate_score_mean(), 0.3);
  EXPECT_DOUBLE_EQ(e.eval.probes().m_act(), 12.5);
  EXPECT_DOUBLE_EQ(e.eval.probes().f_attn(), 0.04);
  EXPECT_DOUBLE_EQ(e.eval.probes().sink_rate(), 0.25);
  EXPECT_EQ(e.eval.metrics().count("sink_rate"), 0u);
  EXPECT_EQ(e.eval.probes().layers_size(), 0);
  EXPECT_EQ(e.eval.probes().tokens(), 0);

  e = One(p, R"(@ablate {"t":"eval","step":1,"val_loss":2,"metrics":{"unknown":1.5}})");
  ASSERT_EQ(e.kind, Kind::kEval) << e.message;
  EXPECT_FALSE(e.eval.probes().has_gate_score_mean());
  EXPECT_EQ(e.eval.probes().m_act(), 0);
  EXPECT_EQ(e.eval.probes().f_attn(), 0);
  EXPECT_FALSE(e.eval.probes().has_sink_rate());
}

TEST(AblateReportTest, UnreadableReportsAreInvalidWithAMessage) {
  OutputParser p(Report(PROGRAM_REPORT_ABLATE));
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"(@ablate {"t":"step","step":1,)", "JSON"},
      {R"(@ablate [1, 2])", "JSON"},
      {R"(@ablate {"step":1,"loss":2})", "without \"t\""},
      {R"(@ablate {"t":7})", "without \"t\""},
      {R"(@ablate {"t":"step","loss":2})", "integer step"},
      {R"(@ablate {"t":"step","step":1})", "number loss"},
      {R"(@ablate {"t":"step","step":"1","loss":2})", "integer step"},
      {R"(@ablate {"t":"step","step":1.5,"loss":2})", "integer step"},
      {R"(@ablate {"t":"step","step":-1,"loss":2})", "integer step"},
      {R"(@ablate {"t":"eval","step":-2.0,"val_loss":2})", "integer step"},
      {R"(@ablate {"t":"ckpt","step":-3})", "ckpt report"},
      {R"(@ablate {"t":"step","step":1,"loss":"high"})", "number loss"},
      {R"(@ablate {"t":"step","step":1,"loss":2,"lr":"fast"})", "must be numbers"},
      {R"(@ablate {"t":"eval","step":1})", "val_loss"},
      {R"(@ablate {"t":"ckpt"})", "ckpt report"},
      {R"(@ablate {"t":"params","activated":5})", "number total"},
      {R"(@ablate {"t":"params","total":-5})", "number total"},
      {R"(@ablate {"t":"launch","step":1})", "unknown report type \"launch\""},
  };
  for (const auto& [line, why] : cases) {
    const ProgramEvent e = One(p, line);
    EXPECT_EQ(e.kind, Kind::kInvalid) << line;
    EXPECT_THAT(e.message, HasSubstr(why)) << line;
  }
}

// Numbers out of int64's range are refused (a step) or left out (tokens), never cast as they are.
TEST(AblateReportTest, OutOfRangeNumbers) {
  OutputParser p(Report(PROGRAM_REPORT_ABLATE));
  EXPECT_EQ(One(p, R"(@ablate {"t":"step","step":18446744073709551615,"loss":2})").kind,
            Kind::kInvalid);
  EXPECT_EQ(One(p, R"(@ablate {"t":"step","step":1e300,"loss":2})").kind, Kind::kInvalid);
  ProgramEvent e = One(p, R"(@ablate {"t":"step","step":1,"loss":2,"tokens":1e30})");
  ASSERT_EQ(e.kind, Kind::kStep) << e.message;
  EXPECT_EQ(e.tokens, 0);
}

TEST(AblateReportTest, HugeLinesAreCutNeverACrash) {
  OutputParser p(Report(PROGRAM_REPORT_ABLATE));
  const std::string pad(10 << 20, 'x');
  // A report longer than the limit: cut, so its JSON is incomplete.
  ProgramEvent e = One(p, R"(@ablate {"t":"step","step":1,"loss":2,"pad":")" + pad + "\"}");
  EXPECT_EQ(e.kind, Kind::kInvalid);
  EXPECT_THAT(e.message, HasSubstr("longer than 64 KiB"));
  // A marker past the limit is never seen; a long line with no marker reports nothing.
  EXPECT_THAT(p.Parse(pad + R"( @ablate {"t":"end"})"), IsEmpty());
  EXPECT_THAT(p.Parse(pad), IsEmpty());
  // A report of exactly the limit is read whole; one byte more is cut.
  const std::string head = R"(@ablate {"t":"end","pad":")";
  const std::string fits = head + std::string(kMaxProgramLineBytes - head.size() - 2, 'x') + "\"}";
  ASSERT_EQ(fits.size(), kMaxProgramLineBytes);
  EXPECT_EQ(One(p, fits).kind, Kind::kEnd);
  const std::string over = head + std::string(kMaxProgramLineBytes - head.size() - 1, 'x') + "\"}";
  EXPECT_EQ(One(p, over).kind, Kind::kInvalid);
  // The parser still reads the next line.
  EXPECT_EQ(One(p, R"(@ablate {"t":"end"})").kind, Kind::kEnd);
}

TEST(NanoGptReportTest, IterAndEvalLines) {
  OutputParser p(Report(PROGRAM_REPORT_NANOGPT));
  ProgramEvent e = One(p, "iter 10: loss 3.1234, time 12.34ms, mfu -100.00%");
  ASSERT_EQ(e.kind, Kind::kStep);
  EXPECT_EQ(e.step.step(), 11);  // iteration 10 is after 10 updates: ablate's step 11
  EXPECT_DOUBLE_EQ(e.step.loss(), 3.1234);
  EXPECT_EQ(One(p, "iter 0: loss 10.9876, time 2501.12ms, mfu -100.00%").step.step(), 1);

  e = One(p, "step 250: train loss 1.2345, val loss 1.4567");
  ASSERT_EQ(e.kind, Kind::kEval);
  EXPECT_EQ(e.eval.step(), 250);
  EXPECT_DOUBLE_EQ(e.eval.val_loss(), 1.4567);
  EXPECT_DOUBLE_EQ(e.eval.val_ppl(), std::exp(1.4567));

  e = One(p, "iter 12: loss nan, time 12.00ms, mfu 3.20%");
  ASSERT_EQ(e.kind, Kind::kStep);
  EXPECT_TRUE(std::isnan(e.step.loss()));

  for (const char* other : {"Overriding: max_iters = 5000", "number of parameters: 10.65M",
                            "tokens per iteration will be: 16,384", "found vocab_size = 65",
                            "compiling the model... (takes a ~minute)", "  iter 3: loss 1.0"}) {
    EXPECT_THAT(p.Parse(other), IsEmpty()) << other;
  }
}

TEST(NanoGptReportTest, CheckpointDurableOnceTheNextLineComes) {
  OutputParser p(Report(PROGRAM_REPORT_NANOGPT));
  ASSERT_EQ(One(p, "step 250: train loss 1.2345, val loss 1.4567").kind, Kind::kEval);
  EXPECT_THAT(p.Parse("saving checkpoint to out"), IsEmpty());
  std::vector<ProgramEvent> events = p.Parse("iter 250: loss 1.2000, time 30.00ms, mfu 4.00%");
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].kind, Kind::kCheckpoint);  // before the line's own events
  EXPECT_EQ(events[0].checkpoint_step, 250);
  EXPECT_EQ(events[1].kind, Kind::kStep);
  EXPECT_EQ(events[1].step.step(), 251);
  // Confirmed once only.
  EXPECT_EQ(One(p, "iter 251: loss 1.1000, time 30.00ms, mfu 4.00%").kind, Kind::kStep);

  // A later evaluation's checkpoint, confirmed by a line that reports nothing of its own.
  ASSERT_EQ(One(p, "step 500: train loss 1.0, val loss 1.3").kind, Kind::kEval);
  EXPECT_THAT(p.Parse("saving checkpoint to out-shakespeare-char"), IsEmpty());
  const ProgramEvent c = One(p, "");
  EXPECT_EQ(c.kind, Kind::kCheckpoint);
  EXPECT_EQ(c.checkpoint_step, 500);
}

TEST(NanoGptReportTest, AblateLinesAreReadToo) {
  OutputParser p(Report(PROGRAM_REPORT_NANOGPT));
  const ProgramEvent e = One(p, R"(@ablate {"t":"params","total":10650000})");
  ASSERT_EQ(e.kind, Kind::kParams);
  EXPECT_EQ(e.params.total(), 10650000);
}

ProgramConfig RegexConfig() {
  ProgramConfig c = Report(PROGRAM_REPORT_REGEX);
  ProgramPattern* s = c.add_patterns();
  s->set_kind("step");
  s->set_regex(R"(it=(?P<step>\d+) l=(?P<loss>[0-9.]+)(?: g=(?P<grad_norm>[0-9.]+))?)"
               R"((?: lr=(?P<lr>[0-9.e-]+))?(?: tok=(?P<tokens>\d+))?)");
  ProgramPattern* e = c.add_patterns();
  e->set_kind("eval");
  e->set_regex(R"(eval (?P<step>\d+): vl=(?P<val_loss>[0-9.]+))");
  return c;
}

TEST(RegexReportTest, StepAndEvalPatterns) {
  OutputParser p(RegexConfig());
  ProgramEvent e = One(p, "train: it=5 l=2.5 g=0.7 lr=3e-4 tok=8192");
  ASSERT_EQ(e.kind, Kind::kStep);
  EXPECT_EQ(e.step.step(), 5);
  EXPECT_DOUBLE_EQ(e.step.loss(), 2.5);
  EXPECT_DOUBLE_EQ(e.step.grad_norm(), 0.7);
  EXPECT_DOUBLE_EQ(e.step.lr(), 3e-4);
  EXPECT_EQ(e.tokens, 8192);

  e = One(p, "it=6 l=2.4");  // optional groups left out
  ASSERT_EQ(e.kind, Kind::kStep);
  EXPECT_EQ(e.step.step(), 6);
  EXPECT_DOUBLE_EQ(e.step.loss(), 2.4);
  EXPECT_EQ(e.step.grad_norm(), 0);
  EXPECT_EQ(e.tokens, 0);

  e = One(p, "eval 100: vl=1.75");
  ASSERT_EQ(e.kind, Kind::kEval);
  EXPECT_EQ(e.eval.step(), 100);
  EXPECT_DOUBLE_EQ(e.eval.val_loss(), 1.75);
  EXPECT_DOUBLE_EQ(e.eval.val_ppl(), std::exp(1.75));

  EXPECT_THAT(p.Parse("iter 10: loss 3.1234, time 12.34ms"), IsEmpty());
  EXPECT_THAT(p.Parse("it=x l=2"), IsEmpty());
  EXPECT_THAT(p.Parse("it=123456789012345678901234567890 l=2"), IsEmpty());
  EXPECT_THAT(p.Parse("eval 123456789012345678901234567890: vl=1.5"), IsEmpty());
  e = One(p, "it=7 l=2.5 tok=123456789012345678901234567890");
  ASSERT_EQ(e.kind, Kind::kStep);
  EXPECT_EQ(e.tokens, 0);
  EXPECT_EQ(One(p, R"(@ablate {"t":"end"})").kind, Kind::kEnd);
}

TEST(RegexReportTest, AnInvalidPatternIsIgnored) {
  ProgramConfig c = RegexConfig();
  c.mutable_patterns(0)->set_regex("it=(\\d+");
  OutputParser p(c);
  EXPECT_THAT(p.Parse("it=5 l=2.5"), IsEmpty());
  EXPECT_EQ(One(p, "eval 100: vl=1.75").kind, Kind::kEval);
}

}  // namespace
}  // namespace ablate
