#include "worker/model/fused_ops.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

namespace ablate {

namespace reference {

torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  if (x.scalar_type() == torch::kFloat32 || x.scalar_type() == torch::kFloat64) {
    return x * torch::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps) * weight;
  }
  // bf16 (PRECISION_BF16): the mean of squares and the scaling in fp32, the output in x's dtype.
  const torch::Tensor xf = x.to(torch::kFloat32);
  return (xf * torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps)).to(x.scalar_type()) *
         weight.to(x.scalar_type());
}

torch::Tensor RopeToHeads(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                          double scale) {
  const int64_t T = x.size(1), half = x.size(3) / 2;
  torch::Tensor c = cos.slice(0, 0, T).view({1, T, 1, -1}).to(x.dtype());
  torch::Tensor s = sin.slice(0, 0, T).view({1, T, 1, -1}).to(x.dtype());
  torch::Tensor y = x * c + torch::cat({-x.slice(3, half), x.slice(3, 0, half)}, 3) * s;
  return (scale == 1.0 ? y : y * scale).transpose(1, 2).contiguous();
}

torch::Tensor SiluMul(const torch::Tensor& a, const torch::Tensor& b) {
  return torch::silu(a) * b;
}

torch::Tensor SigmoidGate(const torch::Tensor& y, const torch::Tensor& logits) {
  return y * torch::sigmoid(logits);
}

std::pair<torch::Tensor, torch::Tensor> CausalAttention(const torch::Tensor& q,
                                                        const torch::Tensor& k,
                                                        const torch::Tensor& v,
                                                        const torch::Tensor& mask) {
  const int64_t H = q.size(1), KV = k.size(1);
  torch::Tensor kh = k, vh = v.transpose(1, 2);  // (B, KV, T, dk)
  if (KV != H) {  // GQA: each KV head serves H / KV consecutive query heads
    kh = kh.repeat_interleave(H / KV, 1);
    vh = vh.repeat_interleave(H / KV, 1);
  }
  // The scores (QK^T, the softmax's input) and the softmax in fp32 whatever q's dtype (bf16:
  // PRECISION_BF16), as FlashAttention keeps them: scores rounded to bf16 (8 bits of mantissa)
  // would move the attention a sink decides by. The products with V stay in q's dtype.
  const bool reduced = q.scalar_type() == torch::kBFloat16 || q.scalar_type() == torch::kHalf;
  const torch::Tensor scores =
      reduced ? torch::matmul(q.to(torch::kFloat32), kh.to(torch::kFloat32).transpose(-2, -1))
              : torch::matmul(q, kh.transpose(-2, -1));
  torch::Tensor probs =
      torch::softmax(scores + mask.to(scores.scalar_type()), -1, scores.scalar_type());
  torch::Tensor out =
      torch::matmul(probs.to(vh.scalar_type()), vh).transpose(1, 2).contiguous();  // (B, T, H, dk)
  return {out, probs.detach()};
}

}  // namespace reference

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

bool Fusable(const torch::Tensor& t) { return t.is_cpu() && t.scalar_type() == torch::kFloat32; }

// Rows per parallel task: enough work to amortise scheduling.
int64_t Grain(int64_t row_len) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, row_len)); }

// What every backward here starts from: the tensors its forward saved, and the gradient of its
// first output made contiguous, since the kernels walk raw pointers.
struct BackwardInputs {
  tensor_list saved;
  torch::Tensor grad;
};

BackwardInputs ReadBackwardInputs(AutogradContext* ctx, const tensor_list& grads) {
  return {ctx->get_saved_variables(), grads[0].contiguous()};
}

