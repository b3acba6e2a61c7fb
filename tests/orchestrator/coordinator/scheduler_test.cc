#include "orchestrator/coordinator/scheduler.h"

#include <chrono>
#include <cstdio>
#include <map>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace ablate {
namespace {

// Time stands still until the test advances it.
class FakeClock : public Clock {
 public:
  absl::Time Now() const override { return now_; }
  void Advance(absl::Duration d) { now_ += d; }

 private:
  absl::Time now_ = absl::FromUnixSeconds(1'700'000'000);
};

QueuedRun MakeRun(int64_t id, int64_t sweep, int index, const std::string& device = "cpu",
              double memory_gb = 0) {
  QueuedRun r;
  r.run_id = id;
  r.sweep_id = sweep;
  r.run_index = index;
  r.needs.device = device;
  r.needs.memory_gb = memory_gb;
  return r;
}

WorkerOffer Cpu(double memory_gb = 16, int slots = 1) {
  WorkerOffer o;
  o.device = "cpu";
  o.memory_gb = memory_gb;
  o.cores = 8;
  o.slots = slots;
  return o;
}

// A worker with more slots than any test leases: ordering tests need no releases.
WorkerOffer Roomy() { return Cpu(16, 1 << 20); }

class SchedulerTest : public ::testing::Test {
 protected:
  SchedulerOptions Options() {
    SchedulerOptions o;
    o.lease_timeout = absl::Seconds(30);
    o.retry_base = absl::Seconds(5);
    o.retry_cap = absl::Seconds(60);
    o.max_attempts = 3;
    return o;
  }
  FakeClock clock_;
};

TEST_F(SchedulerTest, RunOrderInsideASweep) {
  Scheduler s(Options(), &clock_);
  s.AddSweep(1, 1);
  for (int i : {3, 0, 2, 1}) ASSERT_TRUE(s.Enqueue(MakeRun(100 + i, 1, i)));
  for (int i = 0; i < 4; ++i) {
    auto r = s.Acquire(7, Roomy());
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->run_index, i);
  }
  EXPECT_FALSE(s.Acquire(7, Roomy()).has_value());
  EXPECT_EQ(s.leased(), 4u);
}

TEST_F(SchedulerTest, FairShareFollowsPriority) {
  Scheduler s(Options(), &clock_);
  s.AddSweep(1, 1);
  s.AddSweep(2, 3);
  s.AddSweep(3, 2);
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE(s.Enqueue(MakeRun(10000 + i, 1, i)));
    ASSERT_TRUE(s.Enqueue(MakeRun(20000 + i, 2, i)));
    ASSERT_TRUE(s.Enqueue(MakeRun(30000 + i, 3, i)));
  }
  std::map<int64_t, int> served;
  for (int i = 0; i < 600; ++i) {
    auto r = s.Acquire(1, Roomy());
    ASSERT_TRUE(r.has_value());
    ++served[r->sweep_id];
  }
  // Priorities 1 : 3 : 2 of 600 dispatches.
  EXPECT_NEAR(served[1], 100, 2);
  EXPECT_NEAR(served[2], 300, 2);
  EXPECT_NEAR(served[3], 200, 2);
}

TEST_F(SchedulerTest, IdleSweepBanksNoCredit) {
  Scheduler s(Options(), &clock_);
  s.AddSweep(1, 1);
  s.AddSweep(2, 1);
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(s.Enqueue(MakeRun(1000 + i, 1, i)));
  for (int i = 0; i < 50; ++i) ASSERT_EQ(s.Acquire(1, Roomy())->sweep_id, 1);
  // Sweep 2 arrives late: it shares from now on instead of taking 50 dispatches in a row.
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(s.Enqueue(MakeRun(2000 + i, 2, i)));
  std::map<int64_t, int> served;
  for (int i = 0; i < 20; ++i) ++served[s.Acquire(1, Roomy())->sweep_id];
  EXPECT_NEAR(served[1], 10, 1);
  EXPECT_NEAR(served[2], 10, 1);
}

