#include "orchestrator/cluster/slurm.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "orchestrator/cluster/process.h"

extern char** environ;

namespace ablate {

namespace fs = std::filesystem;

namespace {

// Single-quoted for bash: nothing inside is expanded.
std::string ShellQuote(absl::string_view s) {
  return absl::StrCat("'", absl::StrReplaceAll(s, {{"'", "'\\''"}}), "'");
}

// An #SBATCH line ends at whitespace and cannot be quoted, so a value with whitespace (or a
// control character) would be cut or would smuggle in another directive.
absl::Status CheckDirectiveValue(absl::string_view flag, absl::string_view value) {
  for (char c : value) {
    if (absl::ascii_isspace(static_cast<unsigned char>(c)) ||
        absl::ascii_iscntrl(static_cast<unsigned char>(c))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "workers launch: ", flag, " \"", absl::CHexEscape(value),
          "\" contains whitespace or a control character (not allowed in an #SBATCH line)"));
    }
  }
  return absl::OkStatus();
}

// The sbatch options of the pilot array, as "--name=value": written as #SBATCH lines in the
// script and passed again on sbatch's command line, where they win over SBATCH_* variables the
// user's environment may hold (sbatch: command line > environment > script).
absl::StatusOr<std::vector<std::string>> PilotDirectives(const PilotScriptOptions& o) {
  if (o.count < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "workers launch: --count must be at least 1 (pilots to start), got ", o.count));
  }
  if (o.cpus_per_task < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("workers launch: --cpus-per-task must be at least 1, got ", o.cpus_per_task));
  }
  if (o.signal_before_s < 0 || o.signal_before_s > 65535) {
    // SLURM's --signal offset is a 16-bit number of seconds.
    return absl::InvalidArgumentError(absl::StrCat(
        "workers launch: --signal-before must be 0..65535 seconds, got ", o.signal_before_s));
  }
  if (o.idle_exit_s < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("workers launch: --idle-exit must be >= 0 seconds, got ", o.idle_exit_s));
  }
  for (const auto& [flag, path] :
       {std::pair<const char*, const std::string&>{"--log-dir", o.log_dir},
        {"--worker-bin", o.worker_bin}}) {
    if (!fs::path(path).is_absolute()) {
      return absl::InvalidArgumentError(
          absl::StrCat("workers launch: ", flag, " \"", path,
                       "\" must be an absolute path (pilots start elsewhere)"));
    }
  }
  if (o.coordinator.empty()) {
    return absl::InvalidArgumentError("workers launch: the coordinator's HOST:PORT is empty");
  }
  for (const auto& [flag, value] :
       {std::pair<const char*, const std::string&>{"--partition", o.partition},
        {"--gres", o.gres},
        {"--time", o.time},
        {"--mem", o.mem},
        {"--log-dir", o.log_dir}}) {
    if (absl::Status s = CheckDirectiveValue(flag, value); !s.ok()) return s;
  }
  std::vector<std::string> d = {
      absl::StrCat("--job-name=", kPilotJobName),
      absl::StrCat("--array=0-", o.count - 1),
      absl::StrCat("--output=", (fs::path(o.log_dir) / "pilot-%A_%a.log").string()),
      // B: only the batch shell, which is the worker (exec); "@": seconds before the time limit.
      absl::StrCat("--signal=B:TERM@", o.signal_before_s),
      // The token reaches the worker in the environment (ABLATE_TOKEN), with the few variables
      // a process needs, not the whole of the submitting shell's environment.
      absl::StrCat("--export=", kPilotEnvironment),
      absl::StrCat("--cpus-per-task=", o.cpus_per_task),
  };
  if (!o.partition.empty()) d.push_back(absl::StrCat("--partition=", o.partition));
  if (!o.gres.empty()) d.push_back(absl::StrCat("--gres=", o.gres));
  if (!o.time.empty()) d.push_back(absl::StrCat("--time=", o.time));
  if (!o.mem.empty()) d.push_back(absl::StrCat("--mem=", o.mem));
  return d;
}

// sbatch, squeue, sacct or scancel, with ours or `env` as the environment.
absl::StatusOr<ProgramResult> RunSlurm(const std::vector<std::string>& args,
                                       const std::vector<std::string>& env = {}) {
  return RunProgram(args, env,
                    "run ablate workers where SLURM's commands are installed (a login node; "
                    "Debian: apt-get install slurm-client)");
}

