// Read side of the results store: read-only SQLite connections for `ablate query`, `ablate table`,
// `ablate export`, the dashboard API and the coordinator's lookups. One read path: every typed
// read the coordinator, its Watch stream and the dashboard make is a method here, so a schema
// change touches these reads (reader*.cc, by topic: see reader_internal.h) and schema.cc.
//
// Every connection is opened SQLITE_OPEN_READONLY and guarded by the users' SQL sandbox
// (query.h), so no SQL handed to ReadOnlyQuery can change the database or reach another file, or
// outrun its time and memory limits. In WAL mode a reader reads the last committed snapshot and
// never waits for the writer, nor makes it wait.
//
// Thread safety: all methods are thread-safe. Connections come from two pools: the typed reads'
// (one per concurrent caller, up to ReaderOptions::max_connections; further callers wait for a
// free one) and the users' SQL (ReadOnlyQuery: at most max_query_connections at once, a caller
// waits at most query_wait), so users' queries never stall the coordinator's own reads.
#ifndef ABLATE_ORCHESTRATOR_STORE_READER_H_
#define ABLATE_ORCHESTRATOR_STORE_READER_H_

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "orchestrator/stats/stats.h"
#include "orchestrator/store/query.h"
#include "proto/ablate.pb.h"

namespace ablate {

struct ReaderOptions {
  std::string path;         // the database file (it must exist: the coordinator creates it)
  int max_connections = 4;  // pool size of the typed reads: callers beyond this wait
  // Users' SQL (ReadOnlyQuery) has a pool of its own, so that runaway queries never hold the
  // connections scheduling and the dashboard read with: at most this many run at once, and a
  // query that waits longer than query_wait for one is Unavailable.
  int max_query_connections = 2;
  absl::Duration query_wait = absl::Seconds(2);
  absl::Duration busy_timeout = absl::Seconds(5);  // only while a WAL is being recovered
};

// One sweep with its run counts by state (the sweep_progress view).
struct SweepInfo {
  int64_t id = 0;
  std::string name;
  std::string description;
  std::string state;  // ACTIVE, DONE, CANCELLED
  int priority = 1;
  double created_at = 0;
  int64_t runs = 0, pending = 0, running = 0, succeeded = 0, failed = 0, diverged = 0,
          cancelled = 0, interrupted = 0, stopped = 0;
  int64_t steps_done = 0, steps_total = 0;
  std::string tune_method;  // its tune's method ("grid", "asha", "boundary"); "" without one
};

// One run (the runs table, with sweep and variant names). Metric fields are NaN when unset.
struct RunInfo {
  int64_t id = 0;
  int64_t sweep_id = 0;
  std::string sweep;
  std::string variant;
  int run_index = 0;
  std::string run_key;
  uint64_t seed = 0;
  std::string axes;
  std::string config_json;
  RunState state = RUN_STATE_UNSPECIFIED;
  int attempts = 0;
  int64_t worker_id = 0;  // 0 = none
  int priority = 1;
  std::string device;
  double memory_gb = 0;
  int threads = 0;
  int devices = 1;  // Resources.devices: the ranks it trains on
  int64_t params_total = 0, params_activated = 0, params_added = 0;
  double created_at = 0, started_at = 0, finished_at = 0;  // 0 = not yet
  int64_t steps_total = 0, steps_done = 0;
  double final_train_loss = kNaN, val_loss = kNaN, val_ppl = kNaN, gate_score = kNaN, m_act = kNaN,
         f_attn = kNaN, spike_score = kNaN;
  double sink_rate = kNaN;  // Probes.sink_rate of its last evaluation; NaN: not measured
  int64_t spike_steps = 0;
  double tokens_per_s = kNaN, wall_s = kNaN;  // mean tokens/s; training seconds, all attempts
  double eval_s = kNaN;  // seconds its evaluations took (run_summary.eval_seconds); NaN: unknown
  // What it cost (RunSummary): its last attempt's peak of tensor memory (0 = unknown) and the
  // training FLOPs of every step it took (NaN = unknown).
  int64_t peak_memory_bytes = 0;
  double flops = kNaN;
  std::string reason;
  int64_t reused_from = 0;   // the run whose results this one reused (its curves too); 0 = none
  int attempt_base = 0;      // attempts when a user last queued it again: retries count from here
  std::string code_version;  // its sweep's (sweeps.code_version): the build it is keyed to
  // Of a tuned sweep's run (tune_runs): its group, its value of the tuned axis, the step it
  // pauses at next (0 = its end) and whether it waits for the tuner (PENDING, not queued).
  bool tuned = false;
  std::string tune_group;
  double tune_value = kNaN;
  int64_t stop_at_step = 0;
  bool held = false;
};

// A tuned sweep's `tune:` block as stored (the tunes table).
struct TuneInfo {
  int64_t sweep_id = 0;
  std::string axis;    // "train.optimizer.lr"
  std::string method;  // "grid" or "asha"
  std::string metric;  // an eval_metrics column: val_loss, val_ppl, gate_score, m_act, f_attn
  bool maximize = false;
  TunePlan plan;
};

// One run of a tuning group as the tuner reads it.
struct TuneGroupRun {
  int64_t run_id = 0;
  double value = 0;
  uint64_t seed = 0;
  RunState state = RUN_STATE_UNSPECIFIED;
  bool held = false;
  int64_t steps_done = 0, steps_total = 0;
  double final_metric = kNaN;  // runs.<metric>: its last evaluation
  double spike_score = kNaN;
  std::map<int64_t, double> at;  // eval_metrics.<metric> at each rung step evaluated
};

// A boundary sweep's bracket of one group (tune_brackets).
struct BracketInfo {
  std::string group, variant, axes;
  std::string state;                      // OPEN while it bisects, then DONE
  double stable = kNaN, unstable = kNaN;  // NaN: none (unstable at min, stable at max)
  int64_t probes = 0;                     // values tried after min and max
  std::string note;
};

// A tuning decision as stored (tune_decisions).
struct TuneDecisionInfo {
  std::string group;
  double value = 0;
  int rung = 0;
  std::string kind;
  double metric = kNaN;
  std::string detail;
};

struct LatestStep {
  int64_t step = 0;
  double loss = kNaN;
};

// A variant of a sweep, as its first run described it.
struct VariantInfo {
  std::string name;
  std::string description;
  std::string diff;    // what differs from the reference
  std::string budget;  // how its budget was matched ("" when it was not)
  int64_t params_total = 0, params_activated = 0, params_added = 0;
  double flops_per_token = 0;
};

// Counts over the whole store, for /metrics.
struct StoreCounts {
  std::map<std::string, int64_t> runs_by_state;     // every state, 0 included
  std::map<std::string, int64_t> sweeps_by_state;   // the states that occur
  std::map<std::string, int64_t> workers_by_state;  // the states that occur
  double steps_done = 0;                            // over every run (REAL: cannot overflow)
};

struct RunFilter {
  int64_t sweep_id = 0;          // 0 = every sweep
  std::vector<RunState> states;  // empty = every state
  int64_t limit = 0;             // 0 = no limit
};

// A sweep and its runs in every state, in run order: what the figures and the dashboard's
// per-sweep answers start from.
struct SweepWithRuns {
  SweepInfo sweep;
  std::vector<RunInfo> runs;
};

// One attempt of a run.
struct AttemptInfo {
  int64_t run_id = 0;
  int attempt = 0;
  int64_t worker_id = 0;
  std::string state;  // a run state name or LOST
  double started_at = 0, ended_at = 0;
  std::string checkpoint_path;
  int64_t checkpoint_step = 0;
  int64_t report_seq = 0;
  std::string reason;
};

struct WorkerInfo {
  int64_t id = 0;
  std::string name;
  std::string resources_json;
  double registered_at = 0, last_seen = 0;
  std::string state;     // IDLE, BUSY, GONE
  int slots_in_use = 0;  // the devices of its RUNNING runs, summed
  int running = 0;       // its RUNNING runs
};

// One row of the event log.
struct EventInfo {
  int64_t id = 0;
  double time = 0;
  int64_t sweep_id = 0, run_id = 0;  // 0 = none
  std::string kind;
  std::string message;
  std::string state;  // the state a run_state or sweep_state event's run or sweep entered; "" none
};

// A spike event of a run of a sweep, with its row id (what the live streams count from).
struct SweepSpike {
  int64_t id = 0;
  int64_t run_id = 0;
  SpikeEvent event;
};

// Where a live stream of a sweep stands: the last event-log row and spike row it has seen.
struct ChangeCursor {
  int64_t event_id = 0;
  int64_t spike_id = 0;
};

// What changed in a sweep since a cursor: what `ablate watch` (gRPC) and the dashboard's event
// stream (SSE) send.
struct SweepChanges {
  std::vector<EventInfo> events;   // the sweep's event-log rows after the cursor, oldest first
  std::vector<SweepSpike> spikes;  // its spike events after the cursor, oldest first
  std::vector<RunInfo> runs;       // the sweep's runs (of the states asked for) as they are now
  ChangeCursor next;               // the cursor after these
};

// The step metrics a curve may plot.
enum class CurveMetric { kLoss, kGradNorm, kLr };

// Server-side downsampling of a step-metric series.
enum class Downsample {
  kNone,    // every point
  kStride,  // every k-th point
  kMinMax,  // per bucket of k points, the points of minimum and maximum loss
};

struct SeriesOptions {
  int64_t from_step = 0;                                  // inclusive
  int64_t to_step = std::numeric_limits<int64_t>::max();  // inclusive
  int max_points = 1000;                                  // target size; <= 0 = every point
  Downsample mode = Downsample::kMinMax;
};

// A variant's validation loss and PPL at one evaluation length (TrainConfig.eval_seq_lens): at the
// last evaluation of each SUCCEEDED run, mean ± std over them (the length_table view).
struct LengthStat {
  int64_t seq_len = 0;
  bool yarn = false;  // measured with YaRN scaling
  int64_t n = 0;      // runs with a value
  MeanStd val_loss, val_ppl;
};

// One row of the paper-style comparison table: a variant at one axis point (the variant_table
// view). Means are over SUCCEEDED runs (the seeds); diverged runs are counted, not averaged.
struct ComparisonRow {
  std::string variant;
  std::string description;
  std::string axes;  // "" without axes
  int64_t runs = 0;  // every run of the group
  int64_t n = 0;     // SUCCEEDED runs: the sample size of every mean
  int64_t diverged = 0;
  int64_t failed = 0;
  int64_t unfinished = 0;  // PENDING, RUNNING or INTERRUPTED
  int64_t stopped = 0;     // STOPPED by a tuner at a rung
  // `table --best`: the value of the tuned axis this row is at, "train.optimizer.lr=0.004"
  // ("" otherwise).
  std::string best;
  MeanStd val_loss, val_ppl, gate_score, m_act, f_attn, spike_score, train_loss, sink_rate;
  double params_total = 0, params_activated = 0, params_added = 0;  // mean over the group's runs
  std::vector<LengthStat> lengths;  // by seq_len; empty without TrainConfig.eval_seq_lens
  // What its SUCCEEDED runs cost, mean ± std (NaN where no run reported it): the peak of tensor
  // memory, training seconds over all attempts, mean tokens/s and training FLOPs.
  MeanStd peak_memory_bytes, train_seconds, eval_seconds, tokens_per_s, flops;
  // The metrics its runs report by name (ResultRun::metrics), mean ± std over its SUCCEEDED runs.
  std::map<std::string, MeanStd> metrics;
};

struct ComparisonTable {
  std::string sweep;
  std::vector<ComparisonRow> rows;  // in run order: by first run index of each group
  // Which metrics by name the markdown and csv tables show as columns (`table --evals`), in
  // order; json gives every row's all.
  std::vector<std::string> evals;
};

// A run's loss and PPL at one evaluation length, at its last evaluation (the length_results view).
struct RunLength {
  int64_t seq_len = 0;
  bool yarn = false;
  double val_loss = kNaN, val_ppl = kNaN;
};

// Which runs a comparison table or a paired comparison is computed over: the runs of one or more
// sweeps (a study split over init_from phases, or submitted again), less those tagged to leave
// out.
struct ResultSelection {
  std::vector<std::string> sweeps;  // names or ids, at least one
  std::vector<std::string>
      exclude_tags;  // a run tagged so (itself, or through its sweep) is left out
  // A compute budget (0: none; at most one of them): each run's results are those of its last
  // evaluation at or below this many tokens trained (step x batch_size x seq_len x grad_accum),
  // or training FLOPs spent (those tokens x TrainingFlopsPerToken), instead of its final one; a
  // run with no evaluation that early has none (its lengths are left out either way).
  double at_tokens = 0;
  double at_flops = 0;
  // A metric whose per-item scores to read (eval_items: ResultRun::items), for `ablate compare`'s
  // test over items; "" reads none. Runs read at a compute budget have none.
  std::string items_metric;
};

struct ResultRun {
  RunInfo run;
  std::vector<RunLength> lengths;  // by seq_len; empty without TrainConfig.eval_seq_lens
  // The metrics of its last evaluation reported by name (train.evals' TASK@SETTING, a program's
  // own): view eval_results.
  std::map<std::string, double> metrics;
  // ResultSelection::items_metric's scores per item of the run's last evaluation that reported
  // them, in item order; empty when it has none.
  std::vector<double> items;
};

// The runs of a selection. Runs of several sweeps are matched by variant, seed and axis point:
// each (variant, seed, axes) counts once. When two sweeps hold it, the run with a result
// (SUCCEEDED or DIVERGED) stands over one without, and between two alike, the later sweep's (in
// the order named) stands: a resubmission replaces what it repeats.
struct ResultSet {
  std::string label;              // the sweeps' names joined by "+"
  std::vector<SweepInfo> sweeps;  // in the order named
  std::string reference;          // the first sweep's reference variant
  std::vector<ResultRun> runs;    // the first sweep's runs in run order, then the others'
  std::map<std::string, std::string>
      descriptions;      // by variant, from the sweep that named it first
  int64_t excluded = 0;  // runs left out for exclude_tags
  int64_t replaced = 0;  // runs another sweep's run stood over
};

// The comparison table of a set of runs: one row per (variant, axes) in order of first run, means
// and sample stds over the SUCCEEDED runs (what the variant_table and length_table views compute
// for one sweep).
ComparisonTable ComparisonTableOf(const ResultSet& results);

// Where a sweep came from: its spec as submitted and the build that expanded it (the sweeps
// table's columns that SweepInfo leaves out).
struct SweepSource {
  int64_t sweep_id = 0;
  std::string spec_file;                   // the path it was submitted from
  std::string spec_yaml;                   // the spec text as submitted
  std::string reference;                   // the variant added parameters are counted against
  std::string code_version;                // "0.1.0+abc1234"
  double created_at = 0, finished_at = 0;  // 0 = not yet finished
};

// A tag or a note on a sweep (run_id 0) or on one run of it.
struct Annotation {
  int64_t id = 0;
  int64_t sweep_id = 0;
  int64_t run_id = 0;  // 0 = the whole sweep
  std::string kind;    // "tag" or "note"
  std::string text;
  double created_at = 0;
};

class StoreReader {
 public:
  // Opens one connection right away (so a missing file or a foreign file fails here) and the
  // rest on demand. NotFound when the file does not exist; FailedPrecondition when it is not an
  // ablate store or its schema is newer than this build.
  static absl::StatusOr<std::unique_ptr<StoreReader>> Open(const ReaderOptions& options);
  ~StoreReader();

