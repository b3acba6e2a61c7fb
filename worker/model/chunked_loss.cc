#include "worker/model/chunked_loss.h"

#include <algorithm>

namespace ablate {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// Rows [begin, end) of `hidden`'s logits against `weight` (already in the compute dtype), fp32.
torch::Tensor ChunkLogits(const torch::Tensor& hidden, const torch::Tensor& weight,
                          int64_t begin, int64_t end, torch::ScalarType dtype) {
  return torch::matmul(hidden.slice(0, begin, end).to(dtype), weight.t()).to(torch::kFloat32);
}

class ChunkedCrossEntropyFunction
    : public torch::autograd::Function<ChunkedCrossEntropyFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& hidden,
                               const torch::Tensor& weight, const torch::Tensor& targets,
                               int64_t chunk, torch::ScalarType dtype) {
    const int64_t n = hidden.size(0);
    const torch::Tensor w = weight.to(dtype);
    torch::Tensor lse = torch::empty({n}, hidden.options().dtype(torch::kFloat32));
    torch::Tensor total = torch::zeros({}, hidden.options().dtype(torch::kFloat32));
    for (int64_t begin = 0; begin < n; begin += chunk) {
      const int64_t end = std::min(n, begin + chunk);
      const torch::Tensor logits = ChunkLogits(hidden, w, begin, end, dtype);  // (c, vocab)
      const torch::Tensor l = logits.logsumexp(1);
      lse.slice(0, begin, end).copy_(l);
      const torch::Tensor picked = logits.gather(1, targets.slice(0, begin, end).unsqueeze(1));
      total.add_((l - picked.squeeze(1)).sum());
    }
    ctx->save_for_backward({hidden, weight, targets, lse});
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["dtype"] = static_cast<int64_t>(dtype);
    return total / static_cast<double>(std::max<int64_t>(1, n));
  }

  // d loss / d logits = (softmax(logits) - onehot(target)) / N, a chunk at a time from the
  // forward's logsumexp; through the projection to the hidden rows and the weight.
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const std::vector<torch::Tensor> saved = ctx->get_saved_variables();
    const torch::Tensor& hidden = saved[0];
    const torch::Tensor& weight = saved[1];
    const torch::Tensor& targets = saved[2];
    const torch::Tensor& lse = saved[3];
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const auto dtype = static_cast<torch::ScalarType>(ctx->saved_data["dtype"].toInt());
    const int64_t n = hidden.size(0);
    torch::NoGradGuard no_grad;
    const torch::Tensor w = weight.to(dtype);
    const torch::Tensor scale = grads[0].to(torch::kFloat32) / static_cast<double>(std::max<int64_t>(1, n));
    torch::Tensor grad_hidden = torch::empty_like(hidden);
    torch::Tensor grad_weight = torch::zeros_like(weight);
    for (int64_t begin = 0; begin < n; begin += chunk) {
      const int64_t end = std::min(n, begin + chunk);
      torch::Tensor p = ChunkLogits(hidden, w, begin, end, dtype);
      p.sub_(lse.slice(0, begin, end).unsqueeze(1)).exp_();  // softmax
      const torch::Tensor t = targets.slice(0, begin, end).unsqueeze(1);
      p.scatter_add_(1, t, torch::full(t.sizes(), -1.0, p.options()));
      p.mul_(scale);
      const torch::Tensor g = p.to(dtype);  // (c, vocab)
      grad_hidden.slice(0, begin, end).copy_(torch::matmul(g, w));
      const torch::Tensor h = hidden.slice(0, begin, end).to(dtype);
      if (dtype == grad_weight.scalar_type()) {
        grad_weight.addmm_(g.t(), h);  // no (vocab, d) temporary
      } else {
        grad_weight.add_(torch::matmul(g.t(), h));
      }
    }
    return {grad_hidden, grad_weight, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor ChunkedCrossEntropy(const torch::Tensor& hidden, const torch::Tensor& weight,
                                  const torch::Tensor& targets, int64_t chunk,
                                  torch::ScalarType dtype) {
  TORCH_CHECK(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1),
              "chunked loss: hidden ", hidden.sizes(), " and weight ", weight.sizes(),
              " do not multiply");
  TORCH_CHECK(targets.dim() == 1 && targets.size(0) == hidden.size(0), "chunked loss: ",
              targets.sizes(), " targets for ", hidden.size(0), " rows");
  TORCH_CHECK(chunk >= 1, "chunked loss: chunk must be >= 1, got ", chunk);
  return ChunkedCrossEntropyFunction::apply(hidden, weight, targets, chunk, dtype);
}

}  // namespace ablate