// A failed SLURM command as one line: its stderr lines joined, "sbatch: error: " prefixes dropped.
absl::Status CommandFailed(const std::string& what, const ProgramResult& r) {
  std::vector<std::string> lines;
  for (absl::string_view line : absl::StrSplit(r.err, '\n', absl::SkipWhitespace())) {
    line = absl::StripAsciiWhitespace(line);
    for (absl::string_view prefix : {"error: ", "fatal: "}) {
      const size_t at = line.find(prefix);
      if (at != absl::string_view::npos && at < 24) line.remove_prefix(at + prefix.size());
    }
    lines.emplace_back(line);
  }
  if (lines.empty()) {
    const absl::string_view out = absl::StripAsciiWhitespace(r.out);
    lines.emplace_back(out.empty() ? "no message" : out);
  }
  return absl::FailedPreconditionError(
      absl::StrCat(what, " failed (exit ", r.exit_code, "): ", absl::StrJoin(lines, "; ")));
}

fs::path SlurmDir(const std::string& state_dir) { return fs::absolute(state_dir) / "slurm"; }

// (array job, task) as numbers for sorting; ids that are not numbers sort last, as text.
std::pair<int64_t, int64_t> PilotOrder(const PilotState& p) {
  int64_t job = INT64_MAX, task = INT64_MAX;
  if (!absl::SimpleAtoi(p.array_job, &job)) job = INT64_MAX;
  const size_t underscore = p.job.find('_');
  if (underscore == std::string::npos ||
      !absl::SimpleAtoi(absl::string_view(p.job).substr(underscore + 1), &task)) {
    task = INT64_MAX;
  }
  return {job, task};
}

// Every line of `out` split at '|' into exactly `fields` fields, each line a pilot that `fill`
// makes of its fields.
absl::StatusOr<std::vector<PilotState>> ParsePilotRows(absl::string_view out, size_t fields,
                                                       const char* program,
                                                       void (*fill)(std::vector<std::string>& f,
                                                                    PilotState* p)) {
  std::vector<PilotState> pilots;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipWhitespace())) {
    line = absl::StripTrailingAsciiWhitespace(line);
    std::vector<std::string> row = absl::StrSplit(line, '|');
    if (row.size() != fields) {
      return absl::InternalError(absl::StrCat(program, ": unexpected line \"", line, "\" (",
                                              row.size(), " fields, expected ", fields, ")"));
    }
    PilotState p;
    fill(row, &p);
    pilots.push_back(std::move(p));
  }
  return pilots;
}

// The pilots of `jobs` in squeue (pending, running and recently ended ones).
absl::StatusOr<std::vector<PilotState>> SqueuePilots(const std::set<std::string>& jobs) {
  absl::StatusOr<ProgramResult> r =
      RunSlurm({"squeue", "--noheader", "--array", "--states=all",
                absl::StrCat("--name=", kPilotJobName), absl::StrCat("--format=", kSqueueFormat)});
  if (!r.ok()) return r.status();
  if (r->exit_code != 0) return CommandFailed("squeue", *r);
  absl::StatusOr<std::vector<PilotState>> all = ParseSqueue(r->out);
  if (!all.ok()) return all.status();
  std::vector<PilotState> ours;
  for (PilotState& p : *all) {
    if (jobs.count(p.array_job) > 0) ours.push_back(std::move(p));
  }
  return ours;
}

// The pilots of `jobs` in SLURM's accounting (unavailable where accounting is not configured).
absl::StatusOr<std::vector<PilotState>> SacctPilots(const std::vector<std::string>& jobs) {
  absl::StatusOr<ProgramResult> r = RunSlurm({"sacct", "--noheader", "--parsable2", "--allocations",
                                              absl::StrCat("--jobs=", absl::StrJoin(jobs, ",")),
                                              absl::StrCat("--format=", kSacctFormat)});
  if (!r.ok()) return r.status();
  if (r->exit_code != 0) return CommandFailed("sacct", *r);
  return ParseSacct(r->out);
}

}  // namespace