  // Runs one SQL statement read-only. Refusals are PermissionDenied naming what was refused:
  //   "query: write statements are not allowed (INSERT)", "... (ATTACH)", "query: PRAGMA
  //   user_version = 5 is not allowed (only reading PRAGMAs)". More than one statement is
  //   InvalidArgument; a syntax error is InvalidArgument with SQLite's message; running past
  //   limits.timeout is DeadlineExceeded. Unavailable ("busy") when max_query_connections
  //   queries kept running for query_wait.
  absl::StatusOr<QueryResult> ReadOnlyQuery(const std::string& sql,
                                            const QueryLimits& limits = {}) const;
  // Interrupts every running ReadOnlyQuery (Unavailable: "interrupted: the store is closing")
  // and refuses new ones, so that a shutdown need not wait out their time limits. Typed reads
  // go on.
  void InterruptQueries() const;
  // While paused, running ReadOnlyQuery calls are interrupted and new ones refused (Unavailable,
  // "try again"): the store's checkpointer pauses them when their snapshots keep the WAL from
  // being copied back (Store, "WAL pressure"), and resumes them once it was.
  void PauseQueries(bool paused) const;
  // Connections the typed reads' pool has open (idle or leased).
  int OpenConnections() const;

  // Sweeps, newest first, with progress counts.
  absl::StatusOr<std::vector<SweepInfo>> ListSweeps() const;
  // By name, or by id when `name_or_id` is a number no sweep is named. NotFound otherwise.
  absl::StatusOr<SweepInfo> GetSweep(const std::string& name_or_id) const;
  // By id only (a sweep named "3" is not sweep 3). NotFound otherwise.
  absl::StatusOr<SweepInfo> GetSweepById(int64_t sweep_id) const;

