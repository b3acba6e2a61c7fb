// The check that the analytic parameter counter equals the LibTorch model, shared by the tests
// that build models (model_test, paper_count_test, spec_model_count_test).
#ifndef ABLATE_TESTS_WORKER_MODEL_COUNT_CHECK_H_
#define ABLATE_TESTS_WORKER_MODEL_COUNT_CHECK_H_

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "config/param_count.h"
#include "proto/ablate.pb.h"
#include "worker/model/transformer.h"

namespace ablate {

// Sums allocated parameter elements into the analytic counter's components, by module name.
inline ParamBreakdown ClassifyAllocated(torch::nn::Module& model) {
  ParamBreakdown b;
  for (const auto& p : model.named_parameters()) {
    const std::string& n = p.key();
    const int64_t k = p.value().numel();
    auto has = [&](const char* s) { return n.find(s) != std::string::npos; };
    if (n == "embedding") {
      b.set_embedding(b.embedding() + k);
    } else if (n.rfind("lm_head.", 0) == 0) {
      b.set_lm_head(b.lm_head() + k);
    } else if (has(".ffn.") || has(".moe.")) {
      b.set_ffn(b.ffn() + k);
    } else if (has(".attn.gate.") || has(".attn.control_norm.")) {
      b.set_gate(b.gate() + k);
    } else if (has(".attn.")) {
      b.set_attention(b.attention() + k);
    } else {
      b.set_norms(b.norms() + k);
    }
  }
  return b;
}

// Builds the model of `c` (uninitialised: only shapes matter) and expects its allocated
// parameters to equal `want`, in total and per component.
inline void ExpectAllocatedEquals(const ModelConfig& c, const ParamCount& want,
                                  const std::string& label) {
  SkipInitGuard skip_init;
  Transformer model(c);
  EXPECT_EQ(CountAllocatedParams(*model), want.total()) << label;
  const ParamBreakdown got = ClassifyAllocated(*model);
  const ParamBreakdown& w = want.breakdown();
  EXPECT_EQ(got.embedding(), w.embedding()) << label;
  EXPECT_EQ(got.lm_head(), w.lm_head()) << label;
  EXPECT_EQ(got.attention(), w.attention()) << label;
  EXPECT_EQ(got.gate(), w.gate()) << label;
  EXPECT_EQ(got.ffn(), w.ffn()) << label;
  EXPECT_EQ(got.norms(), w.norms()) << label;
  EXPECT_LE(want.activated(), want.total()) << label;
}

}  // namespace ablate

#endif  // ABLATE_TESTS_WORKER_MODEL_COUNT_CHECK_H_
