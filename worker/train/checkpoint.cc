#include "worker/train/checkpoint.h"

#include <filesystem>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/durable_file.h"

namespace ablate {

namespace fs = std::filesystem;

namespace {

// The source checkpoint's model tensors, by dotted name (its archive nests a module's children).
void ListTensors(torch::serialize::InputArchive& archive, const std::string& prefix,
                 std::map<std::string, torch::Tensor>* out) {
  for (const std::string& key : archive.keys()) {
    torch::Tensor tensor;
    if (archive.try_read(key, tensor)) {
      (*out)[prefix + key] = tensor;
      continue;
    }
    torch::serialize::InputArchive child;
    if (archive.try_read(key, child)) ListTensors(child, prefix + key + ".", out);
  }
}

// `path` moved aside under a name of its own (so that an earlier torn file is kept too); its
// new name. ENOENT counts as done: another worker moved it.
absl::StatusOr<std::string> MoveAside(const std::string& path) {
  const std::string stamp = absl::FormatTime("%Y%m%dT%H%M%S", absl::Now(), absl::UTCTimeZone());
  std::string aside = absl::StrCat(path, ".corrupt-", stamp);
  for (int n = 1; fs::exists(aside); ++n) aside = absl::StrCat(path, ".corrupt-", stamp, ".", n);
  std::error_code ec;
  fs::rename(path, aside, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) {
    return absl::InternalError(absl::StrCat("cannot move it aside to ", aside, ": ", ec.message()));
  }
  return aside;
}

}  // namespace

std::string CheckpointArchive::Path() const { return (fs::path(dir_) / "checkpoint.pt").string(); }

std::string CheckpointArchive::PreviousPath() const {
  return (fs::path(dir_) / "checkpoint.prev.pt").string();
}

absl::Status CheckpointArchive::Save(bool writer, TransformerImpl& model,
                                     TrainingOptimizer& optimizer, const TrainingProgress& progress,
                                     double elapsed_s) {
  if (!writer) return optimizer.Save(nullptr, dir_, progress.step);
  fs::create_directories(dir_);
  torch::serialize::OutputArchive archive;
  torch::serialize::OutputArchive model_archive;
  model.save(model_archive);
  archive.write("model", model_archive);
  if (absl::Status st = optimizer.Save(&archive, dir_, progress.step); !st.ok()) {
    return absl::Status(st.code(), absl::StrCat("checkpoint: ", st.message()));
  }
  auto i64 = [](int64_t v) { return torch::tensor({v}, torch::kLong); };
  archive.write("step", i64(progress.step));
  archive.write("data_offset", i64(progress.data_offset));
  archive.write("rollbacks", i64(progress.rollbacks));
  archive.write("spike_steps", i64(progress.spike_steps));
  archive.write("elapsed_s", torch::tensor({elapsed_s}, torch::kFloat64));
  archive.write("loss_history", torch::tensor(progress.loss_history, torch::kFloat64));
  archive.write("grad_history", torch::tensor(progress.grad_history, torch::kFloat64));
  archive.write("rng", at::detail::getDefaultCPUGenerator().get_state());
  absl::Status saved = ReplaceFileDurably(
      Path(),
      [&](const std::string& tmp) {
        try {
          archive.save_to(tmp);
        } catch (const c10::Error& e) {
          return absl::InternalError(
              absl::StrCat("cannot write ", tmp, ": ", e.what_without_backtrace()));
        }
        return absl::OkStatus();
      },
      PreviousPath());
  if (!saved.ok()) {
    return absl::Status(saved.code(), absl::StrCat("checkpoint: ", saved.message()));
  }
  RemoveStaleShardedStates(step_, progress.step);
  step_ = progress.step;
  return absl::OkStatus();
}

void CheckpointArchive::RemoveStaleShardedStates(int64_t previous, int64_t current) const {
  std::error_code ec;
  std::map<int64_t, fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    int64_t at = 0;
    if (absl::StartsWith(name, "optimizer-") && absl::EndsWith(name, ".bin") &&
        absl::SimpleAtoi(name.substr(10, name.size() - 14), &at)) {
      files[at] = entry.path();
    }
  }
  if (previous < 0) {
    auto below = files.lower_bound(current);
    if (below != files.begin()) previous = std::prev(below)->first;
  }
  for (const auto& [at, path] : files) {
    if (at != current && at != previous) fs::remove(path, ec);
  }
}

