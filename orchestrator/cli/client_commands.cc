#include "orchestrator/cli/client_commands.h"

#include <unistd.h>

#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/token_flag.h"
#include "common/version.h"
#include "config/run_state.h"
#include "fmt/format.h"
#include "google/protobuf/util/json_util.h"
#include "orchestrator/cli/cli.h"
#include "orchestrator/cli/cost.h"
#include "orchestrator/store/reader.h"
#include "orchestrator/sweep/expand.h"
#include "orchestrator/sweep/tune.h"

namespace ablate {
namespace {

// Flags every client command shares.
struct ClientFlags {
  std::string coordinator, token_file, tls_ca, state_dir = ".ablate";
  double timeout_s = 30;
  ClientOptions Options() const {
    ClientOptions o;
    o.coordinator = coordinator;
    o.token_file = token_file;
    o.tls_ca = tls_ca;
    o.state_dir = state_dir;
    o.timeout = absl::Seconds(timeout_s);
    return o;
  }
};

void AddClientFlags(CLI::App* cmd, ClientFlags* flags) {
  cmd->add_option("--coordinator", flags->coordinator,
                  "HOST:PORT (default: $ABLATE_COORDINATOR, else STATE_DIR/address, else "
                  "127.0.0.1:50051)");
  cmd->add_option("--token-file", flags->token_file,
                  "read the credential from this file (default: $ABLATE_TOKEN, else "
                  "STATE_DIR/token)");
  RefuseTokenOnCommandLine(cmd);
  cmd->add_option("--tls-ca", flags->tls_ca,
                  "PEM CA bundle to verify a TLS coordinator (default: $ABLATE_TLS_CA, else "
                  "STATE_DIR/tls-ca.pem when present, else plaintext)");
  cmd->add_option("--state-dir", flags->state_dir, "the coordinator's state dir")
      ->capture_default_str();
  cmd->add_option("--timeout", flags->timeout_s, "seconds each call may take")
      ->capture_default_str();
}

// Adds the client flags to `cmd` (after its own, where --help lists them) and has choosing `cmd`
// set *action to `run`, called with a client for those flags.
template <typename Run>
void SetClientAction(CLI::App* cmd, std::function<absl::Status()>* action, Run run,
                     std::shared_ptr<ClientFlags> flags = std::make_shared<ClientFlags>()) {
  AddClientFlags(cmd, flags.get());
  cmd->callback([=] {
    *action = [=]() -> absl::Status {
      CoordinatorClient client(flags->Options());
      return run(client);
    };
  });
}

// The positional SWEEP (a name or an id) of the commands about one sweep.
std::shared_ptr<std::string> AddSweepArgument(CLI::App* cmd, bool required = true) {
  auto sweep = std::make_shared<std::string>();
  CLI::Option* option = cmd->add_option("sweep", *sweep, "sweep name or id");
  if (required) option->required();
  return sweep;
}

// `watch`'s own flags, which `submit --watch` takes too.
struct WatchFlags {
  bool plain = false;
};

// Adds them to `cmd`; with `needs`, each flag is refused unless that one is given too.
void AddWatchFlags(CLI::App* cmd, WatchFlags* flags, CLI::Option* needs = nullptr) {
  CLI::Option* plain = cmd->add_flag("--plain", flags->plain,
                                     "a line per event, no redrawn bars (default off a terminal)");
  if (needs != nullptr) plain->needs(needs);
}

std::string Loss(double v) { return v == 0 ? "-" : fmt::format("{:.4f}", v); }

std::string Counts(const SweepStatus& s) {
  std::vector<std::string> parts;
  for (const std::string& state : RunStateNames()) {
    auto it = s.runs_by_state().find(state);
    if (it != s.runs_by_state().end()) parts.push_back(absl::StrCat(it->second, " ", state));
  }
  return absl::StrJoin(parts, ", ");
}

std::string Bar(const RunStatus& r) {
  constexpr int kWidth = 24;
  const double frac =
      r.total_steps() > 0 ? std::min(1.0, static_cast<double>(r.step()) / r.total_steps()) : 0;
  const int filled = static_cast<int>(std::round(frac * kWidth));
  std::string line =
      fmt::format("run {:>4} {:<18} [{}{}] {:>6}/{:<6} loss {:<8} {}", r.run_id(), r.variant(),
                  std::string(filled, '#'), std::string(kWidth - filled, '.'), r.step(),
                  r.total_steps(), Loss(r.last_loss()), RunStateName(r.state()));
  if (r.spike_count() > 0) absl::StrAppend(&line, "  spikes ", r.spike_count());
  return line;
}

std::string StateLine(const RunStatus& r) {
  std::string line = fmt::format("run {} {}: {}", r.run_id(), r.variant(), RunStateName(r.state()));
  if (r.state() == RUNNING) {
    absl::StrAppend(&line, " (attempt ", r.attempts());
    if (!r.worker().empty()) absl::StrAppend(&line, ", worker ", r.worker());
    absl::StrAppend(&line, ")");
  }
  if (r.state() == SUCCEEDED && r.val_loss() != 0) {
    absl::StrAppend(&line, fmt::format(" (val loss {:.4f})", r.val_loss()));
  }
  if (!r.reason().empty() && r.state() != RUNNING) absl::StrAppend(&line, ": ", r.reason());
  return line;
}

std::string SpikeLine(const WatchEvent& e) {
  const SpikeEvent& s = e.spike();
  std::string kind = SpikeKind_Name(s.kind());
  std::string action = SpikeAction_Name(s.action());
  return fmt::format("spike: run {} {} step {}: {} {:.4g} (baseline {:.4g}, {}, {})", e.run_id(),
                     e.variant(), s.step(), s.signal(), s.value(), s.baseline(), kind, action);
}

absl::Status ReadFile(const std::string& path, std::string* text) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot read the spec"));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  *text = buffer.str();
  return absl::OkStatus();
}

bool IsTerminal(std::ostream& out) { return &out == &std::cout && ::isatty(STDOUT_FILENO); }

// How a watched sweep ended, for scripts and CI to gate on: OK when every run SUCCEEDED (or was
// STOPPED by the tuner: a decision, not a failure); kExitRunsFailed when some FAILED or was
// CANCELLED; else kExitDiverged when some DIVERGED.
absl::Status SweepOutcome(const SweepStatus& done) {
  const auto count = [&](const char* state) {
    auto it = done.runs_by_state().find(state);
    return it == done.runs_by_state().end() ? 0 : it->second;
  };
  const int failed = count("FAILED") + count("CANCELLED");
  if (failed > 0) {
    return WithExitCode(
        absl::AbortedError(fmt::format("watch: {} of {} runs of sweep {} FAILED or were CANCELLED",
                                       failed, done.total_runs(), done.name())),
        kExitRunsFailed);
  }
  // A boundary sweep diverges by design: its divergences are where the boundary lies.
  if (const int diverged = count("DIVERGED"); diverged > 0 && done.tune_method() != "boundary") {
    return WithExitCode(absl::AbortedError(fmt::format("watch: {} of {} runs of sweep {} DIVERGED",
                                                       diverged, done.total_runs(), done.name())),
                        kExitDiverged);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunWatch(CoordinatorClient& client, const std::string& sweep, bool live,
                      absl::Duration timeout, std::ostream& out) {
  if (!client.ready().ok()) return client.ready();
  WatchRequest request;
  request.set_sweep(sweep);
  request.set_include_steps(true);
  auto ctx = client.Context(timeout);
  std::unique_ptr<grpc::ClientReader<WatchEvent>> reader = client.stub()->Watch(ctx.get(), request);
  std::map<int64_t, RunStatus> runs;
  std::map<int64_t, int64_t> decile;
  size_t drawn = 0;
  bool done = false;
  SweepStatus finished;
  WatchEvent event;
  while (reader->Read(&event)) {
    std::vector<std::string> messages;
    if (event.has_spike()) messages.push_back(SpikeLine(event));
    if (event.has_run()) {
      const RunStatus& r = event.run();
      auto it = runs.find(r.run_id());
      const bool changed = it == runs.end() || it->second.state() != r.state() ||
                           it->second.attempts() != r.attempts();
      runs[r.run_id()] = r;
      if (changed && (!live || r.state() != RUNNING)) messages.push_back(StateLine(r));
      if (!live && !changed && r.total_steps() > 0) {
        const int64_t d = 10 * r.step() / r.total_steps();
        if (d != decile[r.run_id()]) messages.push_back(Bar(r));
        decile[r.run_id()] = d;
      }
    }
    if (event.has_sweep_done()) {
      done = true;
      finished = event.sweep_done();
      messages.push_back(fmt::format("sweep {} {}: {}", event.sweep_done().name(),
                                     event.sweep_done().state(), Counts(event.sweep_done())));
    }
    if (live) {
      if (drawn > 0) out << "\x1b[" << drawn << "A\x1b[J";
      for (const std::string& m : messages) out << m << "\n";
      drawn = 0;
      if (!done) {
        for (const auto& [id, r] : runs) {
          out << Bar(r) << "\n";
          ++drawn;
        }
      }
    } else {
      for (const std::string& m : messages) out << m << "\n";
    }
    out.flush();
  }
  absl::Status status = FromGrpc(reader->Finish(), client.address());
  if (!status.ok()) return status;
  if (!done) return absl::UnavailableError("watch: the stream ended before the sweep did");
  return SweepOutcome(finished);
}

namespace {

// What `submit` queued, and what the runs it queued will cost (reused runs do not train).
absl::Status PrintSubmitted(CoordinatorClient& client, const SubmitResponse& r,
                            const CostFlags& cost, std::ostream& out) {
  if (r.already_exists()) {
    out << fmt::format(
        "sweep {} (id {}) already exists with these {} runs: nothing new "
        "was queued (ablate status {})\n",
        r.sweep(), r.sweep_id(), r.runs(), r.sweep());
    return absl::OkStatus();
  }
  // The coordinator expanded it: its build is the one the runs are keyed to.
  out << fmt::format(
      "sweep {} (id {}): {} runs, {} queued, {} reused; code {}\n", r.sweep(), r.sweep_id(),
      r.runs(), r.queued(), r.reused(),
      r.expanded().build().empty() ? r.expanded().code_version() : r.expanded().build());
  // As `expand` says it, before the cost: the coordinator was built from uncommitted changes.
  if (const std::string note = UncommittedSourcesNote(
          {r.expanded().uncommitted().begin(), r.expanded().uncommitted().end()});
      !note.empty()) {
    out << note << "\n";
  }
  std::set<std::string> reused_keys;
  if (r.reused() > 0) {
    absl::StatusOr<GetSweepResponse> stored = client.GetSweep(absl::StrCat(r.sweep_id()));
    if (!stored.ok()) return stored.status();
    for (const RunStatus& run : stored->runs()) {
      if (run.reused_from() != 0) reused_keys.insert(run.run_key());
    }
  }
  const SweepCost c = EstimateSweepCost(r.expanded(), reused_keys);
  out << FormatCostLine(c, cost,
                        r.reused() > 0 ? fmt::format("{} of {} runs to train ({} reused)", c.runs,
                                                     r.runs(), r.runs() - c.runs)
                                       : fmt::format("{} runs", c.runs));
  if (r.expanded().has_tune()) out << TunePlanText(r.expanded().tune()) << "\n";
  return absl::OkStatus();
}

// `ablate submit SPEC [--watch] [--force]`.
void AddSubmitCommand(CLI::App* app, std::ostream* out, std::function<absl::Status()>* action) {
  CLI::App* cmd =
      app->add_subcommand("submit",
                          "Queue a sweep on the coordinator. Runs identical to one that already "
                          "succeeded (same run key) reuse its result unless --force.");
  auto spec = std::make_shared<std::string>();
  auto watch = std::make_shared<bool>(false);
  auto watch_flags = std::make_shared<WatchFlags>();
  auto force = std::make_shared<bool>(false);
  auto cost = std::make_shared<CostFlags>();
  cmd->add_option("spec", *spec, "sweep spec (YAML; see docs/spec.md)")->required();
  CLI::Option* watch_option = cmd->add_flag(
      "--watch,-w", *watch, "then watch it until it ends (as `ablate watch`, with its flags)");
  AddWatchFlags(cmd, watch_flags.get(), watch_option);
  cmd->add_flag("--force", *force, "train runs again even when an identical one succeeded");
  AddCostFlags(cmd, cost.get());
  SetClientAction(cmd, action, [=](CoordinatorClient& client) -> absl::Status {
    SubmitRequest request;
    if (absl::Status s = ReadFile(*spec, request.mutable_spec_yaml()); !s.ok()) return s;
    request.set_spec_file(*spec);
    // A program's code is read here, where its directory is: the coordinator keeps the copy.
    if (absl::StatusOr<SweepSpec> parsed = ParseSweepSpecText(request.spec_yaml(), *spec);
        parsed.ok() && parsed->base.has_program()) {
      absl::StatusOr<ProgramSnapshot> code = ReadSpecProgram(*parsed);
      if (!code.ok()) return code.status();
      if (!parsed->base.program().count().empty()) {
        // Its count: command runs here, where the code is; the coordinator gets the answers.
        auto record = std::make_shared<std::map<std::string, ParamCount>>();
        ExpandOptions options;
        options.program_code_hash = code->code_hash();
        options.program_count = SpecProgramCounter(*parsed, record);
        if (absl::StatusOr<ExpandedSweep> counted = ExpandSweep(*parsed, options); !counted.ok()) {
          return counted.status();
        }
        for (const auto& [json, count] : *record) {
          ProgramCount* c = request.add_program_counts();
          c->set_params_json(json);
          c->set_total(count.total());
          c->set_activated(count.activated());
        }
      }
      *request.mutable_program() = *std::move(code);
    }
    if (const int64_t memory = cost->DeviceMemoryBytes(); memory > 0) {
      // Checked here, before anything is sent: the coordinator checks resources.memory_gb.
      ExpandOptions options;
      options.device_memory_bytes = memory;
      if (absl::StatusOr<ExpandedSweep> planned = ExpandSweepFile(*spec, options); !planned.ok()) {
        return planned.status();
      }
    }
    request.set_force(*force);
    absl::StatusOr<SubmitResponse> r = client.Submit(request);
    if (!r.ok()) return r.status();
    if (absl::Status s = PrintSubmitted(client, *r, *cost, *out); !s.ok()) return s;
    if (!*watch) return absl::OkStatus();
    return RunWatch(client, r->sweep(), !watch_flags->plain && IsTerminal(*out),
                    absl::Hours(24 * 30), *out);
  });
}

// A table's row format, for its header and every row alike.
constexpr char kWorkerRow[] = "{:>4}  {:<24} {:<5} {:<8} {:>5} {:>5}  {}\n";
constexpr char kSweepRow[] = "{:>4}  {:<24} {:<9} {:>5}  {}\n";
constexpr char kRunRow[] = "{:>5}  {:<18} {:>5} {:<11} {:>3} {:>13} {:>9} {:>9}  {}\n";

// The last column of an `ablate status` line, with the sweep's or the run's own tags after it:
// "4 SUCCEEDED  tags: a, b".
std::string WithTags(const std::string& text,
                     const google::protobuf::RepeatedPtrField<std::string>& tags) {
  if (tags.empty()) return text;
  return absl::StrCat(text, text.empty() ? "" : "  ", "tags: ", absl::StrJoin(tags, ", "));
}

// The workers section of `ablate status`: one line per worker not GONE, with its slots in use.
void PrintWorkers(const ListSweepsResponse& r, std::ostream& out) {
  if (r.workers().empty()) {
    out << "\nno workers (ablate-worker --coordinator ADDRESS, or ablate up)\n";
    return;
  }
  out << "\n"
      << fmt::format(kWorkerRow, "ID", "WORKER", "STATE", "DEVICE", "SLOTS", "RUNS", "BUILT FROM");
  for (const WorkerStatus& w : r.workers()) {
    out << fmt::format(kWorkerRow, w.worker_id(), w.name(), w.state(), w.device(),
                       absl::StrCat(w.slots_in_use(), "/", w.slots()), w.running(), w.build());
  }
  // A worker the queued runs pass by because of its build: idle until rebuilt, so say why.
  for (const WorkerStatus& w : r.workers()) {
    if (!w.waiting().empty()) {
      out << fmt::format("worker {} ({}) takes none of the queued runs: {}\n", w.worker_id(),
                         w.name(), w.waiting());
    }
  }
}

// `ablate status`: every sweep with its run counts, then the workers.
absl::Status PrintSweeps(CoordinatorClient& client, std::ostream& out) {
  absl::StatusOr<ListSweepsResponse> r = client.ListSweeps();
  if (!r.ok()) return r.status();
  if (r->sweeps().empty()) {
    out << "no sweeps (ablate submit SPEC)\n";
  } else {
    out << fmt::format(kSweepRow, "ID", "SWEEP", "STATE", "RUNS", "BY STATE");
    for (const SweepStatus& s : r->sweeps()) {
      out << fmt::format(kSweepRow, s.sweep_id(), s.name(), s.state(), s.total_runs(),
                         WithTags(Counts(s), s.tags()));
    }
  }
  PrintWorkers(*r, out);
  return absl::OkStatus();
}

// `ablate status SWEEP`: the sweep, then every run of it.
absl::Status PrintSweepRuns(CoordinatorClient& client, const std::string& sweep,
                            std::ostream& out) {
  absl::StatusOr<GetSweepResponse> r = client.GetSweep(sweep);
  if (!r.ok()) return r.status();
  out << fmt::format("sweep {} (id {}): {}, {}\n", r->sweep().name(), r->sweep().sweep_id(),
                     r->sweep().state(), Counts(r->sweep()));
  if (!r->sweep().tags().empty()) {
    out << fmt::format("tags: {}\n", absl::StrJoin(r->sweep().tags(), ", "));
  }
  for (const AnnotationStatus& a : r->annotations()) {
    if (a.kind() != "note") continue;
    out << (a.run_id() == 0 ? "note: " : fmt::format("note on run {}: ", a.run_id())) << a.text()
        << "\n";
  }
  out << fmt::format(kRunRow, "RUN", "VARIANT", "SEED", "STATE", "TRY", "STEP", "LOSS", "VAL LOSS",
                     "WORKER / REASON");
  for (const RunStatus& run : r->runs()) {
    const std::string where =
        run.state() == RUNNING
            ? absl::StrCat(run.worker(),
                           run.devices() > 1 ? absl::StrCat(" (", run.devices(), " ranks)") : "")
            : run.reason();
    out << fmt::format(kRunRow, run.run_id(), run.variant(), run.seed(), RunStateName(run.state()),
                       run.attempts(), absl::StrCat(run.step(), "/", run.total_steps()),
                       Loss(run.last_loss()), Loss(run.val_loss()), WithTags(where, run.tags()));
  }
  return absl::OkStatus();
}

// `message` as JSON for programs: proto field names, every field printed, one line each.
std::string ProtoJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);  // no Any
  return json;
}

// `ablate status [SWEEP] [--format table|json]`.
void AddStatusCommand(CLI::App* app, std::ostream* out, std::function<absl::Status()>* action) {
  CLI::App* cmd = app->add_subcommand(
      "status",
      "Sweeps and their run counts, and the workers with their slots in use; with "
      "SWEEP, every run of it.");
  std::shared_ptr<std::string> sweep = AddSweepArgument(cmd, /*required=*/false);
  auto format = std::make_shared<std::string>("table");
  cmd->add_option(
         "--format,-f", *format,
         "table (for people), or json: the coordinator's ListSweepsResponse (GetSweepResponse "
         "with SWEEP), every field, proto names (proto/ablate.proto)")
      ->check(CLI::IsMember({"table", "json"}))
      ->capture_default_str();
  SetClientAction(cmd, action, [=](CoordinatorClient& client) -> absl::Status {
    if (*format == "json") {
      if (sweep->empty()) {
        absl::StatusOr<ListSweepsResponse> r = client.ListSweeps();
        if (!r.ok()) return r.status();
        *out << ProtoJson(*r) << std::flush;
      } else {
        absl::StatusOr<GetSweepResponse> r = client.GetSweep(*sweep);
        if (!r.ok()) return r.status();
        *out << ProtoJson(*r) << std::flush;
      }
      return absl::OkStatus();
    }
    return sweep->empty() ? PrintSweeps(client, *out) : PrintSweepRuns(client, *sweep, *out);
  });
}

// `ablate watch SWEEP [--plain]`.
void AddWatchCommand(CLI::App* app, std::ostream* out, std::function<absl::Status()>* action) {
  CLI::App* cmd =
      app->add_subcommand("watch",
                          "Live progress of every run of a sweep, spikes and divergences as they "
                          "happen; exits when the sweep ends.");
  std::shared_ptr<std::string> sweep = AddSweepArgument(cmd);
  auto watch_flags = std::make_shared<WatchFlags>();
  AddWatchFlags(cmd, watch_flags.get());
  auto flags = std::make_shared<ClientFlags>();
  SetClientAction(
      cmd, action,
      [=](CoordinatorClient& client) {
        return RunWatch(client, *sweep, !watch_flags->plain && IsTerminal(*out),
                        absl::Seconds(flags->timeout_s), *out);
      },
      flags);
  flags->timeout_s = 30 * 24 * 3600;  // the stream's deadline: a sweep may take weeks
}

// `ablate cancel SWEEP`.
void AddCancelCommand(CLI::App* app, std::ostream* out, std::function<absl::Status()>* action) {
  CLI::App* cmd = app->add_subcommand(
      "cancel", "Cancel a sweep: queued runs become CANCELLED, running ones are stopped.");
  std::shared_ptr<std::string> sweep = AddSweepArgument(cmd);
  SetClientAction(cmd, action, [=](CoordinatorClient& client) -> absl::Status {
    absl::StatusOr<CancelResponse> r = client.Cancel(*sweep);
    if (!r.ok()) return r.status();
    *out << fmt::format("sweep {}: {} runs cancelled\n", *sweep, r->cancelled());
    return absl::OkStatus();
  });
}

// `ablate rerun SWEEP --failed`.
void AddRerunCommand(CLI::App* app, std::ostream* out, std::function<absl::Status()>* action) {
  CLI::App* cmd = app->add_subcommand(
      "rerun",
      "Queue a sweep's FAILED and CANCELLED runs again, resuming from their last "
      "checkpoints. DIVERGED runs are results and are not rerun.");
  auto failed = std::make_shared<bool>(false);
  std::shared_ptr<std::string> sweep = AddSweepArgument(cmd);
  cmd->add_flag("--failed", *failed, "the failed and cancelled runs (required)")->required();
  SetClientAction(cmd, action, [=](CoordinatorClient& client) -> absl::Status {
    absl::StatusOr<RerunResponse> r = client.Rerun(*sweep, *failed);
    if (!r.ok()) return r.status();
    *out << fmt::format("sweep {}: {} runs queued again\n", *sweep, r->queued());
    return absl::OkStatus();
  });
}

// The SWEEP[/RUN_ID] of `tag`, `untag` and `note` into `request`: a sweep (a name or an id; a
// name has no '/'), or one run of it by its id (the RUN column of `ablate status SWEEP`).
absl::Status ParseAnnotationTarget(const std::string& target, AnnotateRequest* request) {
  const size_t slash = target.rfind('/');
  request->set_sweep(target.substr(0, slash));
  if (slash == std::string::npos) return absl::OkStatus();
  int64_t run_id = 0;
  if (!absl::SimpleAtoi(target.substr(slash + 1), &run_id) || run_id <= 0 ||
      request->sweep().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", target, "\" is not SWEEP or SWEEP/RUN_ID (a run id as `ablate status SWEEP` lists)"));
  }
  request->set_run_id(run_id);
  return absl::OkStatus();
}