class RmsNormCpu : public torch::autograd::Function<RmsNormCpu> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& input,
                               const torch::Tensor& weight, double eps) {
    const torch::Tensor x = input.contiguous();
    const int64_t d = x.size(-1), rows = x.numel() / d;
    torch::Tensor y = torch::empty_like(x);
    torch::Tensor rstd = torch::empty({rows}, x.options());
    const float* xp = x.data_ptr<float>();
    const float* wp = weight.contiguous().data_ptr<float>();
    float* yp = y.data_ptr<float>();
    float* rp = rstd.data_ptr<float>();
    at::parallel_for(0, rows, Grain(d), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const float* xr = xp + r * d;
        float* yr = yp + r * d;
        float ss = 0;
        for (int64_t i = 0; i < d; ++i) ss += xr[i] * xr[i];
        const float s = 1.0f / std::sqrt(ss / static_cast<float>(d) + static_cast<float>(eps));
        for (int64_t i = 0; i < d; ++i) yr[i] = xr[i] * s * wp[i];
        rp[r] = s;
      }
    });
    ctx->save_for_backward({x, weight, rstd});
    return y;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto [saved, dy] = ReadBackwardInputs(ctx, grads);
    const torch::Tensor &x = saved[0], &weight = saved[1], &rstd = saved[2];
    const int64_t d = x.size(-1), rows = x.numel() / d;
    torch::Tensor dx = torch::empty_like(x);
    // dw = sum over rows of dy * x * rstd: one partial row per chunk of rows, summed in chunk
    // order at the end. The chunks depend on the shape alone, not on which thread or how many
    // threads run them, so dw has the same bits at any thread count, and no index comes from a
    // thread number (which OpenMP's team, not LibTorch's count, bounds).
    const int64_t chunks = std::clamp<int64_t>(rows / Grain(d), 1, 64);
    std::vector<float> partial(static_cast<size_t>(chunks * d), 0.0f);
    const float *xp = x.data_ptr<float>(), *dyp = dy.data_ptr<float>(), *rp = rstd.data_ptr<float>();
    const torch::Tensor wc = weight.contiguous();
    const float* wp = wc.data_ptr<float>();
    float* dxp = dx.data_ptr<float>();
    at::parallel_for(0, chunks, 1, [&](int64_t first, int64_t last) {
      for (int64_t chunk = first; chunk < last; ++chunk) {
        float* dw = partial.data() + chunk * d;
        const int64_t end = rows * (chunk + 1) / chunks;
        for (int64_t r = rows * chunk / chunks; r < end; ++r) {
          const float* xr = xp + r * d;
          const float* g = dyp + r * d;
          float* out = dxp + r * d;
          const float s = rp[r];
          float dot = 0;  // sum(dy * w * x)
          for (int64_t i = 0; i < d; ++i) {
            dot += g[i] * wp[i] * xr[i];
            dw[i] += g[i] * xr[i] * s;
          }
          const float c = dot * s * s * s / static_cast<float>(d);
          for (int64_t i = 0; i < d; ++i) out[i] = g[i] * wp[i] * s - xr[i] * c;
        }
      }
    });
    torch::Tensor dw = torch::zeros({d}, x.options());
    float* dwp = dw.data_ptr<float>();
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      for (int64_t i = 0; i < d; ++i) dwp[i] += partial[static_cast<size_t>(chunk * d + i)];
    }
    return {dx, dw.view(weight.sizes()), torch::Tensor()};
  }
};

// Forward (sign +1): x (B, T, H, d) -> y (B, H, T, d), y1 = k (x1 c - x2 s), y2 = k (x2 c + x1 s)
// at position t over the two halves of d. Backward (sign -1): dy (B, H, T, d) -> dx (B, T, H, d),
// dx1 = k (dy1 c + dy2 s), dx2 = k (dy2 c - dy1 s).
void RopeKernel(const torch::Tensor& in, const torch::Tensor& cos, const torch::Tensor& sin,
                torch::Tensor& out, float sign, float scale, int64_t B, int64_t T, int64_t H,
                int64_t d) {
  const int64_t half = d / 2;
  const float *xp = in.data_ptr<float>(), *cp = cos.data_ptr<float>(), *sp = sin.data_ptr<float>();
  float* yp = out.data_ptr<float>();
  at::parallel_for(0, B * T, Grain(H * d), [&](int64_t begin, int64_t end) {
    for (int64_t bt = begin; bt < end; ++bt) {
      const int64_t b = bt / T, t = bt % T;
      const float* c = cp + t * d;
      const float* s = sp + t * d;
      for (int64_t h = 0; h < H; ++h) {
        const int64_t bthd = (bt * H + h) * d, bhtd = ((b * H + h) * T + t) * d;
        const float* x = xp + (sign > 0 ? bthd : bhtd);
        float* y = yp + (sign > 0 ? bhtd : bthd);
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = x[i], x2 = x[i + half];
          y[i] = scale * (x1 * c[i] - sign * x2 * s[i]);
          y[i + half] = scale * (x2 * c[i] + sign * x1 * s[i]);
        }
      }
    }
  });
}