absl::Status CheckpointArchive::Load(const std::string& path, torch::Device device,
                                     TransformerImpl& model, TrainingOptimizer& optimizer,
                                     TrainingProgress* progress) {
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(path, device);
    torch::serialize::InputArchive model_archive;
    archive.read("model", model_archive);
    model.load(model_archive);
    auto i64 = [&](const char* key) {
      torch::Tensor t;
      archive.read(key, t);
      return t.item<int64_t>();
    };
    const int64_t saved_step = i64("step");
    optimizer.Load(archive, dir_, saved_step);
    progress->step = saved_step;
    step_ = saved_step;
    progress->data_offset = i64("data_offset");
    progress->rollbacks = i64("rollbacks");
    progress->spike_steps = i64("spike_steps");
    torch::Tensor elapsed;  // absent from checkpoints written before it was kept
    progress->elapsed_before =
        archive.try_read("elapsed_s", elapsed) ? elapsed.item<double>() : 0.0;
    auto history = [&](const char* key) {
      torch::Tensor t;
      archive.read(key, t);
      t = t.to(torch::kCPU).contiguous();
      return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
    };
    progress->loss_history = history("loss_history");
    progress->grad_history = history("grad_history");
    torch::Tensor rng;
    archive.read("rng", rng);
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    generator.set_state(rng.to(torch::kCPU));
  } catch (const c10::Error& e) {
    return absl::DataLossError(
        absl::StrCat(path, ": unreadable checkpoint: ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat(path, ": unreadable checkpoint: ", e.what()));
  }
  if (static_cast<int64_t>(progress->loss_history.size()) != progress->step) {
    return absl::DataLossError(absl::StrCat(path, ": history has ", progress->loss_history.size(),
                                            " steps, checkpoint says ", progress->step));
  }
  return absl::OkStatus();
}

absl::Status CheckpointArchive::LoadNewestGood(
    bool writer, const std::function<absl::Status(const std::string& path)>& load,
    const std::function<absl::Status()>& rebuild, std::vector<std::string>* notices) {
  std::vector<std::string> bad;
  bool loaded = false;
  for (const std::string& path : {Path(), PreviousPath()}) {
    if (!fs::exists(path)) continue;
    absl::Status st = load(path);
    if (st.ok()) {
      loaded = true;
      if (!bad.empty()) {
        bad.back() +=
            absl::StrCat("; resumed from ", fs::path(path).filename().string(), " at step ", step_);
      }
      break;
    }
    if (!absl::IsDataLoss(st)) return st;
    if (writer) {  // rank 0 moves it aside and reports it; the others fall back alike
      absl::StatusOr<std::string> aside = MoveAside(path);
      if (!aside.ok()) {
        return absl::Status(st.code(), absl::StrCat(st.message(), "; ", aside.status().message()));
      }
      bad.push_back(absl::StrCat(st.message(), ": moved aside to ", *aside));
    }
    if (absl::Status built = rebuild(); !built.ok()) return built;  // undo the partial load
  }
  if (!loaded && !bad.empty()) bad.back() += "; no readable checkpoint left: starting from step 0";
  for (std::string& line : bad) notices->push_back(std::move(line));
  return absl::OkStatus();
}

absl::StatusOr<std::string> InitFromCheckpoint(const std::string& path, torch::Device device,
                                               TransformerImpl& model, double out_scale) {
  if (!fs::exists(path)) {
    return absl::NotFoundError(absl::StrCat("train.init_from.checkpoint: no file ", path));
  }
  std::map<std::string, torch::Tensor> source;
  try {
    torch::serialize::InputArchive archive, model_archive;
    archive.load_from(path, device);
    archive.read("model", model_archive);
    ListTensors(model_archive, "", &source);
  } catch (const c10::Error& e) {
    return absl::DataLossError(
        absl::StrCat("train.init_from.checkpoint: ", path,
                     " is not a readable checkpoint: ", e.what_without_backtrace()));
  }
  std::set<std::string> buffers;
  for (const auto& b : model.named_buffers()) buffers.insert(b.key());
  std::vector<std::string> fresh, dropped;
  std::set<std::string> used;
  torch::NoGradGuard no_grad;
  for (auto& p : model.named_parameters()) {
    auto it = source.find(p.key());
    if (it == source.end()) {
      fresh.push_back(p.key());
      continue;
    }
    if (it->second.sizes() != p.value().sizes()) {
      return absl::InvalidArgumentError(
          absl::StrCat("train.init_from: parameter ", p.key(), " is ", c10::str(it->second.sizes()),
                       " in ", path, " but ", c10::str(p.value().sizes()), " in this config"));
    }
    p.value().copy_(it->second);
    used.insert(p.key());
  }
  for (const auto& [name, tensor] : source) {
    if (!used.count(name) && !buffers.count(name)) dropped.push_back(name);
  }
  if (!dropped.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.init_from: this config has no ", absl::StrJoin(dropped, ", "), " of ",
                     path, " (continued training may add parameters, never drop trained ones)"));
  }
  std::string scaled;
  if (out_scale != 1.0) {  // preserve_function: W_O takes over the added gate's starting score
    int gates = 0, outputs = 0;
    for (auto& p : model.named_parameters()) {
      if (p.key().find(".attn.gate.") != std::string::npos) {
        if (used.count(p.key()) > 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "train.init_from.preserve_function: ", path, " already has the gate (", p.key(),
              "): there is no added gate whose starting score W_O could take over"));
        }
        ++gates;
      }
    }
    if (gates == 0) {
      return absl::InvalidArgumentError(
          "train.init_from.preserve_function: this config adds no attention gate");
    }
    for (auto& p : model.named_parameters()) {
      if (absl::EndsWith(p.key(), ".attn.o_proj.weight") && used.count(p.key()) > 0) {
        p.value().mul_(out_scale);
        ++outputs;
      }
    }
    scaled = absl::StrCat("; W_O of ", outputs, " layers multiplied by ", out_scale,
                          " (train.init_from.preserve_function: the added gate starts at ",
                          1.0 / out_scale, ")");
  }
  return absl::StrCat(
      "initialised from ", path, ": ", used.size(), " parameter tensors loaded",
      fresh.empty() ? ""
                    : absl::StrCat("; fresh (this config adds them): ", absl::StrJoin(fresh, ", ")),
      scaled);
}

}  // namespace ablate