TEST_F(SchedulerTest, ResourceFit) {
  Scheduler s(Options(), &clock_);
  s.AddSweep(1, 1);
  ASSERT_TRUE(s.Enqueue(MakeRun(1, 1, 0, "cuda", 40)));
  ASSERT_TRUE(s.Enqueue(MakeRun(2, 1, 1, "cpu", 64)));
  ASSERT_TRUE(s.Enqueue(MakeRun(3, 1, 2, "cpu", 0)));

  WorkerOffer gpu_small;
  gpu_small.device = "cuda:0";
  gpu_small.memory_gb = 24;
  EXPECT_FALSE(s.Acquire(1, gpu_small).has_value());  // too little device memory

  auto r = s.Acquire(2, Cpu(16));  // skips run 2 (64 GB): takes run 3
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->run_id, 3);

  WorkerOffer gpu_big;
  gpu_big.device = "cuda:1";
  gpu_big.memory_gb = 80;
  r = s.Acquire(3, gpu_big);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->run_id, 1);
  EXPECT_FALSE(s.Acquire(3, gpu_big).has_value());  // cpu runs never go to a GPU worker

  r = s.Acquire(4, Cpu(128));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->run_id, 2);

  EXPECT_TRUE(Fits(RunNeeds{"cuda", 0, 0}, WorkerOffer{"cuda:3", 0, 0}));
  EXPECT_FALSE(Fits(RunNeeds{"cpu", 0, 4}, WorkerOffer{"cpu", 8, 2}));
  // A data-parallel run needs as many slots as devices; 0 is read as 1 on both sides.
  EXPECT_FALSE(Fits(RunNeeds{"cuda", 0, 0, 4}, WorkerOffer{"cuda:0", 0, 0, 2}));
  EXPECT_TRUE(Fits(RunNeeds{"cuda", 0, 0, 2}, WorkerOffer{"cuda:0", 0, 0, 2}));
  EXPECT_TRUE(Fits(RunNeeds{"cpu", 0, 0, 0}, WorkerOffer{"cpu", 0, 0, 0}));
  EXPECT_FALSE(Fits(RunNeeds{"cpu", 0, 0, 2}, WorkerOffer{"cpu", 0, 0, 0}));
  EXPECT_EQ(DeviceKind("cuda:7"), "cuda");
  EXPECT_EQ(DeviceKind(""), "cpu");
}

// Every configuration of builds: a run goes only to a worker of its sweep's code version, a
// gang only forms from such workers, and a worker the queued runs pass by for its build learns
// which build they need.
TEST_F(SchedulerTest, ARunGoesOnlyToAWorkerOfItsCodeVersion) {
  Scheduler s(Options(), &clock_);
  auto built = [](const std::string& code_version, int slots = 1) {
    WorkerOffer o = Cpu(16, slots);
    o.code_version = code_version;
    return o;
  };
  auto keyed = [](QueuedRun r, const std::string& code_version, int devices = 1) {
    r.needs.code_version = code_version;
    r.needs.devices = devices;
    return r;
  };
  s.AddWorker(1, built("A"));
  s.AddWorker(2, built("B"));
  s.AddSweep(1, 1);
  s.AddSweep(2, 1);
  ASSERT_TRUE(s.Enqueue(keyed(MakeRun(10, 1, 0), "A", /*devices=*/2)));  // a gang of A only
  ASSERT_TRUE(s.Enqueue(keyed(MakeRun(11, 1, 1), "A")));
  ASSERT_TRUE(s.Enqueue(keyed(MakeRun(20, 2, 0), "C")));

  EXPECT_FALSE(Fits(keyed(MakeRun(1, 1, 0), "A").needs, built("B")));
  EXPECT_TRUE(Fits(keyed(MakeRun(1, 1, 0), "A").needs, built("A")));
  // B fits nothing: the first queued run it would fit but for its build (sweep 1's) needs A.
  EXPECT_EQ(s.OtherBuildNeeded(built("B")), "A");
  EXPECT_FALSE(s.Acquire(2, built("B")).has_value());
  EXPECT_EQ(s.SlotsReserved(2), 0);
  // A: the 2-device run cannot gang with B's slot, so A takes the narrow run of its build.
  EXPECT_EQ(s.OtherBuildNeeded(built("A")), "");
  std::optional<QueuedRun> r = s.Acquire(1, built("A"));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->run_id, 11);
  EXPECT_EQ(s.SlotsReserved(1), 0);
  EXPECT_FALSE(s.Acquire(2, built("B")).has_value());
  // A worker that fits no queued run whatever its build is not waiting for a build.
  WorkerOffer gpu = built("B");
  gpu.device = "cuda:0";
  EXPECT_EQ(s.OtherBuildNeeded(gpu), "");
  // C takes its own sweep's run; with only A's wide run left, B is still told it needs A.
  r = s.Acquire(3, built("C"));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->run_id, 20);
  EXPECT_EQ(s.OtherBuildNeeded(built("B")), "A");
  EXPECT_EQ(s.OtherBuildNeeded(built("C")), "A");
}