absl::StatusOr<std::string> PilotScript(const PilotScriptOptions& o) {
  absl::StatusOr<std::vector<std::string>> directives = PilotDirectives(o);
  if (!directives.ok()) return directives.status();
  std::string s =
      "#!/bin/bash\n"
      "# ablate pilot workers, written by `ablate workers launch --slurm` (docs/cluster.md).\n"
      "# Each array task runs one ablate-worker that pulls runs from the coordinator until none\n"
      "# came for --idle-exit seconds, or until SLURM's SIGTERM before the time limit (or from\n"
      "# scancel): the worker then checkpoints its run, hands it back and exits.\n";
  for (const std::string& d : *directives) absl::StrAppend(&s, "#SBATCH ", d, "\n");
  absl::StrAppend(
      &s,
      "\n"
      "# The token comes in the environment (sbatch --export), never on a command line or in this\n"
      "# file; nothing here turns on command tracing (xtrace), so it never reaches the log.\n"
      "if [ -z \"${ABLATE_TOKEN:-}\" ]; then\n"
      "  echo \"ablate pilot: ABLATE_TOKEN is not in the environment (submit with sbatch "
      "--export=ABLATE_TOKEN,...)\" >&2\n"
      "  exit 1\n"
      "fi\n"
      "# exec: the worker replaces this shell, so SLURM's --signal=B:TERM (sent to the batch\n"
      "# shell) reaches it, and its exit status is the job's.\n"
      "exec ",
      ShellQuote(o.worker_bin), " \\\n    --coordinator ", ShellQuote(o.coordinator),
      " \\\n    --name \"pilot-${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}\"",
      " \\\n    --idle-exit ", o.idle_exit_s);
  if (!o.device.empty()) absl::StrAppend(&s, " \\\n    --device ", ShellQuote(o.device));
  if (o.slots > 0) absl::StrAppend(&s, " \\\n    --slots ", o.slots);
  if (!o.checkpoint_root.empty()) {
    absl::StrAppend(&s, " \\\n    --checkpoint-root ", ShellQuote(o.checkpoint_root));
  }
  if (!o.tls_ca.empty()) absl::StrAppend(&s, " \\\n    --tls-ca ", ShellQuote(o.tls_ca));
  absl::StrAppend(&s, "\n");
  return s;
}

absl::StatusOr<std::string> ParseSbatchJobId(absl::string_view out) {
  absl::string_view line = absl::StripAsciiWhitespace(out);
  if (const size_t nl = line.rfind('\n'); nl != absl::string_view::npos) {
    line = line.substr(nl + 1);  // sbatch may print warnings first
  }
  line = line.substr(0, line.find(';'));  // "<id>;<cluster>" on multi-cluster setups
  int64_t id = 0;
  if (!absl::SimpleAtoi(line, &id) || id <= 0) {
    return absl::InternalError(absl::StrCat("sbatch --parsable printed \"",
                                            absl::CHexEscape(absl::StripAsciiWhitespace(out)),
                                            "\", not a job id"));
  }
  return std::to_string(id);
}

absl::StatusOr<std::vector<PilotState>> ParseSqueue(absl::string_view out) {
  return ParsePilotRows(out, 8, "squeue", [](std::vector<std::string>& f, PilotState* p) {
    p->job = std::move(f[0]);
    p->array_job = std::move(f[1]);
    p->name = std::move(f[2]);
    p->state = std::move(f[3]);
    p->time = std::move(f[4]);
    p->time_limit = std::move(f[5]);
    p->nodes = std::move(f[6]);
    // squeue keeps the last pending reason of a job that runs now: only a pending one has one.
    p->reason = f[7] == "None" || p->state != "PENDING" ? "" : std::move(f[7]);
  });
}

absl::StatusOr<std::vector<PilotState>> ParseSacct(absl::string_view out) {
  return ParsePilotRows(out, 6, "sacct", [](std::vector<std::string>& f, PilotState* p) {
    p->job = std::move(f[0]);
    p->array_job = p->job.substr(0, p->job.find('_'));
    p->name = std::move(f[1]);
    // "CANCELLED by 0": the state, without who.
    p->state = f[2].substr(0, f[2].find(' '));
    p->time = std::move(f[3]);
    p->time_limit = std::move(f[4]);
    p->nodes = f[5] == "None assigned" ? "" : std::move(f[5]);
  });
}