class RopeCpu : public torch::autograd::Function<RopeCpu> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& input,
                               const torch::Tensor& cos, const torch::Tensor& sin, double scale) {
    const torch::Tensor x = input.contiguous();
    const torch::Tensor c = cos.contiguous(), s = sin.contiguous();
    const int64_t B = x.size(0), T = x.size(1), H = x.size(2), d = x.size(3);
    torch::Tensor y = torch::empty({B, H, T, d}, x.options());
    RopeKernel(x, c, s, y, 1.0f, static_cast<float>(scale), B, T, H, d);
    ctx->save_for_backward({c, s});
    ctx->saved_data["scale"] = scale;
    return y;
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto [saved, dy] = ReadBackwardInputs(ctx, grads);  // dy: (B, H, T, d)
    const int64_t B = dy.size(0), H = dy.size(1), T = dy.size(2), d = dy.size(3);
    torch::Tensor dx = torch::empty({B, T, H, d}, dy.options());
    RopeKernel(dy, saved[0], saved[1], dx, -1.0f,
               static_cast<float>(ctx->saved_data["scale"].toDouble()), B, T, H, d);
    return {dx, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// The exponentials come from ATen's vectorised sigmoid (a scalar std::exp loop is slower than the
// passes it saves); the products and the whole backward are one pass each.
class SiluMulCpu : public torch::autograd::Function<SiluMulCpu> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& a_in,
                               const torch::Tensor& b_in) {
    const torch::Tensor a = a_in.contiguous(), b = b_in.contiguous();
    const torch::Tensor sig = torch::sigmoid(a);
    torch::Tensor y = torch::empty_like(a);
    const float *ap = a.data_ptr<float>(), *bp = b.data_ptr<float>(), *sp = sig.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    at::parallel_for(0, a.numel(), 16384, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) yp[i] = ap[i] * sp[i] * bp[i];
    });
    ctx->save_for_backward({a, b, sig});
    return y;
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto [saved, g] = ReadBackwardInputs(ctx, grads);
    const torch::Tensor &a = saved[0], &b = saved[1], &sig = saved[2];
    torch::Tensor da = torch::empty_like(a), db = torch::empty_like(b);
    const float *ap = a.data_ptr<float>(), *bp = b.data_ptr<float>(), *gp = g.data_ptr<float>();
    const float* sp = sig.data_ptr<float>();
    float *dap = da.data_ptr<float>(), *dbp = db.data_ptr<float>();
    at::parallel_for(0, a.numel(), 16384, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const float silu = ap[i] * sp[i];
        dbp[i] = gp[i] * silu;
        dap[i] = gp[i] * bp[i] * (sp[i] + silu * (1.0f - sp[i]));  // d silu / da
      }
    });
    return {da, db};
  }
};

// Rows of y (length P) each gated by P sigmoid scores, or by one when headwise. The scores come
// from ATen's vectorised sigmoid; the product and the backward are one pass each. The backward
// reads the output, not y: d logits = g * y * s (1 - s) = g * out * (1 - s).
class SigmoidGateCpu : public torch::autograd::Function<SigmoidGateCpu> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& y_in,
                               const torch::Tensor& logits) {
    const torch::Tensor y = y_in.contiguous(), sig = torch::sigmoid(logits).contiguous();
    const int64_t P = y.size(-1), rows = y.numel() / P;
    const int64_t stride = sig.size(-1) == 1 && P != 1 ? 0 : 1;  // headwise: one score per row
    torch::Tensor out = torch::empty_like(y);
    const float *yp = y.data_ptr<float>(), *sp = sig.data_ptr<float>();
    float* op = out.data_ptr<float>();
    at::parallel_for(0, rows, Grain(P), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const float* yr = yp + r * P;
        const float* sr = sp + (stride ? r * P : r);
        float* o = op + r * P;
        for (int64_t i = 0; i < P; ++i) o[i] = yr[i] * sr[i * stride];
      }
    });
    ctx->save_for_backward({out, sig});
    return out;
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto [saved, g] = ReadBackwardInputs(ctx, grads);
    const torch::Tensor &out = saved[0], &sig = saved[1];
    const int64_t P = out.size(-1), rows = out.numel() / P;
    const bool headwise = sig.size(-1) == 1 && P != 1;
    torch::Tensor dy = torch::empty_like(out), dl = torch::empty_like(sig);
    const float *op = out.data_ptr<float>(), *sp = sig.data_ptr<float>(), *gp = g.data_ptr<float>();
    float *dyp = dy.data_ptr<float>(), *dlp = dl.data_ptr<float>();
    at::parallel_for(0, rows, Grain(P), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const float *orow = op + r * P, *gr = gp + r * P;
        float* dyr = dyp + r * P;
        if (headwise) {
          const float s = sp[r];
          float dot = 0;
          for (int64_t i = 0; i < P; ++i) {
            dyr[i] = gr[i] * s;
            dot += gr[i] * orow[i];
          }
          dlp[r] = dot * (1.0f - s);
        } else {
          const float* sr = sp + r * P;
          float* dlr = dlp + r * P;
          for (int64_t i = 0; i < P; ++i) {
            dyr[i] = gr[i] * sr[i];
            dlr[i] = gr[i] * orow[i] * (1.0f - sr[i]);
          }
        }
      }
    });
    return {dy, dl};
  }
};