  absl::StatusOr<std::vector<RunInfo>> ListRuns(const RunFilter& filter) const;
  // ListRuns of one sweep: its runs in `states` (every state when empty).
  absl::StatusOr<std::vector<RunInfo>> RunsOfSweep(int64_t sweep_id,
                                                   std::vector<RunState> states = {}) const;
  // GetSweep(name_or_id) and RunsOfSweep of it.
  absl::StatusOr<SweepWithRuns> GetSweepWithRuns(const std::string& name_or_id) const;
  absl::StatusOr<RunInfo> GetRun(int64_t run_id) const;
  absl::StatusOr<std::vector<AttemptInfo>> Attempts(int64_t run_id) const;
  // The checkpoint a resumed attempt starts from: the latest checkpoint of any attempt
  // (path "" and step 0 when there is none).
  absl::StatusOr<AttemptInfo> LatestCheckpoint(int64_t run_id) const;

  // The per-run series below are a reused run's source's (RunInfo::reused_from): a run that
  // took an identical run's results shows its curves too.
  //
  // The step metrics of a run in [from_step, to_step], downsampled to about max_points. The
  // last point of the range and every step with a spike event are always kept, so the result
  // may hold a few more than max_points. Sorted by step.
  absl::StatusOr<std::vector<StepMetrics>> MetricSeries(int64_t run_id,
                                                        const SeriesOptions& options = {}) const;
  // Evaluations of a run, by step, each with its losses at the eval_seq_lens lengths (by length);
  // with per-layer probes when `with_layers`.
  absl::StatusOr<std::vector<EvalResult>> EvalSeries(int64_t run_id, bool with_layers) const;
  // The step of a run's evaluation at `step` (step < 0: its latest evaluation), or nullopt when
  // it has none there. One index probe, where EvalSeries reads every evaluation.
  absl::StatusOr<std::optional<int64_t>> EvalStep(int64_t run_id, int64_t step) const;
  // The attention maps stored by one evaluation, by layer, then head (empty when it stored none).
  absl::StatusOr<std::vector<AttentionMap>> AttentionMapsAt(int64_t run_id, int64_t step) const;
  // The per-layer probes of one evaluation.
  absl::StatusOr<std::vector<LayerProbes>> LayerProbesAt(int64_t run_id, int64_t step) const;
  absl::StatusOr<std::vector<SpikeEvent>> SpikeEvents(int64_t run_id) const;
  // The latest reported step of every run of a sweep that reported one, and its loss, by run id
  // (a reused run: its source's).
  absl::StatusOr<std::map<int64_t, LatestStep>> LatestSteps(int64_t sweep_id) const;
  // Every run's curve of `metric` for a sweep overlay, by run id: the steps that are multiples of
  // `every` (one shared grid, so overlaid curves share their x values), each run's last step and
  // its spike steps. A reused run's curve is its source's. `elapsed` (optional) receives each
  // point's training seconds (StepMetrics.elapsed_s; NaN where a row has none), in the same order.
  absl::StatusOr<std::map<int64_t, std::vector<std::pair<int64_t, double>>>> SweepCurves(
      int64_t sweep_id, CurveMetric metric, int64_t every,
      std::map<int64_t, std::vector<double>>* elapsed = nullptr) const;
  // Every spike event of a sweep's runs (a reused run: its source's), by run, then step.
  absl::StatusOr<std::vector<SweepSpike>> SweepSpikes(int64_t sweep_id) const;
  // The variants of a sweep, in spec order.
  absl::StatusOr<std::vector<VariantInfo>> ListVariants(int64_t sweep_id) const;
  // The spec and code version of a sweep. NotFound for an unknown id.
  absl::StatusOr<SweepSource> GetSweepSource(int64_t sweep_id) const;
  // A program's code as submitted (SweepRecord::program); NotFound when no sweep stored it.
  absl::StatusOr<ProgramSnapshot> GetProgramCode(const std::string& code_hash) const;
  // A sweep's tags and notes, its own and its runs', oldest first.
  absl::StatusOr<std::vector<Annotation>> Annotations(int64_t sweep_id) const;
  // The ids of the sweep's runs that carry any of `tags`, on the run itself or on the sweep.
  absl::StatusOr<std::set<int64_t>> RunsTagged(int64_t sweep_id,
                                               const std::vector<std::string>& tags) const;
  // The last evaluation of every run of a sweep that has one, by run id (a reused run: its
  // source's), with its per-layer probes when `with_layers` (lengths and attention maps are left
  // out). What `ablate report` averages over seeds, and the interim values the dashboard shows for
  // runs still training.
  absl::StatusOr<std::map<int64_t, EvalResult>> LatestEvals(int64_t sweep_id,
                                                            bool with_layers) const;

