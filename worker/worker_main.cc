// ablate-worker: `train` runs one config standalone. (The coordinator agent mode,
// `--coordinator HOST:PORT`, comes with the coordinator.)
#include <CLI/CLI.hpp>

#include "worker/standalone.h"

int main(int argc, char** argv) {
  CLI::App app{"ablate-worker: trains ablate runs (LibTorch, CPU or CUDA)"};
  app.require_subcommand(1);
  ablate::StandaloneOptions train;
  CLI::App* cmd = app.add_subcommand("train", "train one run from a config file, no coordinator");
  cmd->add_option("--config", train.config_path, "RunConfig as YAML or JSON (model:, train:)");
  cmd->add_option("--out", train.out_dir, "output directory (config, metrics.jsonl, summary, checkpoint)");
  cmd->add_option("--resume", train.resume_dir, "continue the run in this output directory");
  cmd->add_option("--device", train.device, "cpu, cuda or cuda:N (overrides train.device)");
  cmd->add_option("--threads", train.threads, "intra-op threads, 0 = all cores (overrides train.threads)");
  int code = 0;
  cmd->callback([&] { code = ablate::RunStandalone(train); });
  CLI11_PARSE(app, argc, argv);
  return code;
}