// `ablate tag SWEEP[/RUN_ID] TAG...` and `ablate untag SWEEP[/RUN_ID] TAG...`.
void AddTagCommand(CLI::App* app, bool untag, std::ostream* out,
                   std::function<absl::Status()>* action) {
  CLI::App* cmd =
      untag ? app->add_subcommand("untag", "Remove tags from a sweep or from one run of it.")
            : app->add_subcommand(
                  "tag",
                  "Tag a sweep or one run of it (e.g. `bugged`, left out of the means "
                  "with --exclude-tag). A tag is 1 to 64 of A-Z a-z 0-9 _ . : -.");
  auto target = std::make_shared<std::string>();
  auto tags = std::make_shared<std::vector<std::string>>();
  cmd->add_option("target", *target, "SWEEP, or SWEEP/RUN_ID for one run of it")->required();
  cmd->add_option("tags", *tags, "the tags")->required();
  SetClientAction(cmd, action, [=](CoordinatorClient& client) -> absl::Status {
    AnnotateRequest request;
    const std::string verb = untag ? "untag" : "tag";
    if (absl::Status s = ParseAnnotationTarget(*target, &request); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(verb, ": ", s.message()));
    }
    request.set_action(untag ? AnnotateRequest::UNTAG : AnnotateRequest::TAG);
    for (const std::string& tag : *tags) request.add_tags(tag);
    absl::StatusOr<AnnotateResponse> r = client.Annotate(request);
    if (!r.ok()) return r.status();
    if (!r->changed().empty()) {
      *out << fmt::format("{} {}: {}\n", untag ? "untagged" : "tagged", r->target(),
                          absl::StrJoin(r->changed(), " "));
    }
    if (!r->unchanged().empty()) {
      *out << fmt::format("{} already tagged: {}\n", r->target(),
                          absl::StrJoin(r->unchanged(), " "));
    }
    return absl::OkStatus();
  });
}