bool PilotActive(const PilotState& pilot) {
  static const std::set<std::string>* const kOver = new std::set<std::string>{
      "BOOT_FAIL", "CANCELLED",     "COMPLETED", "COMPLETING", "DEADLINE",     "FAILED",
      "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "REVOKED",    "SPECIAL_EXIT", "TIMEOUT"};
  return kOver->count(pilot.state) == 0;
}

std::vector<std::string> ReadPilotJobs(const std::string& state_dir) {
  std::vector<std::string> jobs;
  std::ifstream in(SlurmDir(state_dir) / "jobs");
  std::string line;
  while (std::getline(in, line)) {
    std::string id(absl::StripAsciiWhitespace(line.substr(0, line.find_first_of(" \t"))));
    if (!id.empty() && id[0] != '#' && std::find(jobs.begin(), jobs.end(), id) == jobs.end()) {
      jobs.push_back(std::move(id));
    }
  }
  return jobs;
}

namespace {

// Writes `script` to a file of this process's own in `dir` (created, with `log_dir`), to be
// renamed after the job it becomes; returns its path.
absl::StatusOr<fs::path> WritePendingScript(const fs::path& dir, const std::string& log_dir,
                                            const std::string& script) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!ec) fs::create_directories(log_dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("workers launch: cannot create ", dir.string(), ": ", ec.message()));
  }
  const fs::path pending = dir / absl::StrCat("pilots-submitting-", ::getpid(), ".sbatch");
  std::ofstream file(pending);
  file << script;
  if (!file.flush()) {
    return absl::FailedPreconditionError(
        absl::StrCat("workers launch: cannot write ", pending.string()));
  }
  return pending;
}

// sbatch's environment: ours, with the pilots' token and without what would override it.
std::vector<std::string> SbatchEnvironment(const std::string& token) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (absl::StartsWith(*e, "ABLATE_TOKEN=") || absl::StartsWith(*e, "ABLATE_COORDINATOR=")) {
      continue;
    }
    env.emplace_back(*e);
  }
  env.push_back("ABLATE_TOKEN=" + token);
  return env;
}

// Submits the script at `script` with `directives` and then the --extra arguments (theirs win);
// returns the array job's id. A script sbatch refused is removed.
absl::StatusOr<std::string> SubmitPilots(const std::vector<std::string>& directives,
                                         const std::string& extra, const fs::path& script,
                                         const std::string& token) {
  std::vector<std::string> args = {"sbatch", "--parsable"};
  args.insert(args.end(), directives.begin(), directives.end());
  for (absl::string_view arg : absl::StrSplit(extra, absl::ByAnyChar(" \t\n"), absl::SkipEmpty())) {
    args.emplace_back(arg);
  }
  args.push_back(script.string());
  absl::StatusOr<ProgramResult> r = RunSlurm(args, SbatchEnvironment(token));
  if (!r.ok() || r->exit_code != 0) {
    std::error_code ec;
    fs::remove(script, ec);
    return r.ok() ? CommandFailed("sbatch", *r) : r.status();
  }
  return ParseSbatchJobId(r->out);
}

// Appends `job` to `dir`/jobs, so that status and stop know it.
absl::Status RecordPilotJob(const fs::path& dir, const std::string& job, int count) {
  std::ofstream jobs(dir / "jobs", std::ios::app);
  jobs << job << "\t" << count << "\t" << static_cast<int64_t>(std::time(nullptr)) << "\n";
  if (!jobs.flush()) {
    return absl::DataLossError(absl::StrCat("workers launch: submitted SLURM job ", job,
                                            " but cannot record it in ", (dir / "jobs").string(),
                                            ": `scancel ", job, "` to stop it"));
  }
  return absl::OkStatus();
}

// What launch submitted: the job, its script and logs, and a note when the pilots are told to
// dial an address only this machine reaches.
void PrintLaunched(const PilotScriptOptions& pilot, const std::string& job, const fs::path& script,
                   std::ostream& out) {
  out << fmt::format(
             "ablate workers: submitted SLURM job {}: {} pilot{} (array 0-{}) dialling {}\n", job,
             pilot.count, pilot.count == 1 ? "" : "s", pilot.count - 1, pilot.coordinator)
      << fmt::format(
             "  script {}\n  logs   {}\n", script.string(),
             (fs::path(pilot.log_dir) / absl::StrCat("pilot-", job, "_<task>.log")).string());
  const std::string host = pilot.coordinator.substr(0, pilot.coordinator.rfind(':'));
  if (absl::StartsWith(host, "127.") || host == "localhost" || host == "[::1]") {
    out << fmt::format(
        "  note: {} is reachable from this machine only; for pilots on other nodes "
        "run `ablate serve --host 0.0.0.0` and pass --coordinator HOST:PORT\n",
        host);
  }
}

