// Users' queries against scheduling (issue 20, item 6), side by side in one run: the latency of a
// worker's Finish that takes its next job (CoordinatorCore::Finish with acquire_next, the hot
// path of dispatch), and of GetSweep (`ablate status`, the dashboard), with no query running,
// then while four runaway queries run (each `ablate query` at its 10 s time limit, back to back).
// The coordinator is restarted after the submit, so that each dispatch reads its run's stored
// config (as after any restart, retry or rerun): every Finish reads the store.
//
// The coordinator's users' SQL has its own pool of two connections, so at most two of the four
// run and the others wait (query_wait) and fail "busy"; the typed reads a Finish makes keep the
// four connections of their own pool. Printed: p50, p99 and max per phase, their ratio, and how
// the runaway queries ended.
//
//   bench_query_isolation [--jobs 300] [--queries 4]
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/binary_init.h"
#include "common/version.h"
#include "orchestrator/coordinator/server.h"

namespace ablate {
namespace {

std::string Spec(int runs) {
  std::string seeds;
  for (int i = 0; i < runs; ++i) absl::StrAppend(&seeds, i ? ", " : "", i);
  return absl::StrCat(R"(sweep: isolation
base:
  model: {d_model: 64, num_layers: 2, num_heads: 4, num_kv_heads: 4, head_dim: 16,
          ffn_dim: 256, max_seq_len: 64}
  train: {steps: 10, batch_size: 2, seq_len: 64, threads: 1}
variants: [baseline]
seeds: [)", seeds, "]\n");
}

struct Percentiles {
  double p50 = 0, p99 = 0, max = 0;
};

Percentiles Of(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  Percentiles p;
  if (ms.empty()) return p;
  p.p50 = ms[ms.size() / 2];
  p.p99 = ms[std::min(ms.size() - 1, ms.size() * 99 / 100)];
  p.max = ms.back();
  return p;
}

// Finishes `jobs` jobs one after the other, each Finish taking the next; returns each Finish's
// latency in ms. `job` is the worker's current job (replaced by the next).
std::vector<double> Dispatch(CoordinatorCore* core, int64_t worker, Job* job, int jobs) {
  std::vector<double> ms;
  for (int i = 0; i < jobs && job->run_id() != 0; ++i) {
    FinishRequest finish;
    finish.set_worker_id(worker);
    finish.set_run_id(job->run_id());
    finish.set_attempt(job->attempt());
    finish.set_lease_secret(job->lease_secret());
    finish.set_acquire_next(true);
    RunSummary* s = finish.mutable_summary();
    s->set_state(SUCCEEDED);
    s->set_steps_done(10);
    const absl::Time start = absl::Now();
    absl::StatusOr<FinishResponse> r = core->Finish(finish);
    ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
    if (!r.ok()) {
      std::fprintf(stderr, "finish: %s\n", std::string(r.status().message()).c_str());
      std::exit(1);
    }
    *job = r->next_job();
  }
  return ms;
}

int Main(int argc, char** argv) {
  int jobs = 300, queries = 4;
  CLI::App app("Finish latency with and without runaway users' queries");
  app.add_option("--jobs", jobs, "jobs finished per phase")->capture_default_str();
  app.add_option("--queries", queries, "runaway queries in the second phase")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / absl::StrCat("bench_query_isolation.", getpid());
  ServerOptions options;
  options.state_dir = dir.string();
  options.port = 0;
  options.synchronous_full = false;
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> server = CoordinatorServer::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", std::string(server.status().message()).c_str());
    return 1;
  }
  CoordinatorCore* core = (*server)->core();
  SubmitRequest submit;
  submit.set_spec_yaml(Spec(2 * jobs + 1));
  if (absl::StatusOr<SubmitResponse> r = core->Submit(submit); !r.ok()) {
    std::fprintf(stderr, "submit: %s\n", std::string(r.status().message()).c_str());
    return 1;
  }
  // Restarted: the queued runs' jobs are made from the store when dispatched.
  server->reset();
  server = CoordinatorServer::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", std::string(server.status().message()).c_str());
    return 1;
  }
  core = (*server)->core();
  RegisterRequest reg;
  reg.set_name("bench");
  reg.mutable_resources()->set_code_version(ablate::CodeVersion());
  const RegisterResponse registered = *core->Register(reg);
  const int64_t worker = registered.worker_id();
  AcquireJobRequest acquire;
  acquire.set_worker_id(worker);
  acquire.set_worker_secret(registered.worker_secret());
  Job job = core->AcquireJob(acquire)->job();

  GetSweepRequest get;
  get.set_sweep("isolation");
  const auto status_calls = [&] {
    std::vector<double> ms;
    for (int i = 0; i < 50; ++i) {
      const absl::Time start = absl::Now();
      if (!core->GetSweep(get).ok()) std::exit(1);
      ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
    }
    return Of(ms);
  };
  const Percentiles quiet = Of(Dispatch(core, worker, &job, jobs));
  const Percentiles quiet_status = status_calls();

  std::atomic<bool> stop{false};
  std::map<std::string, int> endings;
  absl::Mutex mu;
  std::vector<std::thread> runaway;
  for (int i = 0; i < queries; ++i) {
    runaway.emplace_back([&] {
      while (!stop.load()) {
        QueryRequest q;
        q.set_sql(
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
            "SELECT count(*) FROM c");
        absl::StatusOr<QueryResponse> r = core->Query(q);
        absl::MutexLock lock(&mu);
        ++endings[r.ok() ? "OK" : absl::StatusCodeToString(r.status().code())];
      }
    });
  }
  absl::SleepFor(absl::Milliseconds(500));  // the queries hold their connections
  const Percentiles loaded = Of(Dispatch(core, worker, &job, jobs));
  const Percentiles loaded_status = status_calls();
  stop = true;
  for (std::thread& t : runaway) t.join();
  (*server)->Shutdown();
  server->reset();
  std::filesystem::remove_all(dir);

  std::printf("Finish (acquire_next) latency, %d jobs per phase\n", jobs);
  std::printf("  %-28s p50 %7.2f ms  p99 %7.2f ms  max %7.2f ms\n", "no queries", quiet.p50,
              quiet.p99, quiet.max);
  std::printf("  %-28s p50 %7.2f ms  p99 %7.2f ms  max %7.2f ms\n",
              absl::StrCat(queries, " runaway queries").c_str(), loaded.p50, loaded.p99,
              loaded.max);
  std::printf("  ratio (loaded / quiet): p50 %.2fx, p99 %.2fx\n", loaded.p50 / quiet.p50,
              loaded.p99 / quiet.p99);
  std::printf("GetSweep (ablate status) latency, 50 calls per phase\n");
  std::printf("  %-28s p50 %7.2f ms  p99 %7.2f ms  max %7.2f ms\n", "no queries",
              quiet_status.p50, quiet_status.p99, quiet_status.max);
  std::printf("  %-28s p50 %7.2f ms  p99 %7.2f ms  max %7.2f ms\n",
              absl::StrCat(queries, " runaway queries").c_str(), loaded_status.p50,
              loaded_status.p99, loaded_status.max);
  std::printf("  the runaway queries ended:");
  for (const auto& [how, n] : endings) std::printf(" %s x%d", how.c_str(), n);
  std::printf("\n");
  return 0;
}

}  // namespace
}  // namespace ablate

int main(int argc, char** argv) {
  ablate::InitBinary();
  return ablate::Main(argc, argv);
}