  // ---- Live streams ----
  // The cursor of a stream that starts now: the newest event-log and spike rows.
  absl::StatusOr<ChangeCursor> LatestCursor() const;
  // What changed in the sweep since `cursor`: at most `limit` events and `limit` spikes (the
  // rest come with the next call), and its runs in `run_states` (empty: every run) as they are.
  absl::StatusOr<SweepChanges> ChangesSince(int64_t sweep_id, const ChangeCursor& cursor, int limit,
                                            const std::vector<RunState>& run_states = {}) const;
  absl::StatusOr<StoreCounts> Counts() const;

  absl::StatusOr<std::vector<WorkerInfo>> ListWorkers() const;
  // Events with id > after_id, oldest first, at most `limit`; sweep_id 0 = every sweep.
  absl::StatusOr<std::vector<EventInfo>> Events(int64_t sweep_id, int64_t after_id,
                                                int limit) const;
  // Spikes of every sweep with id > after_id, oldest first, at most `limit`.
  absl::StatusOr<std::vector<SweepSpike>> SpikesSince(int64_t after_id, int limit) const;
  // How far the alerter has read (alert_cursor); nullopt before it first ran on this store.
  absl::StatusOr<std::optional<ChangeCursor>> AlertCursorRow() const;

  // ---- Tuning (reader_tune.cc) ----
  // The sweep's `tune:` block; nullopt for a sweep without one.
  absl::StatusOr<std::optional<TuneInfo>> GetTune(int64_t sweep_id) const;
  // The groups of a tuned sweep, sorted.
  absl::StatusOr<std::vector<std::string>> TuneGroups(int64_t sweep_id) const;
  // The runs of one group with `tune.metric` at each of `rungs` they were evaluated at (a plan
  // that trains through its rungs: at the first evaluation at or after each rung).
  absl::StatusOr<std::vector<TuneGroupRun>> ReadTuneGroup(const TuneInfo& tune,
                                                          const std::string& group,
                                                          const std::vector<int64_t>& rungs) const;
  // The decisions stored for a sweep (`group` empty: every group), oldest first.
  absl::StatusOr<std::vector<TuneDecisionInfo>> TuneDecisions(int64_t sweep_id,
                                                              const std::string& group = "") const;
  // A boundary sweep's brackets, by group.
  absl::StatusOr<std::vector<BracketInfo>> TuneBrackets(int64_t sweep_id) const;