// Causal softmax attention on the CPU, one (batch, KV head) group at a time: the groups are split
// across the intra-op threads and each does single-threaded BLAS products and an in-cache softmax.
// LibTorch 1.13's CPU bmm walks the batch on one thread and lets BLAS thread every small product,
// and the unfused mask/softmax passes stream the whole (B, H, T, T) tensor through memory several
// times; this does neither, reads K/V once per group instead of repeating them for GQA, and
// writes the output in the (B, T, H, dk) layout W_O reads.
//
// Causal blocks: queries are taken kCausalBlock rows at a time, and the rows [r0, r1) see keys
// [0, r1) only, so the products above the diagonal block (all -inf in the mask, exact zeros in
// the probabilities) are never computed, forward or backward: at T = 512 a head does 56% of the
// full T x T work, at T = 128 75%. The mask must be -inf above the diagonal (causal).
//
// No (B, H, T, T) tensor unless the probes ask for it: the backward recomputes a row block's
// probabilities (one more q k^T product and softmax, in cache, bit-identical to the forward's)
// instead of saving them; at 32k tokens a step, a saved tensor was 67-268 MB per layer at
// d_model 128, written, page-faulted in and read back every step.
//
// The products go to BLAS's sgemm on raw pointers (BlockGemm), not through ATen: a row block is
// small (64 x T x dk), and the ~40 ATen calls a block took (views, narrows, addmm_out's checks)
// cost more than its arithmetic at short sequences (docs/model.md, "Speed", has the figure).
//
// q (pre-scaled), k: (B, H, T, dk) and (B, KV, T, dk); v: (B, T, KV, dk); all contiguous fp32.
// Returns {out (B, T, H, dk)}, and with `with_probs` {out, probs (B, H, T, T)} for the probes
// (not differentiable; its upper triangle written as zeros).
constexpr int64_t kCausalBlock = 64;

// Fortran BLAS's sgemm (32-bit integers), looked up at run time: the first `sgemm_` the process
// exports, which with a LibTorch that links its BLAS dynamically (Debian's: the system BLAS,
// OpenBLAS) is the one its own CPU products call. Null where none is exported (a build with MKL
// linked in statically), or for tests; BlockGemm then goes through ATen.
using SgemmFn = void (*)(const char* transa, const char* transb, const int* m, const int* n,
                         const int* k, const float* alpha, const float* a, const int* lda,
                         const float* b, const int* ldb, const float* beta, float* c,
                         const int* ldc);
SgemmFn FoundSgemm() {
  static const SgemmFn found = reinterpret_cast<SgemmFn>(dlsym(RTLD_DEFAULT, "sgemm_"));
  return found;
}
std::atomic<bool> aten_products_for_testing{false};
SgemmFn Sgemm() {
  return aten_products_for_testing.load(std::memory_order_relaxed) ? nullptr : FoundSgemm();
}

// A row-major matrix: `rows` x `cols`, rows `ld` floats apart; `t`: use its transpose.
struct Mat {
  const float* data;
  int64_t rows, cols, ld;
  bool t = false;
  torch::Tensor View() const {  // for the ATen fallback
    torch::Tensor m = torch::from_blob(const_cast<float*>(data), {rows, cols}, {ld, 1});
    return t ? m.t() : m;
  }
};