TEST_F(SchedulerTest, LeaseRenewedByReportsAndLostWithout) {
  Scheduler s(Options(), &clock_);
  s.AddSweep(1, 1);
  ASSERT_TRUE(s.Enqueue(MakeRun(5, 1, 0)));
  ASSERT_TRUE(s.Acquire(9, Cpu()).has_value());
  s.SetLeaseAttempt(5, 1);
  EXPECT_EQ(s.NextDeadline(), clock_.Now() + absl::Seconds(30));

  for (int i = 0; i < 5; ++i) {
    clock_.Advance(absl::Seconds(20));
    EXPECT_TRUE(s.Renew(5, 1, 9));
    EXPECT_TRUE(s.ExpireLeases().empty());
  }
  EXPECT_FALSE(s.Renew(5, 2, 9));   // another attempt
  EXPECT_FALSE(s.Renew(5, 1, 10));  // another worker

  clock_.Advance(absl::Seconds(31));
  std::vector<Lease> lost = s.ExpireLeases();
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].run_id, 5);
  EXPECT_EQ(lost[0].attempt, 1);
  EXPECT_FALSE(s.Renew(5, 1, 9));  // the worker's late report is refused
  EXPECT_FALSE(s.GetLease(5).has_value());
}

// Leases are measured on the monotonic clock (common/clock.h): the coordinator's MonotonicClock
// reads the wall clock once and then only its monotonic source, so a wall clock stepped an hour
// forward or back changes no lease. Here the wall anchor is absurd and the monotonic source is the
// test's: only the latter moves the leases.
TEST_F(SchedulerTest, LeasesFollowTheMonotonicClockNotTheWallClock) {
  absl::Duration monotonic = absl::Hours(5);
  const MonotonicClock clock(absl::FromUnixSeconds(0), [&monotonic] { return monotonic; });
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(0));
  Scheduler s(Options(), &clock);
  s.AddSweep(1, 1);
  ASSERT_TRUE(s.Enqueue(MakeRun(5, 1, 0)));
  ASSERT_TRUE(s.Acquire(9, Cpu()).has_value());
  s.SetLeaseAttempt(5, 1);
  monotonic += absl::Seconds(29);
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(29));
  EXPECT_TRUE(s.ExpireLeases().empty());
  monotonic += absl::Seconds(2);
  EXPECT_EQ(s.ExpireLeases().size(), 1u);
  // The process's own: readings never go back, and advance with steady_clock.
  const absl::Time a = MonotonicNow();
  const auto steady = std::chrono::steady_clock::now();
  absl::SleepFor(absl::Milliseconds(20));
  const absl::Duration elapsed = MonotonicNow() - a;
  EXPECT_GE(elapsed, absl::FromChrono(std::chrono::steady_clock::now() - steady) - absl::Milliseconds(1));
  EXPECT_GE(elapsed, absl::Milliseconds(20));
}

