// What the trainer measures at its evaluation steps, as functions of a model, the data and the
// run's config with no trainer state: the validation loss with the model's probes and attention
// maps, and the loss at each of train.eval_seq_lens. The loss both training and evaluation take
// (ModelLoss) lives here too, so the two cannot drift apart.
//
// Worker-internal (includes LibTorch). Called on the training thread.
#ifndef ABLATE_WORKER_TRAIN_EVALUATION_H_
#define ABLATE_WORKER_TRAIN_EVALUATION_H_

#include <torch/torch.h>

#include <cstdint>

#include "absl/status/statusor.h"
#include "proto/ablate.pb.h"
#include "worker/model/probes.h"
#include "worker/model/transformer.h"
#include "worker/train/data.h"

namespace ablate {

// The model's mean cross-entropy on tokens x against targets y (and its auxiliary loss into
// *aux when given), recording probes into `probes` when given: from the whole logits, or
// `loss_chunk_tokens` of them at a time (train.loss_chunk_tokens; 0: whole). With `autocast`,
// the forward pass runs under CUDA's bf16 autocast (the trainer asks for it on CUDA only: CPU
// bf16 matmuls are slower than fp32 on most CPUs); a backward pass of the result runs outside it.
torch::Tensor ModelLoss(TransformerImpl& model, const torch::Tensor& x, const torch::Tensor& y,
                        int64_t loss_chunk_tokens, bool autocast, ProbeRecorder* probes = nullptr,
                        torch::Tensor* aux = nullptr);

// Inputs and targets of batch `index` of `split`: train.batch_size windows of `seq_len` tokens
// (0: train.seq_len), on `device`.
std::pair<torch::Tensor, torch::Tensor> GetBatch(const TokenData& data, const TrainConfig& train,
                                                 TokenData::Split split, int64_t index,
                                                 torch::Device device, int64_t seq_len = 0);

// The evaluation of `model` at `step` (leaving it in training mode): the mean validation loss
// over train.eval_batches batches with the model's probes and attention maps, for each of
// train.eval_seq_lens the loss over the same text (EvalLengthSpan tokens from the start of the
// validation split) cut into windows of that length, with YaRN as model.yarn says, and the
// metrics of the tasks of train.evals (eval_tasks.h) in EvalResult.metrics. An error is the
// tasks' (RunEvalTasks): the run cannot report what it was asked to measure.
absl::StatusOr<EvalResult> Evaluate(TransformerImpl& model, const TokenData& data,
                                    const RunConfig& config, torch::Device device, bool autocast,
                                    int64_t step);

}  // namespace ablate

#endif  // ABLATE_WORKER_TRAIN_EVALUATION_H_