// c (m x n, rows ldc apart) = a b + beta c, a and b as given (m x k, k x n once transposed).
// Called from every thread of the kernel's parallel region at once. Single-threaded there with
// OpenBLAS's OpenMP build (it checks omp_in_parallel; so does ATen), the one Debian's LibTorch
// uses here; a pthreads OpenBLAS or MKL may start threads of its own per call and oversubscribe
// the cores (OPENBLAS_NUM_THREADS=1 / MKL_NUM_THREADS=1 keep it to one).
void BlockGemm(SgemmFn sgemm, const Mat& a, const Mat& b, float beta, float* c, int64_t ldc) {
  const int64_t m = a.t ? a.cols : a.rows, k = a.t ? a.rows : a.cols, n = b.t ? b.rows : b.cols;
  if (sgemm != nullptr) {
    // Row-major C = A B is column-major C^T = B^T A^T: a row-major matrix read column-major is
    // its transpose, so the operands swap and keep their own transpose flags.
    const char ta = b.t ? 'T' : 'N', tb = a.t ? 'T' : 'N';
    const int mi = static_cast<int>(n), ni = static_cast<int>(m), ki = static_cast<int>(k);
    const int lda = static_cast<int>(b.ld), ldb = static_cast<int>(a.ld), ldci = static_cast<int>(ldc);
    const float one = 1.0f;
    sgemm(&ta, &tb, &mi, &ni, &ki, &one, b.data, &lda, a.data, &ldb, &beta, c, &ldci);
    return;
  }
  torch::Tensor out = torch::from_blob(c, {m, n}, {ldc, 1});
  if (beta == 0.0f) {
    at::mm_out(out, a.View(), b.View());
  } else {
    at::addmm_out(out, out, a.View(), b.View(), beta);
  }
}

// Row block [r0, r0 + n) of one head's causal softmax(mask + q k^T) into s (n x (r0 + n), rows
// r0 + n apart): qh (T x dk) and kg (T x dk) row-major, mask (T x T). `s_view`: s as a tensor,
// for ATen's vectorised softmax.
void CausalProbsBlock(SgemmFn sgemm, float* s, torch::Tensor& s_view, const float* mask, int64_t T,
                      const float* qh, const float* kg, int64_t dk, int64_t r0, int64_t n) {
  const int64_t r1 = r0 + n;
  for (int64_t i = 0; i < n; ++i) {
    std::copy(mask + (r0 + i) * T, mask + (r0 + i) * T + r1, s + i * r1);
  }
  BlockGemm(sgemm, {qh + r0 * dk, n, dk, dk}, {kg, r1, dk, dk, /*t=*/true}, 1.0f, s, r1);  // + q k^T
  at::_softmax_out(s_view, s_view, 1, false);
}

// One (n x r1) tensor view of a row block's scratch per block index: made once per thread.
std::vector<torch::Tensor> BlockViews(float* scratch, int64_t T) {
  std::vector<torch::Tensor> views;
  for (int64_t r0 = 0; r0 < T; r0 += kCausalBlock) {
    const int64_t n = std::min(kCausalBlock, T - r0);
    views.push_back(torch::from_blob(scratch, {n, r0 + n}));
  }
  return views;
}

// Group `g` of the B * KV the attention kernels split over: its batch, its KV head, and where its
// K (T, dk) starts in k (B, KV, T, dk) and its V (T, dk, rows KV * dk apart) in v (B, T, KV, dk).
// dK and dV have k's and v's layout, so the backward writes them at the same offsets.
struct KvGroup {
  int64_t b, kvh, k_at, v_at;
};

KvGroup KvGroupAt(int64_t g, int64_t KV, int64_t T, int64_t dk) {
  const int64_t b = g / KV, kvh = g % KV;
  return {b, kvh, (b * KV + kvh) * T * dk, (b * T * KV + kvh) * dk};
}