TEST_F(SchedulerTest, LostRunRequeuedWithCappedExponentialBackoff) {
  Scheduler s(Options(), &clock_);
  s.AddSweep(1, 1);
  ASSERT_TRUE(s.Enqueue(MakeRun(5, 1, 0)));
  // attempts 1, 2: backoff 5 s, 10 s; attempt 3 = max_attempts: FAILED.
  for (int attempt = 1; attempt <= 3; ++attempt) {
    auto r = s.Acquire(9, Cpu());
    ASSERT_TRUE(r.has_value()) << attempt;
    s.SetLeaseAttempt(5, attempt);
    clock_.Advance(absl::Seconds(31));
    ASSERT_EQ(s.ExpireLeases().size(), 1u);
    RetryDecision d = s.RetryAfterLoss(attempt);
    if (attempt == 3) {
      EXPECT_FALSE(d.retry);
      break;
    }
    ASSERT_TRUE(d.retry);
    const absl::Duration backoff = absl::Seconds(5) * (1 << (attempt - 1));
    EXPECT_EQ(d.not_before, clock_.Now() + backoff);
    QueuedRun again = *s.LeasedRun(5);
    again.not_before = d.not_before;
    ASSERT_TRUE(s.Enqueue(again));
    EXPECT_FALSE(s.Acquire(9, Cpu()).has_value()) << "dispatched during its backoff";
    EXPECT_EQ(s.NextDeadline(), d.not_before);
    clock_.Advance(backoff);
  }
  // The cap.
  SchedulerOptions o = Options();
  o.max_attempts = 100;
  Scheduler capped(o, &clock_);
  EXPECT_EQ(capped.RetryAfterLoss(30).not_before, clock_.Now() + absl::Seconds(60));
  EXPECT_EQ(capped.RetryAfterLoss(4).not_before, clock_.Now() + absl::Seconds(40));
}

TEST_F(SchedulerTest, CancelDropsQueuedAndStopsRunning) {
  Scheduler s(Options(), &clock_);
  s.AddSweep(1, 1);
  s.AddSweep(2, 1);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(s.Enqueue(MakeRun(10 + i, 1, i)));
  ASSERT_TRUE(s.Enqueue(MakeRun(20, 2, 0)));
  auto running = s.Acquire(1, Roomy());
  ASSERT_TRUE(running.has_value());
  ASSERT_EQ(running->sweep_id, 1);
  std::vector<int64_t> dropped = s.CancelSweep(1);
  EXPECT_EQ(dropped.size(), 3u);
  EXPECT_TRUE(s.GetLease(running->run_id)->stop);
  EXPECT_FALSE(s.Enqueue(MakeRun(99, 1, 9)));  // nothing of a cancelled sweep is queued
  auto next = s.Acquire(1, Roomy());
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->run_id, 20);
  EXPECT_FALSE(s.Acquire(1, Roomy()).has_value());
  s.UncancelSweep(1);
  EXPECT_TRUE(s.Enqueue(MakeRun(dropped[0], 1, 1)));
}

TEST_F(SchedulerTest, NoDoubleQueueOrLease) {
  Scheduler s(Options(), &clock_);
  s.AddSweep(1, 1);
  ASSERT_TRUE(s.Enqueue(MakeRun(1, 1, 0)));
  EXPECT_FALSE(s.Enqueue(MakeRun(1, 1, 0)));
  ASSERT_TRUE(s.Acquire(1, Cpu()).has_value());
  EXPECT_FALSE(s.Enqueue(MakeRun(1, 1, 0)));  // leased
  EXPECT_FALSE(s.Acquire(2, Cpu()).has_value());
  ASSERT_TRUE(s.Release(1).has_value());
  EXPECT_FALSE(s.Release(1).has_value());
}

TEST_F(SchedulerTest, RestoredLeaseKeepsAReportingWorkerAndLosesASilentOne) {
  Scheduler s(Options(), &clock_);
  s.AddSweep(1, 1);
  s.RestoreLease(1, 1, /*worker_id=*/4, /*attempt=*/2, MakeRun(1, 1, 0));
  s.RestoreLease(2, 1, /*worker_id=*/5, /*attempt=*/1, MakeRun(2, 1, 1));
  clock_.Advance(absl::Seconds(20));
  EXPECT_TRUE(s.Renew(1, 2, 4));
  clock_.Advance(absl::Seconds(20));
  std::vector<Lease> lost = s.ExpireLeases();
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].run_id, 2);
  EXPECT_TRUE(s.GetLease(1).has_value());
}

