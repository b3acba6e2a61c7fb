// The run the trainer's and the agent's tests train: a tiny g1_elementwise model (TinyDense with
// a 256-byte vocabulary and 32-token windows) on a corpus file, on one thread, evaluating every
// 20 steps and checkpointing every 10; small enough that a test trains hundreds of steps. Each
// test then changes only what it is about.
#ifndef ABLATE_TESTS_WORKER_TINY_RUN_CONFIG_H_
#define ABLATE_TESTS_WORKER_TINY_RUN_CONFIG_H_

#include <cstdint>
#include <filesystem>

#include <gtest/gtest.h>

#include "config/model_config.h"
#include "config/presets.h"
#include "proto/ablate.pb.h"
#include "tests/test_configs.h"

namespace ablate::testing {

inline RunConfig TinyRunConfig(const std::filesystem::path& corpus, int64_t steps) {
  RunConfig r;
  *r.mutable_model() = TinyDense();
  EXPECT_TRUE(FindVariantPreset("g1_elementwise")->apply(r.mutable_model()).ok());
  r.mutable_model()->set_vocab_size(256);
  r.mutable_model()->set_max_seq_len(32);
  *r.mutable_train() = DefaultTrainConfig();
  TrainConfig* t = r.mutable_train();
  t->mutable_data()->set_path(corpus.string());
  t->set_steps(steps);
  t->set_batch_size(4);
  t->set_seq_len(32);
  t->set_eval_every(20);
  t->set_eval_batches(2);
  t->set_checkpoint_every(10);
  t->set_threads(1);
  t->mutable_optimizer()->set_lr(1e-2);
  t->mutable_optimizer()->set_warmup_steps(5);
  return r;
}

}  // namespace ablate::testing

#endif  // ABLATE_TESTS_WORKER_TINY_RUN_CONFIG_H_