class CausalAttentionCpu : public torch::autograd::Function<CausalAttentionCpu> {
 public:
  static torch::autograd::tensor_list forward(torch::autograd::AutogradContext* ctx,
                                              const torch::Tensor& q_in, const torch::Tensor& k_in,
                                              const torch::Tensor& v_in,
                                              const torch::Tensor& mask_in, bool with_probs) {
    const torch::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous(),
                        mask = mask_in.contiguous();
    const int64_t B = q.size(0), H = q.size(1), T = q.size(2), dk = q.size(3), KV = k.size(1);
    // The raw-pointer walk below reads out of bounds on any other shape.
    TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && mask.dim() == 2,
                "CausalAttention: q, k, v must be 4-d and mask 2-d");
    TORCH_CHECK(KV > 0 && H % KV == 0, "CausalAttention: ", H, " query heads for ", KV,
                " KV heads");
    TORCH_CHECK(k.sizes() == torch::IntArrayRef({B, KV, T, dk}) &&
                    v.sizes() == torch::IntArrayRef({B, T, KV, dk}) &&
                    mask.sizes() == torch::IntArrayRef({T, T}),
                "CausalAttention: k ", k.sizes(), ", v ", v.sizes(), ", mask ", mask.sizes(),
                " do not fit q ", q.sizes());
    TORCH_CHECK(k.scalar_type() == torch::kFloat32 && v.scalar_type() == torch::kFloat32 &&
                    mask.scalar_type() == torch::kFloat32,
                "CausalAttention: the fused CPU kernel takes fp32 q, k, v and mask");
    torch::Tensor out = torch::empty({B, T, H, dk}, q.options());
    torch::Tensor probs = with_probs ? torch::empty({B, H, T, T}, q.options()) : torch::Tensor();
    float* const probs_data = with_probs ? probs.data_ptr<float>() : nullptr;
    const float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
    const float* mp = mask.data_ptr<float>();
    float* const op = out.data_ptr<float>();
    const SgemmFn sgemm = Sgemm();
    at::parallel_for(0, B * KV, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> scratch(static_cast<size_t>(kCausalBlock * T));  // one row block
      std::vector<torch::Tensor> views = BlockViews(scratch.data(), T);
      float* const s = scratch.data();
      for (int64_t g = begin; g < end; ++g) {
        const auto [b, kvh, k_at, v_at] = KvGroupAt(g, KV, T, dk);
        const float *kg = kp + k_at, *vg = vp + v_at;
        for (int64_t h = kvh * (H / KV); h < (kvh + 1) * (H / KV); ++h) {
          const float* qh = qp + (b * H + h) * T * dk;  // (T, dk)
          float* o = op + (b * T * H + h) * dk;         // (T, dk), rows H * dk apart
          for (int64_t r0 = 0, block = 0; r0 < T; r0 += kCausalBlock, ++block) {
            const int64_t n = std::min(kCausalBlock, T - r0), r1 = r0 + n;
            CausalProbsBlock(sgemm, s, views[block], mp, T, qh, kg, dk, r0, n);
            BlockGemm(sgemm, {s, n, r1, r1}, {vg, r1, dk, KV * dk}, 0.0f, o + r0 * H * dk, H * dk);
            if (probs_data == nullptr) continue;
            for (int64_t i = 0; i < n; ++i) {
              float* row = probs_data + ((b * H + h) * T + r0 + i) * T;
              std::copy(s + i * r1, s + (i + 1) * r1, row);
              std::fill(row + r1, row + T, 0.0f);
            }
          }
        }
      }
    });
    ctx->save_for_backward({q, k, v, mask});
    ctx->set_materialize_grads(false);  // no (B, H, T, T) zero gradient for probs
    if (!with_probs) return {out};
    ctx->mark_non_differentiable({probs});
    return {out, probs};
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto [saved, grad_out] = ReadBackwardInputs(ctx, grads);  // grad_out: (B, T, H, dk)
    const torch::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &mask = saved[3];
    const int64_t B = q.size(0), H = q.size(1), T = q.size(2), dk = q.size(3), KV = k.size(1);
    torch::Tensor dq = torch::empty_like(q), dk_all = torch::zeros_like(k),
                  dv_all = torch::zeros_like(v);
    const float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
    const float *mp = mask.data_ptr<float>(), *gp = grad_out.data_ptr<float>();
    float *dqp = dq.data_ptr<float>(), *dkp = dk_all.data_ptr<float>(),
          *dvp = dv_all.data_ptr<float>();
    const SgemmFn sgemm = Sgemm();
    at::parallel_for(0, B * KV, 1, [&](int64_t begin, int64_t end) {
      // One row block's probabilities P, and dP then dS.
      std::vector<float> p_scratch(static_cast<size_t>(kCausalBlock * T)), ds(p_scratch.size());
      std::vector<torch::Tensor> views = BlockViews(p_scratch.data(), T);
      float* const p = p_scratch.data();
      for (int64_t g = begin; g < end; ++g) {
        const auto [b, kvh, k_at, v_at] = KvGroupAt(g, KV, T, dk);
        const float *kg = kp + k_at, *vg = vp + v_at;
        float *dkg = dkp + k_at, *dvg = dvp + v_at;
        for (int64_t h = kvh * (H / KV); h < (kvh + 1) * (H / KV); ++h) {
          const float* qh = qp + (b * H + h) * T * dk;
          const float* go = gp + (b * T * H + h) * dk;  // (T, dk), rows H * dk apart
          float* dqh = dqp + (b * H + h) * T * dk;
          for (int64_t r0 = 0, block = 0; r0 < T; r0 += kCausalBlock, ++block) {
            const int64_t n = std::min(kCausalBlock, T - r0), r1 = r0 + n;
            CausalProbsBlock(sgemm, p, views[block], mp, T, qh, kg, dk, r0, n);
            const Mat gob{go + r0 * H * dk, n, dk, H * dk};  // (n, dk)
            BlockGemm(sgemm, {p, n, r1, r1, /*t=*/true}, gob, 1.0f, dvg, KV * dk);  // dV += P^T dO
            BlockGemm(sgemm, gob, {vg, r1, dk, KV * dk, /*t=*/true}, 0.0f, ds.data(), r1);  // dP = dO V^T
            float* dsp = ds.data();
            for (int64_t i = 0; i < n * r1; i += r1) {  // dS = P (dP - rowsum(dP P))
              float dot = 0;
              for (int64_t j = i; j < i + r1; ++j) dot += dsp[j] * p[j];
              for (int64_t j = i; j < i + r1; ++j) dsp[j] = p[j] * (dsp[j] - dot);
            }
            const Mat dsm{dsp, n, r1, r1};
            BlockGemm(sgemm, dsm, {kg, r1, dk, dk}, 0.0f, dqh + r0 * dk, dk);  // dQ = dS K
            BlockGemm(sgemm, {dsp, n, r1, r1, /*t=*/true}, {qh + r0 * dk, n, dk, dk}, 1.0f, dkg,
                      dk);  // dK += dS^T Q
          }
        }
      }
    });
    return {dq, dk_all, dv_all, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

int KernelThreads() {
  // One item per thread, grain 1: each thread that takes part runs its chunk once.
  std::atomic<int> ran{0};
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) { ++ran; });
  return ran.load();
}

