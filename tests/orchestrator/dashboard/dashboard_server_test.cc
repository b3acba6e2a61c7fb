// The dashboard's HTTP API, stream and /metrics on 127.0.0.1:0 over a real SQLite store filled
// through the Store write API; its limits against slow and greedy clients; HTTPS.
#include "orchestrator/dashboard/metrics.h"
#include "orchestrator/dashboard/server.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sqlite3.h>
#include <stdlib.h>

#include <atomic>
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "config/model_config.h"
#include "config/param_count.h"
#include "gmock/gmock.h"
#include "nlohmann/json.hpp"
#include "tests/orchestrator/dashboard/dashboard_test_util.h"
#include "tests/process_util.h"
#include "tests/test_dir.h"

namespace ablate {
namespace {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using tcp = boost::asio::ip::tcp;
using json = nlohmann::json;
using namespace dashboard_test;

constexpr char kToken[] = "0123456789abcdef0123456789abcdef";
constexpr char kAdminToken[] = "admin-fedcba9876543210fedcba98765";  // also_accepted

struct HttpResult {
  int status = 0;
  std::string content_type;
  std::string body;
  std::map<std::string, std::string> headers;  // by their names as sent
  json Json() const { return json::parse(body, nullptr, false); }
};

// One request over a connected `stream` (a socket, or a TLS stream after its handshake), with
// `bearer` as its token ("" for none), and its response. Throws what Beast throws.
template <typename Stream>
HttpResult Exchange(Stream& stream, http::verb method, const std::string& target,
                    const std::string& bearer) {
  http::request<http::string_body> req(method, target, 11);
  req.set(http::field::host, "127.0.0.1");
  if (!bearer.empty()) req.set(http::field::authorization, "Bearer " + bearer);
  http::write(stream, req);
  boost::beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(64 << 20);
  http::read(stream, buffer, parser);
  HttpResult r;
  r.status = static_cast<int>(parser.get().result_int());
  r.content_type = std::string(parser.get()[http::field::content_type]);
  r.body = parser.get().body();
  for (const auto& field : parser.get()) {
    r.headers[std::string(field.name_string())] = std::string(field.value());
  }
  return r;
}

// One GET (or `method`) on a fresh connection.
HttpResult Get(int port, const std::string& target, const std::string& bearer = kToken,
               http::verb method = http::verb::get) {
  asio::io_context io;
  tcp::socket socket(io);
  socket.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
  return Exchange(socket, method, target, bearer);
}

// Raw bytes in, raw response out (for requests Beast's client would not send).
std::string Raw(int port, const std::string& bytes) {
  asio::io_context io;
  tcp::socket socket(io);
  socket.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
  boost::system::error_code ec;
  // The server may answer and close before it has read everything (an oversized header): the
  // rest of the write then fails with EPIPE, and the answer is still there to read.
  asio::write(socket, asio::buffer(bytes), ec);
  std::string out;
  char buf[4096];
  while (true) {
    const size_t n = socket.read_some(asio::buffer(buf), ec);
    if (ec) break;
    out.append(buf, n);
  }
  return out;
}

// Raw bytes in on a fresh connection, whatever comes back within `timeout` out (for a server that
// may not answer).
std::string RawWithin(int port, const std::string& bytes, std::chrono::milliseconds timeout) {
  asio::io_context io;
  tcp::socket socket(io);
  boost::system::error_code ec;
  socket.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port), ec);
  if (ec) return "";
  asio::write(socket, asio::buffer(bytes), ec);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string out;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{socket.native_handle(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    char buf[4096];
    const size_t n = socket.read_some(asio::buffer(buf), ec);
    if (ec) break;
    out.append(buf, n);
  }
  return out;
}

// True when the server closes `socket` (EOF or reset) within `timeout`; what it sends is dropped.
bool ClosedByServerWithin(tcp::socket& socket, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{socket.native_handle(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    char buf[4096];
    boost::system::error_code ec;
    socket.read_some(asio::buffer(buf), ec);
    if (ec) return true;
  }
}

// Shuts `fd` down after `timeout` unless destroyed first: bounds a blocking client (the TLS
// helpers) so that a server that does not answer fails the test instead of hanging it.
class Watchdog {
 public:
  Watchdog(int fd, std::chrono::milliseconds timeout)
      : thread_([this, fd, timeout] {
          absl::MutexLock lock(&mu_);
          if (!mu_.AwaitWithTimeout(absl::Condition(&done_), absl::FromChrono(timeout))) {
            ::shutdown(fd, SHUT_RDWR);
          }
        }) {}
  ~Watchdog() {
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
    }
    thread_.join();
  }

 private:
  absl::Mutex mu_;
  bool done_ = false;
  std::thread thread_;
};

// One GET over TLS, trusting the certificate `ca_file`; status 0 when the handshake or the
// exchange failed (*error says why).
HttpResult GetTls(int port, const std::string& target, const std::string& ca_file,
                  std::string* error, const std::string& bearer = kToken) {
  asio::io_context io;
  asio::ssl::context ctx(asio::ssl::context::tls_client);
  ctx.load_verify_file(ca_file);
  ctx.set_verify_mode(asio::ssl::verify_peer);
  asio::ssl::stream<tcp::socket> stream(io, ctx);
  HttpResult r;
  try {
    stream.next_layer().connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
    Watchdog watchdog(stream.next_layer().native_handle(), std::chrono::seconds(10));
    stream.handshake(asio::ssl::stream_base::client);
    r = Exchange(stream, http::verb::get, target, bearer);
  } catch (const std::exception& e) {
    *error = e.what();
  }
  return r;
}

// An open SSE connection read with deadlines.
class StreamReader {
 public:
  StreamReader(int port, const std::string& target) : socket_(io_) {
    socket_.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
    asio::write(socket_,
                asio::buffer(absl::StrCat("GET ", target, " HTTP/1.1\r\nHost: x\r\n\r\n")));
  }
  // Reads until `needle` appears after `from`, or `timeout`. The position after it, or npos.
  size_t ReadUntil(const std::string& needle, std::chrono::milliseconds timeout, size_t from = 0) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      const size_t at = data_.find(needle, from);
      if (at != std::string::npos) return at + needle.size();
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::string::npos;
      pollfd p{socket_.native_handle(), POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char buf[8192];
      boost::system::error_code ec;
      const size_t n = socket_.read_some(asio::buffer(buf), ec);
      if (ec) return std::string::npos;
      data_.append(buf, n);
    }
  }
  const std::string& data() const { return data_; }

 private:
  asio::io_context io_;
  tcp::socket socket_;
  std::string data_;
};

class DashboardServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::FreshTestDir("dashboard_test").string();
    StoreOptions so;
    so.path = dir_ + "/ablate.db";
    so.synchronous_full = false;
    absl::StatusOr<std::unique_ptr<Store>> store = Store::Open(so);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    Fill();
    DashboardOptions o;
    o.port = 0;
    o.token = kToken;
    o.db_path = so.path;  // its own read-only connections, as `ablate dashboard` has
    o.checkpoint_root = dir_ + "/checkpoints";  // program runs' logs (ProgramRunLog)
    o.poll_interval = absl::Milliseconds(50);
    o.also_accepted = {kAdminToken};
    o.max_connections = 1000;  // ManyConcurrentClients: threads of a loaded machine linger
    o.max_connections_per_client = 1000;
    o.operator_stats = [] {
      return std::vector<DashboardMetric>{
          {"ablate_store_queued_rows", "Rows waiting for the writer.", "gauge", {}, 7},
          {"ablate_workers_connected", "Workers with a lease.", "gauge", {{"kind", "cpu"}}, 2}};
    };
    absl::StatusOr<std::unique_ptr<DashboardServer>> server = DashboardServer::Start(o);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    port_ = server_->port();
  }
  void TearDown() override {
    server_.reset();
    store_.reset();
    std::filesystem::remove_all(dir_);
  }

  // Sweep "gates": 2 variants x 2 seeds of 1000 steps: run 1 SUCCEEDED (1000 steps, evals with
  // probes, a spike; the last evaluation with losses at 3 lengths and 2 attention maps per layer),
  // run 2 DIVERGED at step 300, run 3 RUNNING at step 500, run 4 PENDING.
  void Fill() {
    absl::StatusOr<SweepIds> ids =
        store_->CreateSweep(MakeSweep("gates", {"baseline", "g1_elementwise"}, 2, 1000));
    ASSERT_TRUE(ids.ok()) << ids.status();
    runs_ = ids->run_ids;
    ASSERT_TRUE(StartRun(store_.get(), runs_[0]).ok());
    MetricBatch b = StepBatch(runs_[0], 1, 1, 1, 1000);
    b.evals.push_back(Eval(500, 3, true));
    last_eval_ = Eval(1000, 3, true);
    AddLengths(&last_eval_, {64, 256, 1024}, 256, 0.3);
    AddAttentionMaps(&last_eval_, 3, 2, 16);
    b.evals.push_back(last_eval_);
    SpikeEvent& spike = b.spikes.emplace_back();
    spike.set_step(420);
    spike.set_signal("loss");
    spike.set_value(9.5);
    spike.set_baseline(3.1);
    spike.set_kind(SPIKE_STATISTICAL);
    spike.set_action(SPIKE_ACTION_RECORDED);
    ASSERT_TRUE(store_->ReportMetrics(b).ok());
    ASSERT_TRUE(FinishRun(store_.get(), runs_[0], SUCCEEDED, 1000, "", 1).ok());
    ASSERT_TRUE(StartRun(store_.get(), runs_[1]).ok());
    ASSERT_TRUE(store_->ReportMetrics(StepBatch(runs_[1], 1, 1, 1, 300)).ok());
    ASSERT_TRUE(
        FinishRun(store_.get(), runs_[1], DIVERGED, 300, "loss non-finite for 3 steps").ok());
    absl::StatusOr<int64_t> w1 = store_->RegisterWorker("w1", "{\"device\":\"cpu\",\"slots\":2}");
    ASSERT_TRUE(w1.ok()) << w1.status();
    ASSERT_TRUE(StartRun(store_.get(), runs_[2], *w1).ok());
    ASSERT_TRUE(store_->ReportMetrics(StepBatch(runs_[2], 1, 1, 1, 500)).ok());
    ASSERT_TRUE(store_->Flush().ok());
  }

  std::string dir_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<DashboardServer> server_;
  std::vector<int64_t> runs_;
  EvalResult last_eval_;  // run 1's evaluation at step 1000, as reported
  int port_ = 0;
};