// 10,000 queued runs over 20 sweeps and 3 resource shapes all reach a worker that fits, and all
// their leases expire. The time is printed, not asserted: bench_scheduler measures dispatch.
TEST_F(SchedulerTest, TenThousandQueuedRunsAllDispatchAndExpire) {
  Scheduler s(Options(), &clock_);
  const int kSweeps = 20, kRuns = 10000;
  for (int w = 1; w <= kSweeps; ++w) s.AddSweep(w, 1 + w % 3);
  const std::string devices[] = {"cpu", "cuda", "cpu"};
  const double memory[] = {0, 40, 32};
  for (int i = 0; i < kRuns; ++i) {
    ASSERT_TRUE(s.Enqueue(MakeRun(i + 1, 1 + i % kSweeps, i, devices[i % 3], memory[i % 3])));
  }
  WorkerOffer gpu{"cuda:0", 80, 16, 1 << 20};
  const auto start = std::chrono::steady_clock::now();
  int dispatched = 0;
  for (int round = 0; dispatched < kRuns; ++round) {
    auto r = s.Acquire(1 + round % 2, round % 2 ? gpu : Cpu(64, 1 << 20));
    if (!r.has_value()) {
      r = s.Acquire(3, round % 2 ? Cpu(64, 1 << 20) : gpu);
      ASSERT_TRUE(r.has_value()) << dispatched;
    }
    ++dispatched;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("scheduler: %d dispatches from 10,000 queued in %.1f ms (%.0f per second)\n",
              dispatched, seconds * 1e3, dispatched / seconds);
  EXPECT_EQ(s.queued(), 0u);
  EXPECT_EQ(s.leased(), static_cast<size_t>(kRuns));
  clock_.Advance(absl::Minutes(5));
  EXPECT_EQ(s.ExpireLeases().size(), static_cast<size_t>(kRuns));
  EXPECT_EQ(s.leased(), 0u);
}

QueuedRun Wide(int64_t id, int64_t sweep, int index, int devices) {
  QueuedRun r = MakeRun(id, sweep, index);
  r.needs.devices = devices;
  return r;
}

TEST_F(SchedulerTest, AWorkerHoldsOneSingleDeviceRunPerSlot) {
  Scheduler s(Options(), &clock_);
  s.AddSweep(1, 1);
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(s.Enqueue(MakeRun(10 + i, 1, i)));
  std::vector<QueuedRun> runs = s.AcquireUpTo(7, Cpu(16, 4), 8);
  ASSERT_EQ(runs.size(), 4u);
  EXPECT_EQ(s.SlotsInUse(7), 4);
  EXPECT_FALSE(s.Acquire(7, Cpu(16, 4)).has_value());
  EXPECT_TRUE(s.Acquire(8, Cpu(16, 1)).has_value());  // another worker's slots are its own
  ASSERT_TRUE(s.Release(runs[1].run_id).has_value());
  EXPECT_EQ(s.SlotsInUse(7), 3);
  ASSERT_TRUE(s.Acquire(7, Cpu(16, 4)).has_value());
  EXPECT_EQ(s.SlotsInUse(7), 4);
  // An expired lease frees its slot too.
  clock_.Advance(absl::Minutes(5));
  EXPECT_EQ(s.ExpireLeases().size(), 5u);
  EXPECT_EQ(s.SlotsInUse(7), 0);
}

TEST_F(SchedulerTest, AWideRunIsNotPassedOverByNarrowOnes) {
  Scheduler s(Options(), &clock_);
  s.AddSweep(1, 1);
  ASSERT_TRUE(s.Enqueue(MakeRun(10, 1, 0)));
  ASSERT_TRUE(s.Enqueue(Wide(11, 1, 1, 2)));
  for (int i = 2; i < 6; ++i) ASSERT_TRUE(s.Enqueue(MakeRun(10 + i, 1, i)));
  const WorkerOffer two = Cpu(16, 2);
  std::optional<QueuedRun> narrow = s.Acquire(7, two);
  ASSERT_TRUE(narrow.has_value());
  EXPECT_EQ(narrow->run_id, 10);
  // The wide run is next and needs both slots: the free one waits for it.
  EXPECT_FALSE(s.Acquire(7, two).has_value());
  // A one-slot worker can never take the wide run: it gets the narrow ones behind it.
  std::optional<QueuedRun> other = s.Acquire(8, Cpu(16, 1));
  ASSERT_TRUE(other.has_value());
  EXPECT_EQ(other->run_id, 12);
  // A Finish picks the next run counting the slot it frees.
  std::optional<QueuedRun> wide = s.Acquire(7, two, /*freeing=*/1);
  ASSERT_TRUE(wide.has_value());
  EXPECT_EQ(wide->run_id, 11);
  ASSERT_TRUE(s.Release(10).has_value());
  EXPECT_EQ(s.SlotsInUse(7), 2);
  EXPECT_EQ(s.GetLease(11)->slots, 2);
  EXPECT_FALSE(s.Acquire(7, two).has_value());
  ASSERT_TRUE(s.Release(11).has_value());
  EXPECT_EQ(s.AcquireUpTo(7, two, 4).size(), 2u);
}

// Two one-slot workers known to the scheduler, a run of 2 devices and narrow runs behind it.
class GangTest : public SchedulerTest {
 protected:
  void SetUp() override {
    s_.AddWorker(1, Cpu());
    s_.AddWorker(2, Cpu());
    s_.AddSweep(1, 1);
    ASSERT_TRUE(s_.Enqueue(Wide(11, 1, 0, 2)));
    ASSERT_TRUE(s_.Enqueue(MakeRun(12, 1, 1)));
    ASSERT_TRUE(s_.Enqueue(MakeRun(13, 1, 2)));
  }
  // Worker 1 reserves, worker 2 completes the gang (rank 0's), the attempt starts.
  void Form() {
    ASSERT_FALSE(s_.Acquire(1, Cpu()).has_value());
    std::optional<QueuedRun> primary = s_.Acquire(2, Cpu());
    ASSERT_TRUE(primary.has_value());
    ASSERT_EQ(primary->run_id, 11);
    s_.SetLeaseAttempt(11, 1);
  }
  Scheduler s_{Options(), &clock_};
};

TEST_F(GangTest, ARunWiderThanEveryWorkerIsLeasedToSeveralAtOnce) {
  // Worker 1's slot waits for the gang: it takes none of the narrow runs behind it.
  EXPECT_FALSE(s_.Acquire(1, Cpu()).has_value());
  EXPECT_EQ(s_.SlotsInUse(1), 1);
  EXPECT_EQ(s_.SlotsReserved(1), 1);
  EXPECT_FALSE(s_.Acquire(1, Cpu()).has_value());
  std::optional<QueuedRun> primary = s_.Acquire(2, Cpu());
  ASSERT_TRUE(primary.has_value());
  EXPECT_EQ(primary->run_id, 11);
  const Lease lease = *s_.GetLease(11);
  EXPECT_EQ(lease.worker_id, 2);  // the worker that completed it holds rank 0
  ASSERT_EQ(lease.members.size(), 2u);
  EXPECT_EQ(lease.members[0].worker_id, 2);
  EXPECT_EQ(lease.members[0].rank_offset, 0);
  EXPECT_EQ(lease.members[1].worker_id, 1);
  EXPECT_EQ(lease.members[1].rank_offset, 1);
  EXPECT_EQ(lease.members[1].slots, 1);
  EXPECT_EQ(s_.SlotsReserved(1), 0);
  EXPECT_EQ(s_.SlotsInUse(1), 1);
  EXPECT_EQ(s_.SlotsInUse(2), 1);
  // Worker 1 gets its part once the attempt started, once, and nothing else meanwhile.
  EXPECT_TRUE(s_.TakeParts(1).empty());
  EXPECT_FALSE(s_.Acquire(1, Cpu()).has_value());
  s_.SetLeaseAttempt(11, 1);
  EXPECT_FALSE(s_.Acquire(1, Cpu()).has_value());  // Acquire never hands a part out as a run
  std::vector<GangPart> parts = s_.TakeParts(1);
  ASSERT_EQ(parts.size(), 1u);
  EXPECT_EQ(parts[0].run.run_id, 11);
  EXPECT_EQ(parts[0].attempt, 1);
  EXPECT_TRUE(s_.TakeParts(1).empty());
  EXPECT_TRUE(s_.TakeParts(2).empty());  // rank 0's worker started it: no part to take
  EXPECT_TRUE(s_.Renew(11, 1, 1));
  EXPECT_TRUE(s_.Renew(11, 1, 2));
  EXPECT_FALSE(s_.Renew(11, 1, 3));
  // Worker 1's part ends first: its slot is free for the narrow runs; rank 0's ends the lease.
  EXPECT_FALSE(s_.ReleaseMember(11, 1, 2));  // rank 0's worker ends the run, not its part
  EXPECT_TRUE(s_.ReleaseMember(11, 1, 1));
  EXPECT_FALSE(s_.Renew(11, 1, 1));
  EXPECT_EQ(s_.SlotsInUse(1), 0);
  std::optional<QueuedRun> narrow = s_.Acquire(1, Cpu());
  ASSERT_TRUE(narrow.has_value());
  EXPECT_EQ(narrow->run_id, 12);
  ASSERT_TRUE(s_.Release(11).has_value());
  EXPECT_EQ(s_.SlotsInUse(2), 0);
  EXPECT_EQ(s_.SlotsInUse(1), 1);
}

TEST_F(GangTest, ASilentMemberLosesTheWholeAttemptAndFreesTheOthers) {
  Form();
  ASSERT_EQ(s_.TakeParts(1).size(), 1u);
  clock_.Advance(absl::Seconds(20));
  ASSERT_TRUE(s_.Renew(11, 1, 2));  // rank 0's worker reports; worker 1 is silent
  clock_.Advance(absl::Seconds(15));
  std::vector<Lease> expired = s_.ExpireLeases();
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].run_id, 11);
  EXPECT_EQ(expired[0].expiry, expired[0].MemberOf(1)->expiry);  // worker 1's part expired
  EXPECT_EQ(s_.SlotsInUse(1), 0);
  EXPECT_EQ(s_.SlotsInUse(2), 0);
  // The coordinator could not end the attempt (its store was unavailable): the lease comes back
  // whole, every member's part and slot with it.
  s_.Reinstate(expired[0]);
  ASSERT_TRUE(s_.GetLease(11).has_value());
  EXPECT_EQ(s_.GetLease(11)->members.size(), 2u);
  EXPECT_EQ(s_.SlotsInUse(1), 1);
  EXPECT_EQ(s_.SlotsInUse(2), 1);
  EXPECT_TRUE(s_.Renew(11, 1, 1));
}