// `ablate note SWEEP[/RUN_ID] "TEXT"`.
void AddNoteCommand(CLI::App* app, std::ostream* out, std::function<absl::Status()>* action) {
  CLI::App* cmd = app->add_subcommand(
      "note",
      "Add a note to a sweep or one run of it (shown by status, export, the report and "
      "the dashboard).");
  auto target = std::make_shared<std::string>();
  auto text = std::make_shared<std::string>();
  cmd->add_option("target", *target, "SWEEP, or SWEEP/RUN_ID for one run of it")->required();
  cmd->add_option("text", *text, "the note, up to 4096 bytes (quote it)")->required();
  SetClientAction(cmd, action, [=](CoordinatorClient& client) -> absl::Status {
    AnnotateRequest request;
    if (absl::Status s = ParseAnnotationTarget(*target, &request); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("note: ", s.message()));
    }
    request.set_action(AnnotateRequest::NOTE);
    request.set_note(*text);
    absl::StatusOr<AnnotateResponse> r = client.Annotate(request);
    if (!r.ok()) return r.status();
    *out << fmt::format("note on {}\n", r->target());
    return absl::OkStatus();
  });
}

// `ablate query SQL [--format table|csv|json] [--max-rows N]`: the result on `out`, a note on
// `err` when it was cut at the row cap.
void AddQueryCommand(CLI::App* app, std::ostream* out, std::ostream* err,
                     std::function<absl::Status()>* action) {
  CLI::App* cmd = app->add_subcommand(
      "query", "Run one read-only SQL statement on the results database (docs/schema.md).");
  auto sql = std::make_shared<std::string>();
  auto format = std::make_shared<std::string>("table");
  auto max_rows = std::make_shared<int>(0);
  cmd->add_option("sql", *sql, "a SELECT statement")->required();
  cmd->add_option("--format,-f", *format, "output format")
      ->check(CLI::IsMember({"table", "csv", "json"}))
      ->capture_default_str();
  cmd->add_option("--max-rows", *max_rows,
                  "rows to return, at most 1000000 (0: the server's default, 10000)")
      ->check(CLI::Range(0, 1000000));
  SetClientAction(cmd, action, [=](CoordinatorClient& client) -> absl::Status {
    QueryRequest request;
    request.set_sql(*sql);
    request.set_format(*format);
    request.set_max_rows(*max_rows);
    absl::StatusOr<QueryResponse> r = client.Query(request);
    if (!r.ok()) return r.status();
    *out << r->formatted();
    if (r->truncated()) {
      *out << std::flush;  // the rows, then the note, when both go to one terminal or file
      *err << fmt::format(
          "ablate query: the result stops at {} row{} and more exist: raise the cap with "
          "--max-rows (up to 1000000), or page with LIMIT and OFFSET\n",
          r->rows(), r->rows() == 1 ? "" : "s");
    }
    return absl::OkStatus();
  });
}