// --slurm: sbatch's own options (flags_), the rest of each pilot from the request.
class SlurmLauncher : public ClusterLauncher {
 public:
  std::string name() const override { return "slurm"; }
  std::string help() const override {
    return "submit through SLURM's sbatch (the only back end so far)";
  }
  void AddLaunchFlags(CLI::App* cmd) override {
    cmd->add_option("--partition", flags_.partition, "sbatch --partition");
    cmd->add_option("--gres", flags_.gres,
                    "sbatch --gres, e.g. gpu:1 (a GPU pilot trains on cuda)");
    cmd->add_option("--time", flags_.time, "sbatch --time, e.g. 4:00:00");
    cmd->add_option("--cpus-per-task", flags_.cpus_per_task, "sbatch --cpus-per-task")
        ->capture_default_str();
    cmd->add_option("--mem", flags_.mem, "sbatch --mem, e.g. 16G");
    cmd->add_option("--extra", extra_,
                    "more sbatch arguments, after ours (they win): --extra=\"--qos=high "
                    "--account=lab\"");
    cmd->add_option("--signal-before", flags_.signal_before_s,
                    "seconds before the time limit SLURM sends SIGTERM (the worker checkpoints "
                    "and hands its run back)")
        ->capture_default_str();
  }
  absl::Status Launch(const PilotRequest& request, std::ostream& out) override;
  absl::Status Status(const WorkersOptions& options, std::ostream& out) override;
  absl::Status Stop(const WorkersOptions& options, std::ostream& out) override;

 private:
  PilotScriptOptions flags_;  // partition, gres, time, cpus_per_task, mem, signal_before_s
  std::string extra_;         // sbatch arguments after ours, split at whitespace
};

}  // namespace

absl::Status SlurmLauncher::Launch(const PilotRequest& request, std::ostream& out) {
  PilotScriptOptions pilot = flags_;
  pilot.count = request.count;
  pilot.coordinator = request.coordinator;
  pilot.worker_bin = request.worker_bin;
  pilot.checkpoint_root = request.checkpoint_root;
  pilot.tls_ca = request.tls_ca;
  pilot.idle_exit_s = request.idle_exit_s;
  pilot.slots = request.slots;
  const fs::path dir = SlurmDir(request.state_dir);
  pilot.log_dir = request.log_dir.empty() ? dir.string() : request.log_dir;
  pilot.device = request.device;
  if (pilot.device.empty() && absl::StrContains(absl::AsciiStrToLower(pilot.gres), "gpu")) {
    pilot.device = "cuda";  // SLURM sets CUDA_VISIBLE_DEVICES: the allocated GPU is cuda:0
  }
  absl::StatusOr<std::vector<std::string>> directives = PilotDirectives(pilot);
  if (!directives.ok()) return directives.status();
  absl::StatusOr<std::string> script = PilotScript(pilot);
  if (!script.ok()) return script.status();

  absl::StatusOr<fs::path> pending = WritePendingScript(dir, pilot.log_dir, *script);
  if (!pending.ok()) return pending.status();
  absl::StatusOr<std::string> job = SubmitPilots(*directives, extra_, *pending, request.token);
  if (!job.ok()) return job.status();
  const fs::path kept = dir / absl::StrCat("pilots-", *job, ".sbatch");
  std::error_code ec;
  fs::rename(*pending, kept, ec);
  // Recorded before anything else can fail, so status and stop always know the job.
  if (absl::Status st = RecordPilotJob(dir, *job, pilot.count); !st.ok()) return st;
  PrintLaunched(pilot, *job, ec ? *pending : kept, out);
  return absl::OkStatus();
}