TEST_F(GangTest, ASilentReservationIsGivenBack) {
  EXPECT_FALSE(s_.Acquire(1, Cpu()).has_value());
  EXPECT_EQ(s_.SlotsReserved(1), 1);
  clock_.Advance(absl::Seconds(31));  // worker 1 stopped polling
  std::optional<QueuedRun> got = s_.Acquire(2, Cpu());
  EXPECT_FALSE(got.has_value());  // worker 2 now waits for the gang alone
  EXPECT_EQ(s_.SlotsReserved(1), 0);
  EXPECT_EQ(s_.SlotsReserved(2), 1);
  // Worker 1 polls again: the gang completes with it as rank 0's worker.
  std::optional<QueuedRun> primary = s_.Acquire(1, Cpu());
  ASSERT_TRUE(primary.has_value());
  EXPECT_EQ(s_.GetLease(11)->worker_id, 1);
}

TEST_F(GangTest, AGangThatCanNoLongerCompleteDissolves) {
  EXPECT_FALSE(s_.Acquire(1, Cpu()).has_value());
  s_.RemoveWorker(2);  // gone: one slot is left for a run of two
  std::optional<QueuedRun> narrow = s_.Acquire(1, Cpu());
  ASSERT_TRUE(narrow.has_value());
  EXPECT_EQ(narrow->run_id, 12);
  EXPECT_EQ(s_.SlotsReserved(1), 0);
}