// The positional SWEEP... of `table` and `compare`: one or more sweeps of one study.
std::shared_ptr<std::vector<std::string>> AddSweepsArgument(CLI::App* cmd) {
  auto sweeps = std::make_shared<std::vector<std::string>>();
  cmd->add_option("sweeps", *sweeps,
                  "sweep names or ids: several are matched by variant, seed and axis point, a "
                  "later sweep's run standing over an earlier one's")
      ->required();
  return sweeps;
}

// `--exclude-tag TAG` (repeatable) of `table` and `compare`.
std::shared_ptr<std::vector<std::string>> AddExcludeTagOption(CLI::App* cmd) {
  auto tags = std::make_shared<std::vector<std::string>>();
  cmd->add_option("--exclude-tag", *tags,
                  "leave out runs tagged TAG, on the run or its sweep (repeatable)")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  return tags;
}

// `ablate table SWEEP... [--format markdown|csv|json] [--exclude-tag TAG] [--best|--stability]`.
void AddTableCommand(CLI::App* app, std::ostream* out, std::function<absl::Status()>* action) {
  CLI::App* cmd = app->add_subcommand(
      "table",
      "The paper-style comparison of a sweep: one row per variant, mean ± std over "
      "seeds of val loss/PPL, gate score, M-Act, F-Attn, spike score, and params.");
  auto format = std::make_shared<std::string>("markdown");
  std::shared_ptr<std::vector<std::string>> sweeps = AddSweepsArgument(cmd);
  cmd->add_option("--format,-f", *format, "output format")
      ->check(CLI::IsMember({"markdown", "csv", "json"}))
      ->capture_default_str();
  std::shared_ptr<std::vector<std::string>> exclude = AddExcludeTagOption(cmd);
  auto best = std::make_shared<bool>(false);
  auto stability = std::make_shared<bool>(false);
  cmd->add_flag("--best", *best,
                "a tuned sweep: each variant at its own best value of the tuned axis (after the "
                "same-config table in markdown)");
  cmd->add_flag("--stability", *stability,
                "a boundary sweep: each variant's bracket [stable, unstable] of the tuned axis");
  auto at_tokens = std::make_shared<double>(0);
  auto at_flops = std::make_shared<double>(0);
  CLI::Option* tokens_option =
      cmd->add_option("--at-tokens", *at_tokens,
                      "a compute-matched table: each run's results at its last evaluation at or "
                      "below this many tokens trained (1e6, 2.5e7)")
          ->check(CLI::PositiveNumber);
  cmd->add_option("--at-flops", *at_flops,
                  "the same at this many training FLOPs spent (6N + attention per token)")
      ->check(CLI::PositiveNumber)
      ->excludes(tokens_option);
  auto evals = std::make_shared<std::vector<std::string>>();
  cmd->add_option(
         "--evals", *evals,
         "columns of metrics reported by name (train.evals' passkey@1024, copying@64, ...; "
         "a program's own), or `all`")
      ->delimiter(',');
  SetClientAction(cmd, action, [=](CoordinatorClient& client) -> absl::Status {
    TableRequest request;
    for (const std::string& name : *evals) request.add_evals(name);
    request.set_best(*best);
    request.set_stability(*stability);
    request.set_at_tokens(*at_tokens);
    request.set_at_flops(*at_flops);
    request.set_sweep(sweeps->front());
    for (size_t i = 1; i < sweeps->size(); ++i) request.add_more_sweeps((*sweeps)[i]);
    for (const std::string& tag : *exclude) request.add_exclude_tags(tag);
    request.set_format(*format);
    absl::StatusOr<TableResponse> r = client.Table(request);
    if (!r.ok()) return r.status();
    *out << r->formatted();
    return absl::OkStatus();
  });
}