absl::Status SlurmLauncher::Status(const WorkersOptions& options, std::ostream& out) {
  const std::vector<std::string> jobs = ReadPilotJobs(options.state_dir);
  if (jobs.empty()) {
    if (options.format == "json") {
      out << nlohmann::json({{"jobs", nlohmann::json::array()},
                             {"pilots", nlohmann::json::array()},
                             {"active", 0}})
                 .dump(1)
          << "\n";
      return absl::OkStatus();
    }
    out << fmt::format("no pilots launched from {} (ablate workers launch --slurm)\n",
                       options.state_dir);
    return absl::OkStatus();
  }
  const std::set<std::string> wanted(jobs.begin(), jobs.end());
  absl::StatusOr<std::vector<PilotState>> pilots = SqueuePilots(wanted);
  if (!pilots.ok()) return pilots.status();

  // Jobs squeue has forgotten (ended more than MinJobAge ago): sacct, where accounting exists.
  std::vector<std::string> forgotten;
  for (const std::string& job : jobs) {
    if (std::none_of(pilots->begin(), pilots->end(),
                     [&](const PilotState& p) { return p.array_job == job; })) {
      forgotten.push_back(job);
    }
  }
  std::string sacct_note;
  if (!forgotten.empty()) {
    absl::StatusOr<std::vector<PilotState>> ended = SacctPilots(forgotten);
    if (ended.ok()) {
      for (PilotState& p : *ended) {
        if (p.name == kPilotJobName && wanted.count(p.array_job) > 0) {
          pilots->push_back(std::move(p));
        }
      }
    } else {
      sacct_note = std::string(ended.status().message());
    }
  }
  std::sort(pilots->begin(), pilots->end(),
            [](const PilotState& a, const PilotState& b) { return PilotOrder(a) < PilotOrder(b); });
  std::vector<std::string> ended;  // forgotten by squeue, and not found by sacct either
  for (const std::string& job : forgotten) {
    if (std::none_of(pilots->begin(), pilots->end(),
                     [&](const PilotState& p) { return p.array_job == job; })) {
      ended.push_back(job);
    }
  }
  if (options.format == "json") {
    nlohmann::json j = {{"jobs", jobs},
                        {"pilots", nlohmann::json::array()},
                        {"ended_unknown", ended},
                        {"sacct_note", sacct_note}};
    int active = 0;
    for (const PilotState& p : *pilots) {
      j["pilots"].push_back({{"pilot", p.job},
                             {"job", p.array_job},
                             {"state", p.state},
                             {"elapsed", p.time},
                             {"time_limit", p.time_limit},
                             {"node", p.nodes},
                             {"reason", p.reason},
                             {"active", PilotActive(p)}});
      active += PilotActive(p);
    }
    j["active"] = active;
    out << j.dump(1) << "\n";
    return absl::OkStatus();
  }

  auto row = [&out](const std::string& pilot, const std::string& state, const std::string& time,
                    const std::string& limit, const std::string& nodes, const std::string& reason) {
    const std::string line = fmt::format("{:<14} {:<11} {:>10} {:>11}  {:<16} {}", pilot, state,
                                         time, limit, nodes, reason);
    out << absl::StripTrailingAsciiWhitespace(line) << "\n";
  };
  if (!pilots->empty()) row("PILOT", "STATE", "ELAPSED", "LIMIT", "NODE", "REASON");
  std::map<std::string, int> by_state;
  int active = 0;
  for (const PilotState& p : *pilots) {
    row(p.job, p.state, p.time, p.time_limit, p.nodes, p.reason);
    if (PilotActive(p)) {
      ++active;
      ++by_state[p.state];
    }
  }
  for (const std::string& job : ended) {
    out << fmt::format("job {}: ended (squeue no longer lists it{})\n", job,
                       sacct_note.empty() ? "" : absl::StrCat("; ", sacct_note));
  }
  std::vector<std::string> counts;
  for (const auto& [state, n] : by_state) counts.push_back(absl::StrCat(n, " ", state));
  out << fmt::format("{} pilot{} active{}{} (SLURM jobs {})\n", active, active == 1 ? "" : "s",
                     counts.empty() ? "" : ": ", absl::StrJoin(counts, ", "),
                     absl::StrJoin(jobs, ", "));
  return absl::OkStatus();
}

absl::Status SlurmLauncher::Stop(const WorkersOptions& options, std::ostream& out) {
  const std::vector<std::string> jobs = ReadPilotJobs(options.state_dir);
  absl::StatusOr<std::vector<PilotState>> pilots =
      jobs.empty() ? std::vector<PilotState>{}
                   : SqueuePilots(std::set<std::string>(jobs.begin(), jobs.end()));
  if (!pilots.ok()) return pilots.status();
  std::sort(pilots->begin(), pilots->end(),
            [](const PilotState& a, const PilotState& b) { return PilotOrder(a) < PilotOrder(b); });
  std::vector<std::string> ids;
  for (const PilotState& p : *pilots) {
    if (PilotActive(p)) ids.push_back(p.job);
  }
  if (ids.empty()) {
    out << "no active pilots: nothing to stop\n";
    return absl::OkStatus();
  }
  std::vector<std::string> args = {"scancel"};
  args.insert(args.end(), ids.begin(), ids.end());
  absl::StatusOr<ProgramResult> r = RunSlurm(args);
  if (!r.ok()) return r.status();
  if (r->exit_code != 0) return CommandFailed("scancel", *r);
  out << fmt::format("cancelled {} pilot{}: {} (each checkpoints its run and hands it back)\n",
                     ids.size(), ids.size() == 1 ? "" : "s", absl::StrJoin(ids, ", "));
  return absl::OkStatus();
}

std::unique_ptr<ClusterLauncher> MakeSlurmLauncher() { return std::make_unique<SlurmLauncher>(); }

}  // namespace ablate