TEST_F(GangTest, AWorkerWideEnoughTakesTheRunWholeInstead) {
  s_.AddWorker(3, Cpu(16, 2));
  // With worker 3 known the run is not a gang's: one-slot workers go on with narrow runs.
  std::optional<QueuedRun> narrow = s_.Acquire(1, Cpu());
  ASSERT_TRUE(narrow.has_value());
  EXPECT_EQ(narrow->run_id, 12);
  std::optional<QueuedRun> whole = s_.Acquire(3, Cpu(16, 2));
  ASSERT_TRUE(whole.has_value());
  EXPECT_EQ(whole->run_id, 11);
  EXPECT_TRUE(s_.GetLease(11)->members.empty());
}

TEST_F(SchedulerTest, AProgramRunWiderThanEveryWorkerWaitsForOneWideEnough) {
  // A program's ranks are started by one worker: never a gang's, whatever waits behind it.
  Scheduler s(Options(), &clock_);
  s.AddWorker(1, Cpu());
  s.AddWorker(2, Cpu());
  s.AddSweep(1, 1);
  QueuedRun program = Wide(11, 1, 0, 2);
  program.needs.code_version = "program+0123456789abcdef";
  ASSERT_TRUE(s.Enqueue(program));
  ASSERT_TRUE(s.Enqueue(MakeRun(12, 1, 1)));
  std::optional<QueuedRun> narrow = s.Acquire(1, Cpu());
  ASSERT_TRUE(narrow.has_value());
  EXPECT_EQ(narrow->run_id, 12);  // the program run forms no gang and holds no slot
  EXPECT_EQ(s.SlotsReserved(1), 0);
  EXPECT_FALSE(s.Acquire(2, Cpu()).has_value());
  EXPECT_EQ(s.SlotsReserved(2), 0);
  s.AddWorker(3, Cpu(16, 2));
  std::optional<QueuedRun> whole = s.Acquire(3, Cpu(16, 2));
  ASSERT_TRUE(whole.has_value());
  EXPECT_EQ(whole->run_id, 11);
  EXPECT_TRUE(s.GetLease(11)->members.empty());
}