  // The comparison table of a sweep (by name or id). NotFound for an unknown sweep.
  absl::StatusOr<ComparisonTable> GetComparisonTable(const std::string& sweep) const;
  // ComparisonTableOf(ReadResults(selection)).
  absl::StatusOr<ComparisonTable> GetComparisonTable(const ResultSelection& selection) const;
  // The runs of a selection, each with its lengths. NotFound naming a sweep that does not exist;
  // InvalidArgument for no sweeps, or the same sweep named twice.
  absl::StatusOr<ResultSet> ReadResults(const ResultSelection& selection) const;

 private:
  // ResultSelection::at_tokens / at_flops on one run: its evaluation at the budget.
  absl::Status AtBudget(const ResultSelection& selection, ResultRun* result) const;
  struct Connection;
  class Lease;

  explicit StoreReader(const ReaderOptions& options);
  absl::StatusOr<std::unique_ptr<Connection>> Connect() const;
  // Connections of one kind, idle and in all (idle + leased).
  struct Pool {
    std::vector<std::unique_ptr<Connection>> idle;
    int open = 0;
    int max = 0;
  };
  // A connection of `pool` (the typed reads' by default), waiting until `deadline` for one:
  // Unavailable past it.
  absl::StatusOr<Lease> Acquire(Pool* pool = nullptr,
                                absl::Time deadline = absl::InfiniteFuture()) const;
  void Release(Pool* pool, std::unique_ptr<Connection> connection) const;
  // Runs the cached statement `sql` on a pooled connection: `bind(Stmt&)` binds its parameters,
  // `read(const Stmt&)` is called on each row. These three are defined in reader_internal.h, for
  // the reader's files only.
  template <typename Bind, typename Read>
  absl::Status ForEachRow(const std::string& sql, Bind bind, Read read) const;
  // Every row of `sql` as a T, `map(const Stmt&)` making one from a row, in the statement's order.
  template <typename T, typename Bind, typename Map>
  absl::StatusOr<std::vector<T>> ReadRows(const std::string& sql, Bind bind, Map map) const;
  // The first row of `sql` as a T (the rest are not read); NotFound(`not_found`) when it has none.
  template <typename T, typename Bind, typename Map>
  absl::StatusOr<T> ReadFirstRow(const std::string& sql, Bind bind, Map map,
                                 const std::string& not_found) const;

  // Constant after construction.
  const ReaderOptions options_;

  mutable absl::Mutex mu_;
  mutable Pool reads_ ABSL_GUARDED_BY(mu_);    // typed reads
  mutable Pool queries_ ABSL_GUARDED_BY(mu_);  // users' SQL
  mutable std::set<sqlite3*> running_queries_ ABSL_GUARDED_BY(mu_);
  mutable bool queries_closed_ ABSL_GUARDED_BY(mu_) = false;
  mutable bool queries_paused_ ABSL_GUARDED_BY(mu_) = false;
  mutable std::set<sqlite3*> paused_queries_ ABSL_GUARDED_BY(mu_);  // interrupted by a pause
};

// The enum name of a run state ("RUNNING"), and back (RUN_STATE_UNSPECIFIED when unknown).
std::string RunStateName(RunState state);
RunState ParseRunState(const std::string& name);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_STORE_READER_H_
