// The dashboard's live stream (/api/stream?sweep=NAME): server-sent events of what changes in a
// sweep, read from the store every poll_interval with StoreReader::ChangesSince, the same read
// `ablate watch` streams over gRPC. Every write has options.write_timeout to finish: a client
// that stops reading is dropped then, and its stream slot freed.
#include <boost/asio/write.hpp>

#include "absl/strings/str_cat.h"
#include "orchestrator/dashboard/internal.h"

namespace ablate {

namespace {

namespace asio = boost::asio;

std::string SseEvent(absl::string_view name, const json& data) {
  return absl::StrCat("event: ", name, "\ndata: ", Dump(data), "\n\n");
}

// Where a stream is: the last event and spike rows sent (ChangeCursor), and per tracked run
// (RUNNING, or one that just stopped) the last step sent.
struct StreamCursor {
  ChangeCursor at;
  std::map<int64_t, int64_t> steps;
};

// A stream that starts now: at the store's latest rows, tracking the sweep's RUNNING runs from
// the steps they have done.
absl::StatusOr<StreamCursor> StartCursor(const StoreReader& reader, int64_t sweep_id) {
  absl::StatusOr<ChangeCursor> latest = reader.LatestCursor();
  if (!latest.ok()) return latest.status();
  StreamCursor cursor;
  cursor.at = *latest;
  RunFilter running;
  running.sweep_id = sweep_id;
  running.states = {RUNNING};
  absl::StatusOr<std::vector<RunInfo>> runs = reader.ListRuns(running);
  if (runs.ok()) {
    for (const RunInfo& run : *runs) cursor.steps[run.id] = run.steps_done;
  }
  return cursor;
}

// The event log's new rows: state changes (run_state carries DIVERGED), sweep state, workers.
// A run's state change also sends the run, and a run that became RUNNING is tracked from step 0.
std::string EventMessages(const StoreReader& reader, const SweepChanges& changes,
                          std::map<int64_t, int64_t>* steps) {
  std::map<int64_t, const RunInfo*> run_of;
  for (const RunInfo& run : changes.runs) run_of[run.id] = &run;
  std::string out;
  for (const EventInfo& e : changes.events) {
    out += SseEvent("event", EventJson(e));
    if (e.run_id <= 0 || e.kind != "run_state") continue;
    // A running run is in the snapshot; one that just ended is read on its own.
    absl::StatusOr<RunInfo> ended;
    const RunInfo* run = nullptr;
    if (auto it = run_of.find(e.run_id); it != run_of.end()) {
      run = it->second;
    } else if (ended = reader.GetRun(e.run_id); ended.ok()) {
      run = &*ended;
    }
    if (run != nullptr) {
      out += SseEvent("run", RunJson(*run));
      if (run->state == RUNNING) steps->emplace(run->id, 0);
    }
  }
  return out;
}

// New points of the tracked runs, each from its cursor on. Runs that became RUNNING without an
// event seen yet (it comes in the next tick) are tracked from here; a run that stopped gets one
// last poll, then is dropped.
std::string PointMessages(const StoreReader& reader, const SweepChanges& changes,
                          std::map<int64_t, int64_t>* steps) {
  std::set<int64_t> still_running;
  for (const RunInfo& run : changes.runs) {
    still_running.insert(run.id);
    steps->emplace(run.id, 0);
  }
  SeriesOptions series;
  series.max_points = 500;  // per run per tick: a long stall is still one bounded message
  std::string out;
  for (auto c = steps->begin(); c != steps->end();) {
    series.from_step = c->second + 1;
    absl::StatusOr<std::vector<StepMetrics>> m = reader.MetricSeries(c->first, series);
    if (m.ok() && !m->empty()) {
      json step = json::array(), loss = json::array(), grad = json::array(),
           elapsed = json::array();
      for (const StepMetrics& p : *m) {
        step.push_back(p.step());
        loss.push_back(p.loss());
        grad.push_back(p.grad_norm());
        elapsed.push_back(p.elapsed_s() > 0 ? json(p.elapsed_s()) : json(nullptr));
      }
      c->second = m->back().step();
      out += SseEvent("points", json{{"run", c->first}, {"step", step}, {"loss", loss},
                                     {"grad_norm", grad}, {"elapsed_s", elapsed}});
    }
    if (still_running.count(c->first) == 0) {
      c = steps->erase(c);
    } else {
      ++c;
    }
  }
  return out;
}

// What one tick sends, in order: the event log, the tracked runs' new points, new spike events
// of the sweep, and the sweep's progress after any event or spike. Empty when nothing changed.
std::string ChangeMessages(const StoreReader& reader, int64_t sweep_id,
                           const SweepChanges& changes, std::map<int64_t, int64_t>* steps) {
  std::string out = EventMessages(reader, changes, steps);
  out += PointMessages(reader, changes, steps);
  for (const SweepSpike& spike : changes.spikes) {
    out += SseEvent("spike", SpikeJson(spike.run_id, spike.event));
  }
  if (!changes.events.empty() || !changes.spikes.empty()) {
    absl::StatusOr<SweepInfo> now = reader.GetSweepById(sweep_id);
    if (now.ok()) out += SseEvent("sweep", SweepJson(*now, NowSeconds()));
  }
  return out;
}

}  // namespace

void DashboardServer::Impl::Stream(Connection* connection, const Request& r) {
  boost::system::error_code ec;
  auto send = [&](absl::string_view text) {
    connection->set_deadline(absl::Now() + options.write_timeout);
    asio::write(*connection, asio::buffer(text.data(), text.size()), ec);
    return !ec;
  };
  auto fail = [&](int status, const std::string& message) {
    send(dashboard::RawErrorResponse(status, message));
  };
  auto it = r.query.find("sweep");
  if (it == r.query.end() || it->second.empty()) return fail(400, "parameter 'sweep' is required");
  absl::StatusOr<SweepInfo> sweep = reader->GetSweep(it->second);
  if (!sweep.ok()) {
    return fail(sweep.status().code() == absl::StatusCode::kNotFound ? 404 : 400,
                std::string(sweep.status().message()));
  }
  const int64_t sweep_id = sweep->id;
  // The client opens the stream, waits for `hello`, then loads the curves: every point after a
  // run's cursor comes on the stream, the rest with the curves (the client drops duplicates).
  absl::StatusOr<StreamCursor> cursor = StartCursor(*reader, sweep_id);
  if (!cursor.ok()) return fail(400, std::string(cursor.status().message()));
  if (!send("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-store\r\n"
            "X-Accel-Buffering: no\r\nConnection: close\r\n\r\nretry: 1000\n\n")) {
    return;
  }
  if (!send(SseEvent("hello", json{{"sweep", sweep->name}, {"sweep_id", sweep_id},
                                   {"time", NowSeconds()}}))) {
    return;
  }
  absl::Time last_write = absl::Now();
  while (Sleep(options.poll_interval)) {
    // A client that left gives its stream slot back now, not at the next write.
    if (connection->PeerClosed()) return;
    absl::StatusOr<SweepChanges> changes =
        reader->ChangesSince(sweep_id, cursor->at, 500, {RUNNING});
    if (!changes.ok()) continue;  // the store is busy or recovering: the next tick asks again
    cursor->at = changes->next;
    std::string out = ChangeMessages(*reader, sweep_id, *changes, &cursor->steps);
    // A comment now and then: proxies keep the connection, and a gone client is noticed.
    if (out.empty() && absl::Now() - last_write > absl::Seconds(10)) out = ": ping\n\n";
    if (!out.empty()) {
      if (!send(out)) return;
      last_write = absl::Now();
    }
  }
}

}  // namespace ablate