TEST_F(GangTest, ACancelledRunDissolvesItsFormingGang) {
  EXPECT_FALSE(s_.Acquire(1, Cpu()).has_value());
  EXPECT_EQ(s_.CancelSweep(1).size(), 3u);
  EXPECT_EQ(s_.SlotsReserved(1), 0);
  EXPECT_FALSE(s_.Acquire(2, Cpu()).has_value());
  EXPECT_EQ(s_.SlotsInUse(2), 0);
}

// Two gangs of 6 devices on 2-slot workers; each fits 3 of the 4 workers, two of them both.
// Worker 1 starts A, worker 3 B, worker 2 joins B (the lower run id), worker 4 A: each gang has
// 4 of 6 and needs a worker the other holds. Worker 1 moves to B, the lowest run id it fits,
// and B completes; A keeps worker 4 and waits.
TEST_F(SchedulerTest, TwoFormingGangsNeverHoldEachOthersWorkers) {
  Scheduler s(Options(), &clock_);
  WorkerOffer both = Cpu(64, 2), b_only = Cpu(16, 2), a_only = Cpu(64, 2);
  both.cores = 16;
  b_only.cores = 16;
  s.AddWorker(1, both);
  s.AddWorker(2, both);
  s.AddWorker(3, b_only);
  s.AddWorker(4, a_only);
  s.AddSweep(1, 1);
  s.AddSweep(2, 1);
  QueuedRun a = Wide(2, 1, 0, 6);  // needs memory: workers 1, 2, 4
  a.needs.memory_gb = 32;
  QueuedRun b = Wide(1, 2, 0, 6);  // needs 16 threads: workers 1, 2, 3
  b.needs.threads = 16;
  ASSERT_TRUE(s.Enqueue(a));
  EXPECT_FALSE(s.Acquire(1, both).has_value());  // starts A
  ASSERT_TRUE(s.Enqueue(b));
  EXPECT_FALSE(s.Acquire(3, b_only).has_value());  // starts B
  EXPECT_FALSE(s.Acquire(2, both).has_value());    // joins B
  EXPECT_FALSE(s.Acquire(4, a_only).has_value());  // joins A
  EXPECT_EQ(s.SlotsReserved(1), 2);
  std::optional<QueuedRun> got = s.Acquire(1, both);  // leaves A for B: B is complete
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->run_id, 1);
  ASSERT_EQ(s.GetLease(1)->members.size(), 3u);
  EXPECT_EQ(s.SlotsReserved(1), 0);
  EXPECT_EQ(s.SlotsReserved(4), 2);  // A waits with worker 4
  EXPECT_EQ(s.SlotsInUse(1), 2);
}

}  // namespace
}  // namespace ablate