void UseAtenProductsForTesting(bool on) { aten_products_for_testing.store(on); }

bool AttentionHasSgemm() { return FoundSgemm() != nullptr; }

torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  if (!Fusable(x) || !Fusable(weight)) return reference::RmsNorm(x, weight, eps);
  return RmsNormCpu::apply(x, weight, eps);
}

torch::Tensor RopeToHeads(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                          double scale) {
  if (!Fusable(x) || !Fusable(cos)) return reference::RopeToHeads(x, cos, sin, scale);
  const int64_t T = x.size(1);
  return RopeCpu::apply(x, cos.slice(0, 0, T), sin.slice(0, 0, T), scale);
}

torch::Tensor SiluMul(const torch::Tensor& a, const torch::Tensor& b) {
  if (!Fusable(a) || !Fusable(b) || a.sizes() != b.sizes()) return reference::SiluMul(a, b);
  return SiluMulCpu::apply(a, b);
}

torch::Tensor SigmoidGate(const torch::Tensor& y, const torch::Tensor& logits) {
  const bool shapes_fit =
      y.dim() == logits.dim() && y.dim() >= 1 &&
      y.sizes().slice(0, y.dim() - 1) == logits.sizes().slice(0, y.dim() - 1) &&
      (logits.size(-1) == y.size(-1) || logits.size(-1) == 1);
  if (!Fusable(y) || !Fusable(logits) || !shapes_fit) return reference::SigmoidGate(y, logits);
  return SigmoidGateCpu::apply(y, logits);
}

std::pair<torch::Tensor, torch::Tensor> CausalAttention(const torch::Tensor& q,
                                                        const torch::Tensor& k,
                                                        const torch::Tensor& v,
                                                        const torch::Tensor& mask,
                                                        bool with_probs) {
  if (!q.is_cpu() || q.scalar_type() != torch::kFloat32) {
    auto [out, probs] = reference::CausalAttention(q, k, v, mask);
    return {out, with_probs ? probs : torch::Tensor()};
  }
  torch::autograd::tensor_list r =
      CausalAttentionCpu::apply(q, k, v.contiguous(), mask, with_probs);
  return {r[0], with_probs ? r[1] : torch::Tensor()};
}

}  // namespace ablate