TEST_F(DashboardServerTest, ApiNeedsTheToken) {
  for (const std::string& bearer : {std::string(), std::string("wrong"),
                                    std::string(kToken).substr(1), std::string(kToken) + "0"}) {
    HttpResult r = Get(port_, "/api/sweeps", bearer);
    EXPECT_EQ(r.status, 401) << bearer;
    EXPECT_TRUE(absl::StrContains(r.Json().value("error", ""), "not authorized")) << r.body;
  }
  EXPECT_EQ(Get(port_, "/api/sweeps?token=nope", "").status, 401);
  EXPECT_EQ(Get(port_, "/metrics", "").status, 401);
  EXPECT_EQ(Get(port_, "/api/runs/1", "").status, 401);
  EXPECT_EQ(Get(port_, "/api/stream?sweep=gates", "").status, 401);
  EXPECT_EQ(Get(port_, "/api/sweeps").status, 200);
  EXPECT_EQ(Get(port_, "/healthz", "").status, 200);
  EXPECT_EQ(server_->Url(), absl::StrCat("http://127.0.0.1:", port_, "/?token=", kToken));
}

// The URL's token in a query opens the event stream (EventSource cannot set headers) and nothing
// else; the other accepted credentials work as a bearer header only.
TEST_F(DashboardServerTest, TokenInTheQueryOnlyOpensTheStream) {
  for (const std::string target : {"/api/sweeps", "/api/runs/1", "/metrics", "/api/workers"}) {
    HttpResult r = Get(port_, absl::StrCat(target, "?token=", kToken), "");
    EXPECT_EQ(r.status, 401) << target;
    EXPECT_TRUE(absl::StrContains(r.Json().value("error", ""), "Authorization: Bearer")) << r.body;
    EXPECT_EQ(Get(port_, target, kToken).status, 200) << target;
    EXPECT_EQ(Get(port_, target, kAdminToken).status, 200) << target;
  }
  StreamReader stream(port_, absl::StrCat("/api/stream?sweep=gates&token=", kToken));
  EXPECT_NE(stream.ReadUntil("event: hello\n", std::chrono::seconds(5)), std::string::npos)
      << stream.data();
  StreamReader admin_in_query(port_, absl::StrCat("/api/stream?sweep=gates&token=", kAdminToken));
  EXPECT_NE(admin_in_query.ReadUntil("HTTP/1.1 401", std::chrono::seconds(5)), std::string::npos)
      << admin_in_query.data();
}