// `ablate compare SWEEP... [--metric M] [--reference NAME] [--format F] [--alpha A]
// [--correction holm|none] [--exclude-tag TAG] [--best]`.
void AddCompareCommand(CLI::App* app, std::ostream* out, std::function<absl::Status()>* action) {
  CLI::App* cmd = app->add_subcommand(
      "compare",
      "Each variant against the reference at the same axis point, paired by seed: "
      "the difference with its interval, p-values adjusted over the rows, the "
      "smallest difference the seeds can detect, and a verdict.");
  std::shared_ptr<std::vector<std::string>> sweeps = AddSweepsArgument(cmd);
  auto metric = std::make_shared<std::string>("val_loss");
  auto reference = std::make_shared<std::string>();
  auto format = std::make_shared<std::string>("markdown");
  auto alpha = std::make_shared<double>(0.05);
  auto correction = std::make_shared<std::string>("holm");
  cmd->add_option("--metric,-m", *metric,
                  "val_loss, val_ppl, gate_score, m_act, f_attn, sink_rate, spike_score, "
                  "train_loss, ppl@L or loss@L (at evaluation length L), or a metric by name")
      ->capture_default_str();
  cmd->add_option("--reference,-r", *reference,
                  "the variant to compare against (default: the first sweep's reference)");
  cmd->add_option("--format,-f", *format, "output format")
      ->check(CLI::IsMember({"markdown", "csv", "json"}))
      ->capture_default_str();
  cmd->add_option("--alpha", *alpha, "the tests' level; intervals are 1 - alpha")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            double v = 0;
            const bool number = absl::SimpleAtod(text, &v);
            return number && v > 0 && v < 0.5 ? "" : "must be a number between 0 and 0.5";
          },
          "(0, 0.5)"))
      ->capture_default_str();
  cmd->add_option("--correction", *correction, "adjustment of the p-values over the rows")
      ->check(CLI::IsMember({"holm", "none"}))
      ->capture_default_str();
  std::shared_ptr<std::vector<std::string>> exclude = AddExcludeTagOption(cmd);
  auto best = std::make_shared<bool>(false);
  cmd->add_flag("--best", *best,
                "a tuned sweep: each variant at its own best value of the tuned axis against the "
                "reference at its own best");
  SetClientAction(cmd, action, [=](CoordinatorClient& client) -> absl::Status {
    CompareRequest request;
    request.set_best(*best);
    for (const std::string& s : *sweeps) request.add_sweeps(s);
    for (const std::string& tag : *exclude) request.add_exclude_tags(tag);
    request.set_metric(*metric);
    request.set_reference(*reference);
    request.set_format(*format);
    request.set_alpha(*alpha);
    request.set_correction(*correction);
    absl::StatusOr<CompareResponse> r = client.Compare(request);
    if (!r.ok()) return r.status();
    *out << r->formatted();
    return absl::OkStatus();
  });
}

// The SQL of `export`: the runs of sweep `id` with their final metrics, or with `steps` every
// step they reported.
std::string ExportSql(int64_t id, bool steps) {
  if (steps) {
    return absl::StrCat(
        // A reused run's steps are its source's, marked with reused_from.
        "SELECT r.run_id, r.variant, r.seed, r.axes, m.step, m.attempt, m.loss, "
        "m.grad_norm, m.lr, m.tokens_per_s, m.aux_loss, m.skipped, r.reused_from "
        "FROM run_summary r JOIN step_metrics m ON m.run_id = "
        "coalesce(r.reused_from, r.run_id) WHERE r.sweep_id = ",
        id, " ORDER BY r.run_index, m.step");
  }
  return absl::StrCat("SELECT * FROM run_summary WHERE sweep_id = ", id, " ORDER BY run_index");
}

// `ablate export SWEEP [--format csv|json] [--steps]`.
void AddExportCommand(CLI::App* app, std::ostream* out, std::function<absl::Status()>* action) {
  CLI::App* cmd = app->add_subcommand(
      "export",
      "Every run of a sweep with its final metrics (the run_summary view), or with "
      "--steps every reported step, as CSV or JSON.");
  auto format = std::make_shared<std::string>("csv");
  auto steps = std::make_shared<bool>(false);
  std::shared_ptr<std::string> sweep = AddSweepArgument(cmd);
  cmd->add_option("--format,-f", *format, "output format")
      ->check(CLI::IsMember({"csv", "json"}))
      ->capture_default_str();
  cmd->add_flag("--steps", *steps, "step metrics (loss, grad norm, lr...) instead of runs");
  SetClientAction(cmd, action, [=](CoordinatorClient& client) -> absl::Status {
    absl::StatusOr<GetSweepResponse> found = client.GetSweep(*sweep);
    if (!found.ok()) return found.status();
    QueryRequest request;
    request.set_format(*format);
    request.set_max_rows(1000000);
    request.set_sql(ExportSql(found->sweep().sweep_id(), *steps));
    absl::StatusOr<QueryResponse> r = client.Query(request);
    if (!r.ok()) return r.status();
    if (r->truncated()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "export: more than ", r->rows(), " rows; use `ablate query` with LIMIT/OFFSET"));
    }
    *out << r->formatted();
    return absl::OkStatus();
  });
}

}  // namespace

void AddClientCommands(CLI::App* app, std::ostream* out, std::ostream* err,
                       std::function<absl::Status()>* action) {
  AddSubmitCommand(app, out, action);
  AddStatusCommand(app, out, action);
  AddWatchCommand(app, out, action);
  AddCancelCommand(app, out, action);
  AddRerunCommand(app, out, action);
  AddTagCommand(app, /*untag=*/false, out, action);
  AddTagCommand(app, /*untag=*/true, out, action);
  AddNoteCommand(app, out, action);
  AddQueryCommand(app, out, err, action);
  AddTableCommand(app, out, action);
  AddCompareCommand(app, out, action);
  AddExportCommand(app, out, action);
}

}  // namespace ablate