TEST(DashboardServerStartTest, RefusesNoTokenAndMissingDatabase) {
  DashboardOptions o;
  o.port = 0;
  o.db_path = "/nonexistent/ablate.db";
  EXPECT_EQ(DashboardServer::Start(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.token = kToken;
  EXPECT_EQ(DashboardServer::Start(o).status().code(), absl::StatusCode::kNotFound);
  o.also_accepted = {""};
  EXPECT_EQ(DashboardServer::Start(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.also_accepted.clear();
  o.tls_cert_file = "/nonexistent/cert.pem";
  EXPECT_EQ(DashboardServer::Start(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.tls_key_file = "/nonexistent/key.pem";
  absl::Status missing = DashboardServer::Start(o).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(missing.message(), "/nonexistent/cert.pem")) << missing;
}

TEST_F(DashboardServerTest, ServesTheEmbeddedApp) {
  HttpResult index = Get(port_, "/", "");
  EXPECT_EQ(index.status, 200);
  EXPECT_TRUE(absl::StartsWith(index.content_type, "text/html"));
  EXPECT_TRUE(absl::StrContains(index.body, "/vendor/uPlot.iife.min.js"));
  HttpResult uplot = Get(port_, "/vendor/uPlot.iife.min.js", "");
  EXPECT_EQ(uplot.status, 200);
  EXPECT_TRUE(absl::StartsWith(uplot.content_type, "text/javascript"));
  EXPECT_GT(uplot.body.size(), 20000u);
  EXPECT_EQ(Get(port_, "/vendor/uPlot.min.css", "").status, 200);
  for (const char* module :
       {"/js/app.js", "/js/api.js", "/js/charts.js", "/js/format.js", "/js/pages/sweeps.js",
        "/js/pages/sweep.js", "/js/pages/run.js", "/js/pages/compare.js", "/js/figures.js",
        "/js/report.js", "/style.css"}) {
    EXPECT_EQ(Get(port_, module, "").status, 200) << module;
  }
  EXPECT_EQ(Get(port_, "/nope.js", "").status, 404);
  EXPECT_EQ(Get(port_, "/../etc/passwd", "").status, 404);

  // No other site may frame the dashboard, run scripts in it or learn its URLs (with the token
  // in a query) from a Referer; the API answers carry the same headers.
  for (const HttpResult& r : {index, Get(port_, "/api/sweeps")}) {
    EXPECT_EQ(r.headers.count("Content-Security-Policy"), 1u);
    const std::string csp = r.headers.count("Content-Security-Policy") > 0
                                ? r.headers.at("Content-Security-Policy")
                                : "";
    EXPECT_TRUE(absl::StrContains(csp, "frame-ancestors 'none'")) << csp;
    EXPECT_TRUE(absl::StrContains(csp, "script-src 'self'")) << csp;
    EXPECT_TRUE(absl::StrContains(csp, "default-src 'self'")) << csp;
    EXPECT_EQ(r.headers.count("X-Frame-Options") ? r.headers.at("X-Frame-Options") : "", "DENY");
    EXPECT_EQ(r.headers.count("Referrer-Policy") ? r.headers.at("Referrer-Policy") : "",
              "no-referrer");
  }
}

TEST_F(DashboardServerTest, Sweeps) {
  json j = Get(port_, "/api/sweeps").Json();
  ASSERT_EQ(j["sweeps"].size(), 1u);
  const json& s = j["sweeps"][0];
  EXPECT_EQ(s["name"], "gates");
  EXPECT_EQ(s["state"], "ACTIVE");
  EXPECT_EQ(s["runs"], 4);
  EXPECT_EQ(s["by_state"]["SUCCEEDED"], 1);
  EXPECT_EQ(s["by_state"]["DIVERGED"], 1);
  EXPECT_EQ(s["by_state"]["RUNNING"], 1);
  EXPECT_EQ(s["by_state"]["PENDING"], 1);
  EXPECT_EQ(s["steps_done"], 1800);
  EXPECT_EQ(s["steps_total"], 4000);
  EXPECT_TRUE(s["eta_s"].is_number());
  EXPECT_GT(s["eta_s"].get<double>(), 0);
}

TEST_F(DashboardServerTest, SweepRunTable) {
  json j = Get(port_, "/api/sweeps/gates").Json();
  EXPECT_EQ(j["sweep"]["name"], "gates");
  ASSERT_EQ(j["runs"].size(), 4u);
  ASSERT_EQ(j["variants"].size(), 2u);
  EXPECT_EQ(j["variants"][1]["budget"], "ffn 64 -> 63");
  const json& done = j["runs"][0];
  EXPECT_EQ(done["id"], runs_[0]);
  EXPECT_EQ(done["state"], "SUCCEEDED");
  EXPECT_EQ(done["variant"], "baseline");
  EXPECT_EQ(done["last_step"], 1000);
  EXPECT_NEAR(done["last_loss"].get<double>(), LossAt(1000, runs_[0]), 1e-9);
  EXPECT_EQ(done["spike_steps"], 1);
  EXPECT_EQ(j["runs"][1]["state"], "DIVERGED");
  EXPECT_EQ(j["runs"][1]["reason"], "loss non-finite for 3 steps");
  EXPECT_EQ(j["runs"][1]["budget"], "ffn 64 -> 63");
  EXPECT_EQ(j["runs"][2]["steps_done"], 500);
  EXPECT_TRUE(j["runs"][3]["last_loss"].is_null());  // PENDING: no point yet
  // By id as well as by name.
  EXPECT_EQ(Get(port_, "/api/sweeps/1").Json()["sweep"]["name"], "gates");
}

TEST_F(DashboardServerTest, CurvesAreDownsampledPerRun) {
  json j = Get(port_, "/api/sweeps/gates/curves?points=100").Json();
  ASSERT_EQ(j["runs"].size(), 4u);
  EXPECT_EQ(j["points"], 100);
  const json& first = j["runs"][0];
  // Every 10th step (a grid shared by the runs) + the last point + the spike step.
  EXPECT_LE(first["step"].size(), 102u);
  EXPECT_GE(first["step"].size(), 90u);
  EXPECT_EQ(first["step"].size(), first["value"].size());
  EXPECT_EQ(first["step"].back(), 1000);
  ASSERT_EQ(first["spikes"].size(), 1u);
  EXPECT_EQ(first["spikes"][0]["step"], 420);
  bool has_spike_step = false;
  for (const json& s : first["step"]) has_spike_step |= s == 420;
  EXPECT_TRUE(has_spike_step);
  EXPECT_EQ(j["runs"][3]["step"].size(), 0u);
  // Fewer points than asked: every point.
  EXPECT_EQ(Get(port_, "/api/sweeps/gates/curves?points=5000").Json()["runs"][1]["step"].size(),
            300u);
  // Huge requests are capped.
  EXPECT_EQ(Get(port_, "/api/sweeps/gates/curves?points=1000000000").Json()["points"], 5000);
  // The runs share their steps: the grid's, with the spike steps added.
  json shared = Get(port_, "/api/sweeps/gates/curves?points=50").Json();
  EXPECT_EQ(shared["stride"], 20);
  EXPECT_EQ(shared["runs"][2]["step"][0], 20);
  EXPECT_EQ(shared["runs"][0]["step"][0], 20);
  EXPECT_EQ(shared["runs"][2]["step"].back(), 500);
  json grad = Get(port_, "/api/sweeps/gates/curves?metric=grad_norm&points=10").Json();
  EXPECT_EQ(grad["metric"], "grad_norm");
  EXPECT_LE(grad["runs"][0]["step"].size(), 12u);
}

// A step count near 2^63 (what a coordinator stored before it checked reports at the door) once
// made the grid stride overflow to 1: a grid of 2^63 steps. Now every view still answers.
// Curves against tokens seen, FLOPs spent or training seconds: an `x` beside each run's steps,
// from its config (step x batch x seq_len x grad_accum, times FLOPs per token) or its points'
// elapsed_s. A bad `x` names the choices.
TEST_F(DashboardServerTest, CurvesAgainstTokensFlopsOrTime) {
  const json steps = Get(port_, "/api/sweeps/gates/curves?points=50").Json();
  EXPECT_FALSE(steps["runs"][0].contains("x"));
  const TrainConfig t = DefaultTrainConfig();
  const double tokens_per_step = static_cast<double>(t.batch_size()) * t.seq_len() * t.grad_accum();
  const json tokens = Get(port_, "/api/sweeps/gates/curves?points=50&x=tokens").Json();
  EXPECT_EQ(tokens["x"], "tokens");
  const json& run = tokens["runs"][0];
  ASSERT_EQ(run["x"].size(), run["step"].size());
  for (size_t i = 0; i < run["step"].size(); ++i) {
    EXPECT_DOUBLE_EQ(run["x"][i].get<double>(), run["step"][i].get<double>() * tokens_per_step);
  }
  const json flops = Get(port_, "/api/sweeps/gates/curves?points=50&x=flops").Json();
  const double per_token = TrainingFlopsPerToken(DefaultModelConfig(), t.seq_len());
  EXPECT_NEAR(flops["runs"][0]["x"][0].get<double>(),
              flops["runs"][0]["step"][0].get<double>() * tokens_per_step * per_token,
              1e-6 * flops["runs"][0]["x"][0].get<double>());
  const json time = Get(port_, "/api/sweeps/gates/curves?points=50&x=time").Json();
  EXPECT_DOUBLE_EQ(time["runs"][0]["x"][3].get<double>(),
                   0.05 * time["runs"][0]["step"][3].get<double>());
  const HttpResult bad = Get(port_, "/api/sweeps/gates/curves?x=parsecs");
  EXPECT_EQ(bad.status, 400);
  EXPECT_THAT(bad.body, ::testing::HasSubstr("parameter 'x' must be step, tokens, flops or time"));
}

TEST_F(DashboardServerTest, AbsurdStepCountsStillServeSweepsCurvesAndMetrics) {
  ASSERT_TRUE(store_
                  ->RunOnWriterForTesting([](sqlite3* db) {
                    return sqlite3_exec(db, "UPDATE runs SET steps_done = 9223372036854775807",
                                        nullptr, nullptr, nullptr) == SQLITE_OK
                               ? absl::OkStatus()
                               : absl::InternalError(sqlite3_errmsg(db));
                  })
                  .ok());
  EXPECT_EQ(Get(port_, "/api/sweeps").status, 200);
  const HttpResult curves = Get(port_, "/api/sweeps/gates/curves?points=100");
  ASSERT_EQ(curves.status, 200) << curves.body;
  EXPECT_EQ(curves.Json()["stride"], int64_t{92233720368547759});
  EXPECT_EQ(Get(port_, "/metrics").status, 200);
}

TEST_F(DashboardServerTest, RunEndpoints) {
  const std::string run = absl::StrCat("/api/runs/", runs_[0]);
  json j = Get(port_, run).Json();
  EXPECT_EQ(j["run"]["id"], runs_[0]);
  EXPECT_EQ(j["run"]["state"], "SUCCEEDED");
  EXPECT_EQ(j["run"]["devices"], 1);  // resources.devices: one process unless asked
  EXPECT_TRUE(j["run"]["config"].is_object());
  EXPECT_EQ(j["run"]["config"]["train"]["steps"], 1000);
  ASSERT_EQ(j["run"]["attempt_list"].size(), 1u);
  EXPECT_EQ(j["run"]["attempt_list"][0]["state"], "SUCCEEDED");

  json all = Get(port_, run + "/metrics?points=5000").Json();
  EXPECT_EQ(all["step"].size(), 1000u);
  for (const char* k : {"loss", "grad_norm", "lr", "tokens_per_s", "skipped"}) {
    EXPECT_EQ(all[k].size(), 1000u) << k;
  }
  json window = Get(port_, run + "/metrics?from=100&to=199&points=5000").Json();
  ASSERT_EQ(window["step"].size(), 100u);
  EXPECT_EQ(window["step"][0], 100);
  json stride = Get(port_, run + "/metrics?points=50&mode=stride").Json();
  EXPECT_EQ(stride["mode"], "stride");
  EXPECT_LE(stride["step"].size(), 52u);
  json minmax = Get(port_, run + "/metrics?points=50").Json();
  EXPECT_LE(minmax["step"].size(), 52u);

  json evals = Get(port_, run + "/evals").Json();
  ASSERT_EQ(evals["evals"].size(), 2u);
  EXPECT_EQ(evals["evals"][1]["step"], 1000);
  EXPECT_NEAR(evals["evals"][1]["gate_score"].get<double>(), 0.2, 1e-9);

  json probes = Get(port_, run + "/probes").Json();  // the latest evaluation
  EXPECT_EQ(probes["step"], 1000);
  ASSERT_EQ(probes["layers"].size(), 3u);
  EXPECT_EQ(probes["layers"][2]["m_act"], 30.0);
  EXPECT_NEAR(probes["layers"][2]["f_attn"].get<double>(), 0.3, 1e-9);
  ASSERT_EQ(probes["layers"][0]["gate_histogram"]["counts"].size(), 10u);
  EXPECT_EQ(probes["layers"][0]["gate_histogram"]["counts"][0], 1000);
  EXPECT_EQ(Get(port_, run + "/probes?step=500").Json()["step"], 500);
  EXPECT_EQ(Get(port_, run + "/probes?step=501").status, 404);
  // A run without evaluations: no layers, not an error.
  EXPECT_EQ(Get(port_, absl::StrCat("/api/runs/", runs_[2], "/probes")).Json()["layers"].size(),
            0u);

  json spikes = Get(port_, run + "/spikes").Json();
  ASSERT_EQ(spikes["spikes"].size(), 1u);
  EXPECT_EQ(spikes["spikes"][0]["kind"], "SPIKE_STATISTICAL");
  EXPECT_EQ(spikes["spikes"][0]["value"], 9.5);
}

// A program run's output as its worker keeps it under the checkpoint root (common/run_logs.h):
// the last attempt's by default, the older half first, its last lines; another attempt; what
// is not UTF-8 replaced, the JSON still valid; bad parameters a 400 naming them; no log a 404.
TEST_F(DashboardServerTest, ProgramRunLog) {
  const std::filesystem::path logs =
      std::filesystem::path(dir_) / "checkpoints" / absl::StrCat("run-", runs_[2]) / "logs";
  std::filesystem::create_directories(logs);
  std::ofstream(logs / "attempt-1.log") << "attempt 1 was lost\n";
  std::ofstream(logs / "attempt-2.log.1") << "old 0\nold 1\nold 2\nold 3\nold 4\n";
  // Not UTF-8: bytes that start nothing, and a sequence cut short at the end of the line.
  const std::string bad = "\xff\xfe<b>not markup</b> \xc3";
  std::ofstream(logs / "attempt-2.log", std::ios::binary) << "new 0\nnew 1\nnew 2\nnew 3\nnew 4\n"
                                                          << bad << "\n";
  const std::string base = absl::StrCat("/api/runs/", runs_[2], "/log");

  HttpResult r = Get(port_, base);
  ASSERT_EQ(r.status, 200) << r.body;
  json j = r.Json();
  ASSERT_FALSE(j.is_discarded()) << r.body;
  EXPECT_EQ(j["run"], runs_[2]);
  EXPECT_EQ(j["attempt"], 2);
  EXPECT_EQ(j["attempts"], json::array({1, 2}));
  EXPECT_EQ(j["path"], (logs / "attempt-2.log").string());
  EXPECT_EQ(j["tail"], 200);
  EXPECT_EQ(j["truncated"], false);
  ASSERT_EQ(j["lines"].size(), 11u);
  EXPECT_EQ(j["lines"][0], "old 0");  // the older half first
  EXPECT_EQ(j["lines"][5], "new 0");
  // Each byte that is not UTF-8 is U+FFFD; the rest as written (the page shows it as text).
  EXPECT_EQ(j["lines"][10], "\uFFFD\uFFFD<b>not markup</b> \uFFFD");

  j = Get(port_, base + "?tail=7").Json();
  EXPECT_EQ(j["tail"], 7);
  EXPECT_EQ(j["truncated"], true);
  EXPECT_EQ(j["lines"], json::array({"old 4", "new 0", "new 1", "new 2", "new 3", "new 4",
                                     "\uFFFD\uFFFD<b>not markup</b> \uFFFD"}));
  j = Get(port_, base + "?tail=2&attempt=2").Json();
  EXPECT_EQ(j["lines"].size(), 2u);
  EXPECT_EQ(j["lines"][0], "new 4");
  EXPECT_EQ(Get(port_, base + "?tail=999999").Json()["tail"], 5000);  // capped

  j = Get(port_, base + "?attempt=1").Json();
  EXPECT_EQ(j["attempt"], 1);
  EXPECT_EQ(j["attempts"], json::array({1, 2}));
  EXPECT_EQ(j["lines"], json::array({"attempt 1 was lost"}));
  EXPECT_EQ(Get(port_, base + "?attempt=0").Json()["attempt"], 2);  // 0: the last

  for (const auto& [query, name] : std::vector<std::pair<std::string, std::string>>{
           {"?tail=0", "tail"},
           {"?tail=-3", "tail"},
           {"?tail=abc", "tail"},
           {"?tail=1e3", "tail"},
           {"?attempt=-1", "attempt"},
           {"?attempt=x", "attempt"},
           {"?attempt=99999999999", "attempt"},
           {"?attempt=99999999999999999999999", "attempt"}}) {
    HttpResult bad_request = Get(port_, base + query);
    EXPECT_EQ(bad_request.status, 400) << query << ": " << bad_request.body;
    EXPECT_TRUE(absl::StrContains(bad_request.Json().value("error", ""), "'" + name + "'"))
        << query << ": " << bad_request.body;
  }

  HttpResult missing = Get(port_, base + "?attempt=3");
  EXPECT_EQ(missing.status, 404) << missing.body;
  EXPECT_TRUE(absl::StrContains(
      missing.Json().value("error", ""),
      absl::StrCat("no output of run ", runs_[2], " attempt 3 in ", logs.string())))
      << missing.body;
  // A run with no log (built-in, or trained on another machine's disk): the same message.
  missing = Get(port_, absl::StrCat("/api/runs/", runs_[0], "/log"));
  EXPECT_EQ(missing.status, 404) << missing.body;
  EXPECT_TRUE(
      absl::StrContains(missing.Json().value("error", ""), "only program runs keep their output"))
      << missing.body;
  EXPECT_EQ(Get(port_, "/api/runs/424242/log").status, 404);  // no such run
  EXPECT_EQ(Get(port_, base, "").status, 401);
}

// An evaluation that stored no per-layer probes is an evaluation still: its probes are an empty
// list, the latest evaluation's too; only a step without one is a 404.
TEST_F(DashboardServerTest, AnEvaluationWithoutProbesHasNoLayersNotA404) {
  MetricBatch b;
  b.run_id = runs_[2];  // RUNNING, no evaluation yet
  b.attempt = 1;
  b.seq = 2;
  b.evals.push_back(Eval(400, 0, false));
  ASSERT_TRUE(store_->ReportMetrics(b).ok());
  const std::string run = absl::StrCat("/api/runs/", runs_[2]);
  for (const std::string& target : {run + "/probes", run + "/probes?step=400"}) {
    HttpResult r = Get(port_, target);
    ASSERT_EQ(r.status, 200) << target << ": " << r.body;
    EXPECT_EQ(r.Json()["step"], 400) << target;
    EXPECT_EQ(r.Json()["layers"], json::array()) << target;
  }
  HttpResult missing = Get(port_, run + "/probes?step=401");
  EXPECT_EQ(missing.status, 404);
  EXPECT_EQ(missing.Json()["error"],
            absl::StrCat("run ", runs_[2], " has no evaluation at step 401"));
  EXPECT_EQ(Get(port_, run + "/attention").Json()["step"], 400);
}

TEST_F(DashboardServerTest, EvalsCarryTheirLengths) {
  json evals = Get(port_, absl::StrCat("/api/runs/", runs_[0], "/evals")).Json()["evals"];
  ASSERT_EQ(evals.size(), 2u);
  EXPECT_EQ(evals[0]["lengths"], json::array());  // an evaluation without eval_seq_lens
  const json& lengths = evals[1]["lengths"];
  ASSERT_EQ(lengths.size(), 3u) << lengths;
  for (int i = 0; i < 3; ++i) {
    const LengthEval& want = last_eval_.lengths(i);
    EXPECT_EQ(lengths[i]["seq_len"], want.seq_len()) << i;
    EXPECT_DOUBLE_EQ(lengths[i]["val_loss"].get<double>(), want.val_loss()) << i;
    EXPECT_DOUBLE_EQ(lengths[i]["val_ppl"].get<double>(), want.val_ppl()) << i;
    EXPECT_EQ(lengths[i]["yarn"], want.yarn()) << i;
  }
  EXPECT_EQ(lengths[0]["yarn"], false);
  EXPECT_EQ(lengths[2]["yarn"], true);
  EXPECT_GT(lengths[2]["val_ppl"].get<double>(), lengths[1]["val_ppl"].get<double>());
}

TEST_F(DashboardServerTest, AttentionMapsOfAnEvaluation) {
  const std::string run = absl::StrCat("/api/runs/", runs_[0], "/attention");
  // The latest evaluation by default: every map as reported, by layer then head.
  for (const std::string& target : {run, run + "?step=1000"}) {
    HttpResult r = Get(port_, target);
    ASSERT_EQ(r.status, 200) << target << ": " << r.body;
    json j = r.Json();
    EXPECT_EQ(j["run"], runs_[0]);
    EXPECT_EQ(j["step"], 1000);
    ASSERT_EQ(j["maps"].size(), 9u) << target;  // 3 layers x (the mean, 2 heads)
    EXPECT_EQ(j["maps"][0]["head"], -1);
    for (int i = 0; i < 9; ++i) {
      const AttentionMap& want = last_eval_.attention_maps(i);
      const json& map = j["maps"][i];
      EXPECT_EQ(map["layer"], want.layer()) << i;
      EXPECT_EQ(map["head"], want.head()) << i;
      EXPECT_EQ(map["size"], 16) << i;
      ASSERT_EQ(map["probs"].size(), 256u) << i;
      std::vector<int> expected(want.probs().begin(), want.probs().end());
      for (int& v : expected) v = static_cast<uint8_t>(v);
      EXPECT_EQ(map["probs"].get<std::vector<int>>(), expected) << i;
    }
    EXPECT_EQ(j["maps"][0]["probs"][0], 255);  // query 0 attends to key 0 alone
    EXPECT_EQ(j["maps"][0]["probs"][1], 0);    // above the diagonal
  }
  // An evaluation that stored no map: an empty list, not an error.
  json none = Get(port_, run + "?step=500").Json();
  EXPECT_EQ(none["step"], 500);
  EXPECT_EQ(none["maps"], json::array());
  // A step without an evaluation: 404 naming it.
  HttpResult missing = Get(port_, run + "?step=501");
  EXPECT_EQ(missing.status, 404);
  EXPECT_EQ(missing.Json()["error"],
            absl::StrCat("run ", runs_[0], " has no evaluation at step 501"));
  // A run without evaluations: no step, no maps.
  json running = Get(port_, absl::StrCat("/api/runs/", runs_[2], "/attention")).Json();
  EXPECT_TRUE(running["step"].is_null()) << running;
  EXPECT_EQ(running["maps"], json::array());
  // A step that is not an integer.
  HttpResult bad = Get(port_, run + "?step=last");
  EXPECT_EQ(bad.status, 400);
  EXPECT_TRUE(absl::StrContains(bad.Json()["error"].get<std::string>(), "step")) << bad.body;
  EXPECT_EQ(Get(port_, "/api/runs/424242/attention").status, 404);
}

// Each row's final PPL per evaluation length: mean ± sample std over the SUCCEEDED seeds, from
// each run's last evaluation; a variant none of whose runs succeeded has none.
TEST_F(DashboardServerTest, TableCarriesLengthsPerVariant) {
  json gates = Get(port_, "/api/sweeps/gates/table").Json();
  ASSERT_EQ(gates["rows"].size(), 2u);
  const json& baseline = gates["rows"][0]["lengths"];
  ASSERT_EQ(baseline.size(), 3u) << baseline;
  EXPECT_EQ(baseline[2]["seq_len"], 1024);
  EXPECT_EQ(baseline[2]["yarn"], true);
  EXPECT_EQ(baseline[0]["yarn"], false);
  EXPECT_EQ(baseline[2]["n"], 1);
  EXPECT_DOUBLE_EQ(baseline[2]["val_ppl"]["mean"].get<double>(), last_eval_.lengths(2).val_ppl());
  EXPECT_TRUE(baseline[2]["val_ppl"]["std"].is_null());   // n = 1: NaN -> null
  EXPECT_EQ(gates["rows"][1]["lengths"], json::array());  // g1: diverged, nothing succeeded

  // Three seeds of two variants, each with an earlier evaluation that must not count.
  absl::StatusOr<SweepIds> ids =
      store_->CreateSweep(MakeSweep("long", {"baseline", "g1_elementwise"}, 3, 100));
  ASSERT_TRUE(ids.ok()) << ids.status();
  std::map<std::string, std::vector<double>> ppl_1024;  // by variant
  for (size_t i = 0; i < ids->run_ids.size(); ++i) {
    const int64_t id = ids->run_ids[i];
    const std::string variant = i % 2 == 0 ? "baseline" : "g1_elementwise";
    ASSERT_TRUE(StartRun(store_.get(), id).ok());
    MetricBatch b = StepBatch(id, 1, 1, 1, 100);
    EvalResult early = Eval(50, 2, true);
    AddLengths(&early, {256, 1024}, 256, 5.0);
    EvalResult last = Eval(100, 2, true);
    AddLengths(&last, {256, 1024}, 256, (i % 2 == 0 ? 0.4 : 0.1) + 0.05 * static_cast<double>(i));
    ppl_1024[variant].push_back(last.lengths(1).val_ppl());
    b.evals = {early, last};
    ASSERT_TRUE(store_->ReportMetrics(b).ok());
    ASSERT_TRUE(FinishRun(store_.get(), id, SUCCEEDED, 100, "").ok());
  }
  ASSERT_TRUE(store_->Flush().ok());
  json table = Get(port_, "/api/sweeps/long/table").Json();
  ASSERT_EQ(table["rows"].size(), 2u);
  for (const json& row : table["rows"]) {
    const std::vector<double>& v = ppl_1024[row["variant"].get<std::string>()];
    ASSERT_EQ(v.size(), 3u) << row["variant"];
    const double mean = (v[0] + v[1] + v[2]) / 3;
    double ss = 0;
    for (double x : v) ss += (x - mean) * (x - mean);
    const json& lengths = row["lengths"];
    ASSERT_EQ(lengths.size(), 2u) << row;
    EXPECT_EQ(lengths[0]["seq_len"], 256);
    EXPECT_EQ(lengths[1]["seq_len"], 1024);
    EXPECT_EQ(lengths[1]["n"], 3);
    EXPECT_NEAR(lengths[1]["val_ppl"]["mean"].get<double>(), mean, 1e-9) << row["variant"];
    EXPECT_NEAR(lengths[1]["val_ppl"]["std"].get<double>(), std::sqrt(ss / 2), 1e-9)
        << row["variant"];
    EXPECT_TRUE(lengths[1]["val_loss"]["mean"].is_number());
  }
}

TEST_F(DashboardServerTest, TableEventsWorkers) {
  json table = Get(port_, "/api/sweeps/gates/table").Json();
  ASSERT_EQ(table["rows"].size(), 2u);
  EXPECT_EQ(table["rows"][0]["variant"], "baseline");
  EXPECT_EQ(table["rows"][0]["n"], 1);
  EXPECT_EQ(table["rows"][1]["diverged"], 1);
  EXPECT_TRUE(table["rows"][0]["val_loss"]["mean"].is_number());
  EXPECT_TRUE(table["rows"][0]["val_loss"]["std"].is_null());  // n = 1

  json events = Get(port_, "/api/sweeps/gates/events").Json()["events"];
  ASSERT_GE(events.size(), 4u);
  bool diverged = false;
  for (const json& e : events) {
    diverged |= absl::StrContains(e["message"].get<std::string>(), "DIVERGED");
  }
  EXPECT_TRUE(diverged);
  const int64_t second = events[1]["id"];
  json after = Get(port_, absl::StrCat("/api/sweeps/gates/events?after=", second, "&limit=1"))
                   .Json()["events"];
  ASSERT_EQ(after.size(), 1u);
  EXPECT_GT(after[0]["id"].get<int64_t>(), second);

  json workers = Get(port_, "/api/workers").Json()["workers"];
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_EQ(workers[0]["name"], "w1");
  EXPECT_EQ(workers[0]["slots_in_use"], 1);  // run 3 holds one of its 2 slots
  EXPECT_EQ(workers[0]["running"], 1);
}

// The compare page's charts: the comparison's groups with their loss bands, probes and gate
// histograms (orchestrator/report/figures.h); a variant with no finished run shows the latest
// evaluation of its runs still training, marked interim.
TEST_F(DashboardServerTest, SweepFigures) {
  json f = Get(port_, "/api/sweeps/gates/figures?points=100").Json();
  EXPECT_EQ(f["sweep"], "gates");
  EXPECT_EQ(f["state"], "ACTIVE");
  EXPECT_EQ(f["stride"], 10);  // the longest run (1000 steps) over 100 points
  ASSERT_EQ(f["steps"].size(), 100u);
  EXPECT_EQ(f["steps"][0], 10);
  ASSERT_EQ(f["groups"].size(), 2u);
  const json& baseline = f["groups"][0];
  EXPECT_EQ(baseline["label"], "baseline");
  EXPECT_FALSE(baseline["interim"].get<bool>());
  EXPECT_EQ(baseline["eval_runs"], 1);  // run 1 SUCCEEDED; run 3 is still training
  EXPECT_EQ(baseline["eval_step_max"], 1000);
  EXPECT_EQ(baseline["band_runs"], 2);  // runs 1 and 3 (at step 500)
  // Step 500: both runs; step 1000: run 1 alone.
  EXPECT_EQ(baseline["loss"]["n"][49], 2);
  EXPECT_NEAR(baseline["loss"]["mean"][49].get<double>(),
              (LossAt(500, runs_[0]) + LossAt(500, runs_[2])) / 2, 1e-5);
  EXPECT_EQ(baseline["loss"]["n"][99], 1);
  EXPECT_TRUE(baseline["loss"]["std"][99].is_null());
  // The 3 layers of run 1's evaluation at step 1000, gated (dashboard_test_util.h: M-Act
  // 10 (l + 1), bin 0 of layer l counts 1000 + l).
  ASSERT_EQ(baseline["layers"].size(), 3u);
  EXPECT_EQ(baseline["layers"][1]["m_act"]["mean"], 20);
  EXPECT_EQ(baseline["gate_histogram"]["counts"][0], 1000 + 1001 + 1002);
  ASSERT_EQ(baseline["spikes"].size(), 1u);
  EXPECT_EQ(baseline["spikes"][0]["step"], 420);
  // g1_elementwise: run 2 DIVERGED (drawn apart), run 4 PENDING with nothing yet.
  const json& g1 = f["groups"][1];
  EXPECT_FALSE(g1["interim"].get<bool>());
  EXPECT_EQ(g1["eval_runs"], 0);
  EXPECT_TRUE(g1["val_loss"]["mean"].is_null());
  ASSERT_EQ(g1["diverged_curves"].size(), 1u);
  EXPECT_EQ(g1["diverged_curves"][0]["run"], runs_[1]);
  EXPECT_EQ(g1["diverged_curves"][0]["step"].back(), 300);

  // Run 4 starts and reports an evaluation at step 200: g1_elementwise's interim values.
  ASSERT_TRUE(StartRun(store_.get(), runs_[3]).ok());
  MetricBatch b = StepBatch(runs_[3], 1, 1, 1, 250);
  b.evals.push_back(Eval(100, 3, true));
  b.evals.push_back(Eval(200, 3, true));
  ASSERT_TRUE(store_->ReportMetrics(b).ok());
  ASSERT_TRUE(store_->Flush().ok());
  const json live = Get(port_, "/api/sweeps/gates/figures").Json()["groups"][1];
  EXPECT_TRUE(live["interim"].get<bool>());
  EXPECT_EQ(live["n"], 0);
  EXPECT_EQ(live["eval_runs"], 1);
  EXPECT_EQ(live["eval_step_max"], 200);
  EXPECT_NEAR(live["val_loss"]["mean"].get<double>(), Eval(200, 3, true).val_loss(), 1e-6);
  EXPECT_EQ(live["layers"].size(), 3u);
  // The table keeps no value for it: the page shows these in its place, marked interim.
  EXPECT_TRUE(
      Get(port_, "/api/sweeps/gates/table").Json()["rows"][1]["val_loss"]["mean"].is_null());
}

// A tuned sweep's chart (dashboard_test_util.h, WriteTunedSweep): per variant and value the mean
// over the runs that trained to the end, the diverged count, the stopped runs with their metric
// at the rung, and a boundary sweep's brackets with what they found; an untuned sweep has none.
TEST_F(DashboardServerTest, TunedSweepChart) {
  absl::StatusOr<SweepIds> edge = WriteTunedSweep(store_.get(), "edge", "boundary");
  ASSERT_TRUE(edge.ok()) << edge.status();
  absl::StatusOr<SweepIds> halving = WriteTunedSweep(store_.get(), "halving", "asha");
  ASSERT_TRUE(halving.ok()) << halving.status();
  const json t = Get(port_, "/api/sweeps/edge/tune").Json();
  EXPECT_EQ(t["tune"]["axis"], "train.optimizer.lr");
  EXPECT_EQ(t["tune"]["method"], "boundary");
  EXPECT_EQ(t["tune"]["mode"], "min");
  EXPECT_TRUE(t["tune"]["log_scale"].get<bool>());
  ASSERT_EQ(t["curves"].size(), 2u);
  const json& baseline = t["curves"][0];
  EXPECT_EQ(baseline["variant"], "baseline");
  EXPECT_EQ(baseline["axes"], "");
  ASSERT_EQ(baseline["points"].size(), 4u);
  // 0.03: both seeds, 2 + (log10(0.03) + 1.5)^2 / 4 + 0.005 on average.
  EXPECT_EQ(baseline["points"][1]["value"], 0.03);
  EXPECT_EQ(baseline["points"][1]["finished"], 2);
  EXPECT_NEAR(baseline["points"][1]["mean"].get<double>(),
              2 + std::pow(std::log10(0.03) + 1.5, 2) / 4 + 0.005, 1e-6);
  // 0.1: seed 0 finished, seed 1 diverged; 0.3: both diverged, no mean.
  EXPECT_EQ(baseline["points"][2]["finished"], 1);
  EXPECT_EQ(baseline["points"][2]["diverged"], 1);
  EXPECT_EQ(baseline["points"][3]["diverged"], 2);
  EXPECT_TRUE(baseline["points"][3]["mean"].is_null());
  EXPECT_EQ(baseline["bracket"]["state"], "DONE");
  EXPECT_EQ(baseline["bracket"]["stable"], 0.03);
  EXPECT_EQ(baseline["bracket"]["unstable"], 0.1);
  EXPECT_EQ(baseline["bracket"]["found"], "stable up to 0.03, unstable from 0.1");
  EXPECT_EQ(t["curves"][1]["bracket"]["stable"], 0.1);

  const json h = Get(port_, "/api/sweeps/halving/tune").Json();
  EXPECT_EQ(h["tune"]["method"], "asha");
  const json& g1 = h["curves"][1];
  EXPECT_EQ(g1["variant"], "g1_elementwise");
  EXPECT_TRUE(g1["bracket"].is_null());
  const json& stopped = g1["points"][2];
  EXPECT_EQ(stopped["finished"], 0);
  ASSERT_EQ(stopped["stopped"].size(), 2u);
  EXPECT_EQ(stopped["stopped"][0]["step"], 100);
  EXPECT_NEAR(stopped["stopped"][0]["metric"].get<double>(),
              3 + std::pow(std::log10(0.1) + 1.5, 2) / 4 - 0.05, 1e-6);

  EXPECT_TRUE(Get(port_, "/api/sweeps/gates/tune").Json()["tune"].is_null());
  EXPECT_EQ(Get(port_, "/api/sweeps/nope/tune").status, 404);
}

TEST_F(DashboardServerTest, BadInputIsAJsonError) {
  const std::pair<std::string, int> cases[] = {
      {"/api/runs/abc", 400},
      {"/api/runs/0", 400},
      {"/api/runs/-3", 400},
      {"/api/runs/99999999999999999999999999", 400},
      {"/api/runs/424242", 404},
      {"/api/runs/424242/metrics", 404},
      {"/api/runs/424242/spikes", 404},
      {"/api/runs/1/nope", 404},
      {"/api/sweeps/nope", 404},
      {"/api/sweeps/nope/curves", 404},
      {"/api/sweeps/nope/table", 404},
      {"/api/sweeps/nope/figures", 404},
      {"/api/sweeps/gates/figures?points=1", 400},
      {"/api/sweeps/gates/figures?points=x", 400},
      {"/api/sweeps/gates/curves?points=1", 400},
      {"/api/sweeps/gates/curves?points=abc", 400},
      {"/api/sweeps/gates/curves?points=-5", 400},
      {"/api/sweeps/gates/curves?points=123456789012345678901234567890", 400},
      {"/api/sweeps/gates/curves?metric=DROP%20TABLE", 400},
      {"/api/runs/1/metrics?from=10&to=5", 400},
      {"/api/runs/1/metrics?from=-1", 400},
      {"/api/runs/1/metrics?mode=avg", 400},
      {"/api/runs/1/metrics?to=1e9", 400},
      {"/api/runs/1/probes?step=x", 400},
      {"/api/runs/1/attention?step=x", 400},
      {"/api/runs/1/attention?step=1.5", 400},
      {"/api/runs/1/attention?step=99999999999999999999", 400},
      {"/api/runs/1/attention?step=7", 404},
      {"/api/runs/424242/attention", 404},
      {"/api/sweeps/gates/events?after=-1", 400},
      {"/api/sweeps/gates/events?limit=0", 400},
      {"/api/sweeps/%ZZ", 400},
      {"/api/sweeps/%", 400},
      {"/api/nope", 404},
      {"/api", 404},
      {"/api/stream", 400},
      {"/api/stream?sweep=nope", 404},
      // Bytes that are not UTF-8 in a name echoed by the error (JSON must stay valid).
      {"/api/sweeps/%FF%FE", 404},
      {"/api/sweeps/%C3", 404},
      {"/api/stream?sweep=%FF", 404},
      {"/no-such-page-%FF", 404},
  };
  for (const auto& [target, status] : cases) {
    HttpResult r = Get(port_, target);
    EXPECT_EQ(r.status, status) << target << ": " << r.body;
    json j = r.Json();
    ASSERT_FALSE(j.is_discarded()) << target << ": " << r.body;
    EXPECT_EQ(j["status"], status) << target;
    EXPECT_FALSE(j["error"].get<std::string>().empty()) << target;
  }
  EXPECT_EQ(Get(port_, "/api/sweeps", kToken, http::verb::post).status, 405);
  EXPECT_EQ(Get(port_, "/api/sweeps", kToken, http::verb::delete_).status, 405);
  // Malformed HTTP, an oversized header: 400, and the server carries on.
  EXPECT_TRUE(absl::StartsWith(Raw(port_, "NOT HTTP AT ALL\r\n\r\n"), "HTTP/1.1 400"));
  EXPECT_TRUE(absl::StartsWith(
      Raw(port_, absl::StrCat("GET / HTTP/1.1\r\nX: ", std::string(100000, 'a'), "\r\n\r\n")),
      "HTTP/1.1 400"));
  EXPECT_EQ(Get(port_, "/api/sweeps").status, 200);
}

// What `ablate serve` adds to /metrics from its store writer, the checkpointer's included.
TEST(StoreMetricsTest, TheWriterAndTheCheckpointer) {
  StoreStats stats;
  stats.flushes = 12;
  stats.checkpoints = 3;
  std::map<std::string, double> by_name;
  for (const DashboardMetric& m : StoreMetrics(stats)) by_name[m.name] = m.value;
  EXPECT_EQ(by_name["ablate_store_flushes_total"], 12);
  EXPECT_EQ(by_name["ablate_store_checkpoints_total"], 3);
  EXPECT_EQ(by_name["ablate_store_checkpoint_failing"], 0);
  stats.checkpoint_error = absl::UnavailableError("store: checkpoint: disk I/O error");
  for (const DashboardMetric& m : StoreMetrics(stats)) by_name[m.name] = m.value;
  EXPECT_EQ(by_name["ablate_store_checkpoint_failing"], 1);
}

TEST_F(DashboardServerTest, PrometheusMetrics) {
  HttpResult r = Get(port_, "/metrics");
  ASSERT_EQ(r.status, 200);
  EXPECT_TRUE(absl::StartsWith(r.content_type, "text/plain; version=0.0.4"));
  const std::string& text = r.body;
  EXPECT_TRUE(absl::StrContains(text, "# TYPE ablate_runs gauge\n"));
  EXPECT_TRUE(absl::StrContains(text, "ablate_runs{state=\"RUNNING\"} 1\n"));
  EXPECT_TRUE(absl::StrContains(text, "ablate_runs{state=\"DIVERGED\"} 1\n"));
  EXPECT_TRUE(absl::StrContains(text, "ablate_runs{state=\"CANCELLED\"} 0\n"));
  EXPECT_TRUE(absl::StrContains(text, "ablate_queue_depth 1\n"));
  EXPECT_TRUE(absl::StrContains(text, "ablate_workers{state=\"IDLE\"} 1\n"));
  EXPECT_TRUE(absl::StrContains(text, "ablate_steps_ingested_total 1800\n"));
  EXPECT_TRUE(absl::StrContains(text, "# TYPE ablate_points_ingested_per_second gauge\n"));
  EXPECT_TRUE(absl::StrContains(text, "ablate_store_queued_rows 7\n"));
  EXPECT_TRUE(absl::StrContains(text, "ablate_workers_connected{kind=\"cpu\"} 2\n"));
  // Every line is a comment or `name{labels} value` (the text exposition format).
  const std::regex sample(
      R"(^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="[^"]*"(,[a-zA-Z_][a-zA-Z0-9_]*="[^"]*")*\})? [-+0-9.eEInfNa]+$)");
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (absl::StartsWith(line, "# HELP ") || absl::StartsWith(line, "# TYPE ")) continue;
    EXPECT_TRUE(std::regex_match(std::string(line), sample)) << line;
  }
  // The ingestion rate: 400 more steps between two scrapes 0.6 s apart.
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  ASSERT_TRUE(store_->ReportMetrics(StepBatch(runs_[2], 1, 2, 501, 400)).ok());
  const std::string second = Get(port_, "/metrics").body;
  const size_t at = second.find("\nablate_points_ingested_per_second ");
  ASSERT_NE(at, std::string::npos);
  const double rate = std::stod(second.substr(at + 35));
  EXPECT_GT(rate, 100);
  EXPECT_LT(rate, 700);
}

TEST_F(DashboardServerTest, StreamDeliversPointsSpikesAndDivergenceWithinOneSecond) {
  StreamReader stream(port_, absl::StrCat("/api/stream?sweep=gates&token=", kToken));
  ASSERT_NE(stream.ReadUntil("text/event-stream", std::chrono::seconds(5)), std::string::npos)
      << stream.data();
  size_t pos = stream.ReadUntil("event: hello\n", std::chrono::seconds(5));
  ASSERT_NE(pos, std::string::npos) << stream.data();

  // A point written after the stream opened arrives within 1 s.
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(store_->ReportMetrics(StepBatch(runs_[2], 1, 2, 501, 1)).ok());
  pos = stream.ReadUntil("\"step\":[501]", std::chrono::seconds(1), pos);
  ASSERT_NE(pos, std::string::npos) << stream.data();
  const double latency_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(latency_ms, 1000);
  EXPECT_TRUE(absl::StrContains(stream.data(), "event: points\n"));
  EXPECT_TRUE(absl::StrContains(stream.data(), absl::StrCat("\"run\":", runs_[2])));

  // A spike, then the run diverges.
  MetricBatch b = StepBatch(runs_[2], 1, 3, 502, 1);
  SpikeEvent& spike = b.spikes.emplace_back();
  spike.set_step(502);
  spike.set_signal("loss");
  spike.set_value(40);
  spike.set_baseline(3);
  spike.set_kind(SPIKE_CATASTROPHIC);
  spike.set_action(SPIKE_ACTION_RECORDED);
  ASSERT_TRUE(store_->ReportMetrics(b).ok());
  pos = stream.ReadUntil("event: spike\n", std::chrono::seconds(1), pos);
  ASSERT_NE(pos, std::string::npos) << stream.data();
  EXPECT_NE(stream.ReadUntil("SPIKE_CATASTROPHIC", std::chrono::seconds(1), pos),
            std::string::npos);
  ASSERT_TRUE(FinishRun(store_.get(), runs_[2], DIVERGED, 502, "loss non-finite").ok());
  pos = stream.ReadUntil("event: run\n", std::chrono::seconds(1), pos);
  ASSERT_NE(pos, std::string::npos) << stream.data();
  EXPECT_NE(stream.ReadUntil("\"state\":\"DIVERGED\"", std::chrono::seconds(1), pos),
            std::string::npos);
  EXPECT_NE(stream.ReadUntil("event: sweep\n", std::chrono::seconds(1), pos), std::string::npos);

  // A run that starts after the stream opened streams from its first step.
  ASSERT_TRUE(StartRun(store_.get(), runs_[3]).ok());
  ASSERT_TRUE(store_->ReportMetrics(StepBatch(runs_[3], 1, 1, 1, 3)).ok());
  EXPECT_NE(stream.ReadUntil("\"step\":[1,2,3]", std::chrono::seconds(1), pos), std::string::npos)
      << stream.data();

  // Stop closes open streams promptly.
  t0 = std::chrono::steady_clock::now();
  server_->Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
}

TEST_F(DashboardServerTest, ManyConcurrentClients) {
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  absl::Mutex mu;
  std::vector<std::string> errors;
  for (int i = 0; i < 16; ++i) {
    threads.emplace_back([&] {
      for (int k = 0; k < 10; ++k) {
        try {
          ok += Get(port_, "/api/sweeps/gates").status == 200;
        } catch (const std::exception& e) {
          absl::MutexLock lock(&mu);
          errors.push_back(e.what());
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(ok.load(), 160);
  EXPECT_TRUE(errors.empty()) << errors.size() << " failed, e.g. " << errors[0];
}

TEST_F(DashboardServerTest, ConnectionsBeyondTheCapGet503) {
  DashboardOptions o;
  o.port = 0;
  o.token = kToken;
  o.reader = &store_->reader();
  o.max_connections = 2;
  absl::StatusOr<std::unique_ptr<DashboardServer>> server = DashboardServer::Start(o);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  asio::io_context io;
  tcp::socket a(io), b(io);  // two idle connections hold both slots
  a.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
  b.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const std::string third = Raw(port, "");
  EXPECT_TRUE(absl::StartsWith(third, "HTTP/1.1 503")) << third;
  EXPECT_TRUE(absl::StrContains(third, "too many connections")) << third;
  a.close();
  b.close();
  // The slots free up: a request is served again.
  bool served = false;
  for (int i = 0; i < 50 && !served; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    served = Get(port, "/api/sweeps").status == 200;
  }
  EXPECT_TRUE(served);
  // Stop does not wait for idle connections to time out.
  tcp::socket idle(io);
  idle.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
  const auto t0 = std::chrono::steady_clock::now();
  (*server)->Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
}

// ---- Limits: slow clients, greedy clients, streams ----------------------------------------

class DashboardLimitsTest : public DashboardServerTest {
 protected:
  // A second server over the fixture's store with `o`'s limits.
  std::unique_ptr<DashboardServer> StartWith(DashboardOptions o) {
    o.port = 0;
    o.token = kToken;
    o.reader = &store_->reader();
    o.poll_interval = absl::Milliseconds(50);
    absl::StatusOr<std::unique_ptr<DashboardServer>> server = DashboardServer::Start(o);
    EXPECT_TRUE(server.ok()) << server.status();
    return server.ok() ? *std::move(server) : nullptr;
  }
  // StartWith(o), kept as the test's second server until the test ends: its port, 0 when it did
  // not start.
  int Serve(DashboardOptions o) {
    limited_ = StartWith(std::move(o));
    return limited_ != nullptr ? limited_->port() : 0;
  }
  void TearDown() override {
    limited_.reset();  // before the fixture's store, which it reads
    DashboardServerTest::TearDown();
  }
  static std::unique_ptr<tcp::socket> Connect(asio::io_context& io, int port,
                                              const char* from = "127.0.0.1") {
    auto socket = std::make_unique<tcp::socket>(io);
    socket->open(tcp::v4());
    socket->bind(tcp::endpoint(asio::ip::make_address(from), 0));
    socket->connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
    return socket;
  }
  // A connection to `port` with a 4 KB receive buffer, for a client that reads nothing: the
  // server's writes to it block soon.
  static std::unique_ptr<tcp::socket> ConnectWithSmallBuffer(asio::io_context& io, int port) {
    auto socket = std::make_unique<tcp::socket>(io);
    socket->open(tcp::v4());
    socket->set_option(asio::socket_base::receive_buffer_size(4096));
    socket->connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
    return socket;
  }

  std::unique_ptr<DashboardServer> limited_;
};

// One curves answer holds at most max_curve_values points over all its runs: a sweep of many runs
// gets fewer per run, so one request cannot build gigabytes (10,000 runs x 5,000 points did).
TEST_F(DashboardLimitsTest, ACurvesAnswerIsCappedOverAllItsRuns) {
  DashboardOptions o;
  o.max_curve_values = 200;  // 4 runs: 50 points each
  const int port = Serve(o);
  const json j = Get(port, "/api/sweeps/gates/curves?points=5000").Json();
  EXPECT_EQ(j["points"], 50);
  EXPECT_EQ(j["stride"], 20);
  EXPECT_LE(j["runs"][0]["step"].size(), 52u);
  o.max_curve_values = 1;  // never fewer than 2 per run
  EXPECT_EQ(Get(Serve(o), "/api/sweeps/gates/curves").Json()["points"], 2);
}

// Served by a coordinator, /api/workers takes each worker's slots in use from it: a gang member
// holds its part's slots though the store records the run on rank 0's worker alone.
TEST_F(DashboardLimitsTest, WorkersShowTheCoordinatorsLiveSlotCounts) {
  DashboardOptions o;
  std::vector<int64_t> asked;
  o.live_slots_in_use = [&asked](int64_t worker_id) {
    asked.push_back(worker_id);
    return 2;
  };
  const int port = Serve(o);
  ASSERT_NE(port, 0);
  json workers = Get(port, "/api/workers").Json()["workers"];
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_EQ(workers[0]["slots_in_use"], 2);  // the store alone says 1 (TableEventsWorkers)
  EXPECT_EQ(workers[0]["running"], 1);
  EXPECT_EQ(asked, std::vector<int64_t>{workers[0]["id"].get<int64_t>()});
}

// A dashboard given no checkpoint root (over a results file alone) has no logs, and says why.
TEST_F(DashboardLimitsTest, NoCheckpointRootNoLogs) {
  const int port = Serve(DashboardOptions());
  ASSERT_NE(port, 0);
  HttpResult r = Get(port, absl::StrCat("/api/runs/", runs_[2], "/log"));
  EXPECT_EQ(r.status, 404) << r.body;
  EXPECT_TRUE(absl::StrContains(r.Json().value("error", ""), "without a checkpoint root"))
      << r.body;
}

// Slowloris: every connection slot held by a client that trickles a request's headers a byte at a
// time and never finishes. Each is dropped at the request deadline, so a fresh client is served
// again soon after, however long the flood goes on.
TEST_F(DashboardLimitsTest, SlowClientsAreDroppedAtTheRequestDeadline) {
  DashboardOptions o;
  o.max_connections = 8;
  o.max_connections_per_client = 8;
  o.request_timeout = absl::Seconds(1);
  const int port = Serve(o);
  ASSERT_NE(port, 0);
  asio::io_context io;
  std::vector<std::unique_ptr<tcp::socket>> flood;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 8; ++i) {
    flood.push_back(Connect(io, port));
    asio::write(*flood.back(), asio::buffer("G", 1));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // all accepted
  const std::string healthz = "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  const std::string busy = RawWithin(port, healthz, std::chrono::seconds(2));
  EXPECT_TRUE(absl::StartsWith(busy, "HTTP/1.1 503")) << busy;  // the flood holds every slot

  // The flood trickles on (one byte per connection every 100 ms, for 6 s at most) while a fresh
  // client asks /healthz until it is answered.
  std::atomic<bool> stop{false};
  std::thread trickle([&] {
    const std::string rest = "ET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + std::string(200, 'a');
    for (size_t i = 0; i < rest.size() && !stop &&
                       std::chrono::steady_clock::now() - t0 < std::chrono::seconds(6);
         ++i) {
      for (auto& socket : flood) {
        boost::system::error_code ec;
        asio::write(*socket, asio::buffer(&rest[i], 1), ec);  // fails once dropped: ignored
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  std::string answer;
  double served_after_s = -1;
  while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5)) {
    answer = RawWithin(port, healthz, std::chrono::seconds(2));
    if (absl::StartsWith(answer, "HTTP/1.1 200")) {
      served_after_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_GE(served_after_s, 0) << "no slot freed in 5 s with a 1 s request deadline: " << answer;
  std::cout << "/healthz answered 200 " << served_after_s
            << " s after a flood of 8 slow connections began (request deadline 1 s)\n";
  // Every flood connection was closed by the server (not one slot is still held).
  const auto closed_by = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  for (auto& socket : flood) {
    EXPECT_TRUE(ClosedByServerWithin(*socket,
                                     std::max(std::chrono::milliseconds(0),
                                              std::chrono::duration_cast<std::chrono::milliseconds>(
                                                  closed_by - std::chrono::steady_clock::now()))));
  }
  stop = true;
  trickle.join();
}

// A client that stops reading its responses (here: 300 pipelined requests for a 50 kB asset,
// unread) is dropped at the write deadline instead of holding its thread and slot forever.
TEST_F(DashboardLimitsTest, AClientThatStopsReadingIsDroppedAtTheWriteDeadline) {
  DashboardOptions o;
  o.max_connections = 1;
  o.write_timeout = absl::Seconds(1);
  const int port = Serve(o);
  ASSERT_NE(port, 0);
  asio::io_context io;
  std::unique_ptr<tcp::socket> stuck = ConnectWithSmallBuffer(io, port);
  std::string requests;
  for (int i = 0; i < 300; ++i) {
    absl::StrAppend(&requests, "GET /vendor/uPlot.iife.min.js HTTP/1.1\r\nHost: x\r\n\r\n");
  }
  asio::write(*stuck, asio::buffer(requests));
  const auto t0 = std::chrono::steady_clock::now();
  bool served = false;
  while (!served && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(8)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    served = absl::StartsWith(
        RawWithin(port, "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                  std::chrono::seconds(2)),
        "HTTP/1.1 200");
  }
  EXPECT_TRUE(served) << "the only slot is still held by a client that reads nothing";
}

// Heavy answers at once are capped, all clients together: one more waits heavy_wait, then gets
// 503, while light ones are served. A heavy answer holds its place until it is written, so a
// client that asks for many and reads none holds only that one. Before: no limit.
TEST_F(DashboardLimitsTest, HeavyAnswersAtOnceAreCapped) {
  DashboardOptions o;
  o.max_heavy_requests = 1;
  o.heavy_wait = absl::Milliseconds(200);
  o.write_timeout = absl::Seconds(3);
  const int port = Serve(o);
  ASSERT_NE(port, 0);
  const std::string metrics = absl::StrCat("/api/runs/", runs_[0], "/metrics");
  const std::string ask = absl::StrCat("GET ", metrics, " HTTP/1.1\r\nHost: x\r\n",
                                       "Authorization: Bearer ", kToken, "\r\n");
  ASSERT_GT(Get(port, metrics).body.size(), 20000u);
  // Pipelined, 200 answers of over 20 KB each, none read: the server blocks writing one.
  asio::io_context io;
  std::unique_ptr<tcp::socket> stuck = ConnectWithSmallBuffer(io, port);
  std::string requests;
  for (int i = 0; i < 200; ++i) absl::StrAppend(&requests, ask, "\r\n");
  std::thread writer([&] {
    boost::system::error_code ec;  // fails once the server drops the connection
    asio::write(*stuck, asio::buffer(requests), ec);
  });
  std::string refused;
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(8)) {
    refused = RawWithin(port, ask + "Connection: close\r\n\r\n", std::chrono::seconds(2));
    if (absl::StartsWith(refused, "HTTP/1.1 503")) break;
  }
  EXPECT_TRUE(absl::StartsWith(refused, "HTTP/1.1 503")) << refused.substr(0, 200);
  EXPECT_TRUE(absl::StrContains(refused, "busy: 1 curves, figures or tables are being answered"))
      << refused.substr(0, 400);
  // Light answers meanwhile.
  EXPECT_EQ(Get(port, "/api/sweeps/gates").status, 200);
  const std::string scrape = Get(port, "/metrics").body;
  EXPECT_TRUE(absl::StrContains(scrape, "ablate_dashboard_heavy_in_flight 1\n")) << scrape;
  EXPECT_FALSE(absl::StrContains(scrape, "ablate_dashboard_heavy_refused_total 0\n")) << scrape;
  // Once the server drops the client at the write deadline, heavy answers are served again.
  bool served = false;
  while (!served && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(15)) {
    served = Get(port, metrics).status == 200;
    if (!served) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_TRUE(served);
  boost::system::error_code ignored;
  stuck->close(ignored);
  writer.join();
}

TEST_F(DashboardLimitsTest, ConnectionsPerClientAddressAreCapped) {
  DashboardOptions o;
  o.max_connections_per_client = 2;
  const int port = Serve(o);
  ASSERT_NE(port, 0);
  asio::io_context io;
  std::unique_ptr<tcp::socket> a = Connect(io, port), b = Connect(io, port);  // idle, held
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const std::string third = RawWithin(port, "", std::chrono::seconds(3));
  EXPECT_TRUE(absl::StartsWith(third, "HTTP/1.1 503")) << third;
  EXPECT_TRUE(absl::StrContains(third,
                                "too many connections from 127.0.0.1 (the limit is 2 per "
                                "client)"))
      << third;
  // Another address is served meanwhile (127.0.0.2 is this machine too).
  std::unique_ptr<tcp::socket> other = Connect(io, port, "127.0.0.2");
  asio::write(
      *other,
      asio::buffer(std::string("GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")));
  std::string answer;
  boost::system::error_code ec;
  char buf[4096];
  while (!ec) {
    const size_t n = other->read_some(asio::buffer(buf), ec);
    answer.append(buf, n);
  }
  EXPECT_TRUE(absl::StartsWith(answer, "HTTP/1.1 200")) << answer;
  // A slot given back is taken again.
  a->close();
  bool served = false;
  for (int i = 0; i < 50 && !served; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    served = Get(port, "/api/sweeps").status == 200;
  }
  EXPECT_TRUE(served);
}

TEST_F(DashboardLimitsTest, EventStreamsBeyondTheCapGet503) {
  DashboardOptions o;
  o.max_streams = 2;
  const int port = Serve(o);
  ASSERT_NE(port, 0);
  const std::string target = absl::StrCat("/api/stream?sweep=gates&token=", kToken);
  auto first = std::make_unique<StreamReader>(port, target);
  StreamReader second(port, target);
  ASSERT_NE(first->ReadUntil("event: hello\n", std::chrono::seconds(5)), std::string::npos);
  ASSERT_NE(second.ReadUntil("event: hello\n", std::chrono::seconds(5)), std::string::npos);
  StreamReader third(port, target);
  EXPECT_NE(third.ReadUntil("\"status\":503}", std::chrono::seconds(5)), std::string::npos)
      << third.data();
  EXPECT_TRUE(absl::StartsWith(third.data(), "HTTP/1.1 503")) << third.data();
  EXPECT_TRUE(absl::StrContains(third.data(), "too many event streams (the limit is 2)"))
      << third.data();
  // Plain requests are not streams: served.
  EXPECT_EQ(Get(port, "/api/sweeps").status, 200);
  // A stream whose client left gives its slot back within a few polls, not at the next ping.
  first.reset();
  bool admitted = false;
  for (int i = 0; i < 40 && !admitted; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    StreamReader again(port, target);
    admitted = again.ReadUntil("event: hello\n", std::chrono::seconds(2)) != std::string::npos;
  }
  EXPECT_TRUE(admitted);
}

// ---- HTTPS ----------------------------------------------------------------------------------

TEST_F(DashboardServerTest, ServesHttpsWithTheGivenCertificate) {
  ASSERT_TRUE(ablate::testing::MakeSelfSignedCertificate(dir_, "dashboard")) << "openssl failed";
  DashboardOptions o;
  o.port = 0;
  o.token = kToken;
  o.reader = &store_->reader();
  o.poll_interval = absl::Milliseconds(50);
  o.tls_cert_file = dir_ + "/dashboard.pem";
  o.tls_key_file = dir_ + "/dashboard.key";
  absl::StatusOr<std::unique_ptr<DashboardServer>> started = DashboardServer::Start(o);
  ASSERT_TRUE(started.ok()) << started.status();
  DashboardServer& server = **started;
  const int port = server.port();
  EXPECT_EQ(server.Url(), absl::StrCat("https://127.0.0.1:", port, "/?token=", kToken));

  std::string error;
  HttpResult health = GetTls(port, "/healthz", o.tls_cert_file, &error, "");
  EXPECT_EQ(health.status, 200) << error;
  HttpResult sweeps = GetTls(port, "/api/sweeps", o.tls_cert_file, &error);
  EXPECT_EQ(sweeps.status, 200) << error;
  EXPECT_TRUE(absl::StrContains(sweeps.body, "\"gates\"")) << sweeps.body;
  EXPECT_EQ(GetTls(port, "/api/sweeps", o.tls_cert_file, &error, "").status, 401) << error;
  // A client that does not trust the certificate gets nothing.
  ASSERT_TRUE(ablate::testing::MakeSelfSignedCertificate(dir_, "other"));
  error.clear();
  EXPECT_EQ(GetTls(port, "/healthz", dir_ + "/other.pem", &error).status, 0);
  EXPECT_FALSE(error.empty());

  // Plain HTTP gets no data, only a 400 that says to use HTTPS.
  for (const std::string target : {"/healthz", "/api/sweeps", "/"}) {
    const std::string plain =
        RawWithin(port,
                  absl::StrCat("GET ", target, " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ",
                               kToken, "\r\n\r\n"),
                  std::chrono::seconds(5));
    EXPECT_FALSE(absl::StrContains(plain, "200 OK")) << plain;
    EXPECT_FALSE(absl::StrContains(plain, "gates")) << plain;
    EXPECT_TRUE(plain.empty() || absl::StrContains(plain, "serves HTTPS only")) << plain;
  }

  // The event stream over TLS.
  asio::io_context io;
  asio::ssl::context ctx(asio::ssl::context::tls_client);
  ctx.load_verify_file(o.tls_cert_file);
  ctx.set_verify_mode(asio::ssl::verify_peer);
  asio::ssl::stream<tcp::socket> stream(io, ctx);
  stream.next_layer().connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
  Watchdog watchdog(stream.next_layer().native_handle(), std::chrono::seconds(10));
  stream.handshake(asio::ssl::stream_base::client);
  asio::write(stream, asio::buffer(absl::StrCat("GET /api/stream?sweep=gates&token=", kToken,
                                                " HTTP/1.1\r\nHost: x\r\n\r\n")));
  std::string data;
  boost::system::error_code ec;
  while (!ec && !absl::StrContains(data, "event: hello\n")) {
    char buf[4096];
    const size_t n = stream.read_some(asio::buffer(buf), ec);
    data.append(buf, n);
  }
  EXPECT_TRUE(absl::StrContains(data, "event: hello\n")) << data << ec.message();

  // Stop closes TLS connections too.
  const auto t0 = std::chrono::steady_clock::now();
  server.Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
}

// `ablate tag` and `note` on the sweep page (the sweep's tags, every note, each run's own tags)
// and the run page (its own tags, its sweep's, its notes).
TEST_F(DashboardServerTest, SweepAndRunPagesCarryTagsAndNotes) {
  using Action = AnnotationEdit::Action;
  ASSERT_TRUE(store_->Annotate({1, 0, Action::kTag, {"phase1"}}).ok());
  ASSERT_TRUE(store_->Annotate({1, runs_[1], Action::kTag, {"bugged", "lr:3e-4"}}).ok());
  ASSERT_TRUE(store_->Annotate({1, runs_[1], Action::kNote, {"loader bug"}}).ok());
  ASSERT_TRUE(store_->Annotate({1, 0, Action::kNote, {"phase 1 of 2"}}).ok());
  json j = Get(port_, "/api/sweeps/gates").Json();
  EXPECT_EQ(j["sweep"]["tags"], json::array({"phase1"}));
  EXPECT_EQ(j["runs"][0]["tags"], json::array());
  EXPECT_EQ(j["runs"][1]["tags"], json::array({"bugged", "lr:3e-4"}));
  ASSERT_EQ(j["notes"].size(), 2u);
  EXPECT_EQ(j["notes"][0]["run_id"], runs_[1]);
  EXPECT_EQ(j["notes"][0]["text"], "loader bug");
  EXPECT_GT(j["notes"][0]["created_at"].get<double>(), 0);
  EXPECT_EQ(j["notes"][1]["run_id"], 0);

  json run = Get(port_, absl::StrCat("/api/runs/", runs_[1])).Json()["run"];
  EXPECT_EQ(run["tags"], json::array({"bugged", "lr:3e-4"}));
  EXPECT_EQ(run["sweep_tags"], json::array({"phase1"}));
  ASSERT_EQ(run["notes"].size(), 1u);
  EXPECT_EQ(run["notes"][0]["text"], "loader bug");
  json other = Get(port_, absl::StrCat("/api/runs/", runs_[0])).Json()["run"];
  EXPECT_EQ(other["tags"], json::array());
  EXPECT_EQ(other["sweep_tags"], json::array({"phase1"}));
  EXPECT_EQ(other["notes"], json::array());
}

}  // namespace
}  // namespace ablate
