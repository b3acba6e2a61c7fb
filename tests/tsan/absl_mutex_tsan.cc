// absl::Mutex, absl::CondVar and absl::Notification made visible to ThreadSanitizer.
//
// Why this file exists: `make check-threads` builds the tests with -fsanitize=thread, but Debian's
// abseil (libabsl-dev, shared libraries) is not built with TSan, so its Mutex never tells TSan when
// it is locked or unlocked. TSan then sees no happens-before edge between two critical sections of
// the same absl::Mutex and reports every access to an ABSL_GUARDED_BY member as a data race
// (thousands of false positives in store_test alone).
//
// The fix: this file defines, in the test executable, the out-of-line member functions of
// absl::Mutex / CondVar / Notification that the code calls (MutexLock and the other RAII helpers
// are inline and call these). A definition in the executable interposes the shared library's: the
// executable's own calls bind to it at link time, and the libraries' calls through the PLT
// (libabsl_synchronization itself, gRPC) bind to it at run time as the executable exports it. Each
// one calls the library's original, found with dlsym(RTLD_NEXT, mangled name), and brackets it with
// the mutex annotations of <sanitizer/tsan_interface.h>, as abseil's own mutex.cc does when it is
// built with TSan:
//   Lock/LockWhen*/TryLock:     pre_lock, original, post_lock (read_lock/try_lock flags as fits);
//   Unlock:                     pre_unlock, original, post_unlock;
//   Await*, CondVar::Wait*:     an unlock before the call and a lock after it (they release the
//                               mutex while they wait and hold it again when they return).
// TSan ignores memory accesses between pre_* and post_*, so the Conditions that the original
// evaluates while inside (possibly on the unlocking thread) are not reported.
// Notification::Notify is a release and a returning WaitForNotification* an acquire, on the
// Notification: its fast path is an atomic load in uninstrumented code. absl::Status's
// UnrefNonInlined is redefined here too (see there): its refcount is the same kind of edge.
//
// A thread-local depth keeps a call made from inside an interposed one (Notification::Notify
// locks its mutex; WaitWithTimeout may call WaitWithDeadline) from being annotated twice.
// Only linked into the test binaries when ABLATE_TSAN is ON (tests/CMakeLists.txt).

#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "absl/base/config.h"
#include "absl/base/macros.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

#if !ABSL_OPTION_USE_INLINE_NAMESPACE
#error "absl_mutex_tsan.cc builds the mangled names of an abseil with an inline namespace"
#endif

namespace {

// "_ZN4absl7debian3" + rest: the mangled name of a member of absl::<inline namespace>.
void* Original(const char* rest, bool is_const = false) {
  const char* ns = ABSL_INTERNAL_TOKEN_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  std::string name = std::string(is_const ? "_ZNK4absl" : "_ZN4absl") +
                     std::to_string(std::strlen(ns)) + ns + rest;
  void* f = dlsym(RTLD_NEXT, name.c_str());
  if (f == nullptr) {
    std::fprintf(stderr, "absl_mutex_tsan: %s not found in the shared abseil: %s\n", name.c_str(),
                 dlerror());
    std::abort();
  }
  return f;
}

// Whether `address` is in the code of one of gRPC's shared libraries.
bool InGrpc(void* address) {
  Dl_info info;
  return dladdr(address, &info) != 0 && info.dli_fname != nullptr &&
         std::strstr(info.dli_fname, "/libgrpc") != nullptr;
}

thread_local int depth = 0;

// Calls the original with annotations only at the outermost interposed call of this thread.
struct Scope {
  Scope() : outer(depth++ == 0) {}
  ~Scope() { --depth; }
  const bool outer;
};

constexpr unsigned kRead = __tsan_mutex_read_lock;
constexpr unsigned kTry = __tsan_mutex_try_lock;
constexpr unsigned kTryFailed = __tsan_mutex_try_lock_failed;

// Await* and CondVar::Wait*: the mutex is released, then held again. pre_lock before the original
// and post_lock after it, so the original runs inside TSan's ignore region.
void ReleaseForWait(void* mu, unsigned flags) {
  __tsan_mutex_pre_unlock(mu, flags);
  __tsan_mutex_post_unlock(mu, flags);
  __tsan_mutex_pre_lock(mu, flags);
}

// post_lock of `mu` when it goes out of scope: after the original has returned, whatever it
// returned (the *WithTimeout and *WithDeadline variants hold the mutex on return either way).
struct PostLock {
  ~PostLock() {
    if (outer) __tsan_mutex_post_lock(mu, flags, 0);
  }
  bool outer;
  void* mu;
  unsigned flags;
};

// `original(self, args...)` annotated as taking `mu` in mode `flags` (0, or kRead).
template <typename R, typename Self, typename... P, typename... A>
R Locking(R (*original)(Self*, P...), Self* self, void* mu, unsigned flags, A&&... args) {
  Scope s;
  if (s.outer) __tsan_mutex_pre_lock(mu, flags);
  PostLock post{s.outer, mu, flags};
  return original(self, std::forward<A>(args)...);
}

// `original(self, args...)` annotated as releasing `mu` in mode `flags`.
template <typename Self>
void Unlocking(void (*original)(Self*), Self* self, void* mu, unsigned flags) {
  Scope s;
  if (s.outer) __tsan_mutex_pre_unlock(mu, flags);
  original(self);
  if (s.outer) __tsan_mutex_post_unlock(mu, flags);
}

// `original(self, args...)` of a wait that releases `mu` (held exclusively) while it waits and
// holds it again when it returns.
template <typename R, typename Self, typename... P, typename... A>
R Waiting(R (*original)(Self*, P...), Self* self, void* mu, A&&... args) {
  Scope s;
  if (s.outer) ReleaseForWait(mu, 0);
  PostLock post{s.outer, mu, 0};
  return original(self, std::forward<A>(args)...);
}

}  // namespace

#define ABLATE_ORIGINAL(type, ...) \
  static const auto original = reinterpret_cast<type>(Original(__VA_ARGS__))

namespace absl {
ABSL_NAMESPACE_BEGIN

// ---- Mutex ---------------------------------------------------------------------------------
// A mutex a gRPC object holds is destroyed when gRPC's own refcount (uninstrumented) drops to 0,
// after another thread's last unlock: TSan would see the destroy but not what orders it. So the
// destroy is annotated (a destroy racing a use is reported) only when the destructor is not called
// from gRPC's code.
Mutex::~Mutex() {
  ABLATE_ORIGINAL(void (*)(Mutex*), "5MutexD1Ev");
  if (!InGrpc(__builtin_return_address(0))) __tsan_mutex_destroy(this, 0);
  original(this);
}

void Mutex::Lock() {
  ABLATE_ORIGINAL(void (*)(Mutex*), "5Mutex4LockEv");
  Locking(original, this, this, 0);
}

void Mutex::ReaderLock() {
  ABLATE_ORIGINAL(void (*)(Mutex*), "5Mutex10ReaderLockEv");
  Locking(original, this, this, kRead);
}

void Mutex::Unlock() {
  ABLATE_ORIGINAL(void (*)(Mutex*), "5Mutex6UnlockEv");
  Unlocking(original, this, this, 0);
}

void Mutex::ReaderUnlock() {
  ABLATE_ORIGINAL(void (*)(Mutex*), "5Mutex12ReaderUnlockEv");
  Unlocking(original, this, this, kRead);
}

bool Mutex::TryLock() {
  ABLATE_ORIGINAL(bool (*)(Mutex*), "5Mutex7TryLockEv");
  Scope s;
  if (s.outer) __tsan_mutex_pre_lock(this, kTry);
  const bool locked = original(this);
  if (s.outer) __tsan_mutex_post_lock(this, kTry | (locked ? 0 : kTryFailed), 0);
  return locked;
}

bool Mutex::ReaderTryLock() {
  ABLATE_ORIGINAL(bool (*)(Mutex*), "5Mutex13ReaderTryLockEv");
  Scope s;
  if (s.outer) __tsan_mutex_pre_lock(this, kRead | kTry);
  const bool locked = original(this);
  if (s.outer) __tsan_mutex_post_lock(this, kRead | kTry | (locked ? 0 : kTryFailed), 0);
  return locked;
}

void Mutex::LockWhen(const Condition& cond) {
  ABLATE_ORIGINAL(void (*)(Mutex*, const Condition&), "5Mutex8LockWhenERKNS0_9ConditionE");
  Locking(original, this, this, 0, cond);
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  ABLATE_ORIGINAL(void (*)(Mutex*, const Condition&), "5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  Locking(original, this, this, kRead, cond);
}

// The *WithTimeout/*WithDeadline variants hold the mutex on return whatever they return.
bool Mutex::LockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  ABLATE_ORIGINAL(bool (*)(Mutex*, const Condition&, absl::Duration),
                  "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Locking(original, this, this, 0, cond, timeout);
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  ABLATE_ORIGINAL(bool (*)(Mutex*, const Condition&, absl::Time),
                  "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Locking(original, this, this, 0, cond, deadline);
}

bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  ABLATE_ORIGINAL(bool (*)(Mutex*, const Condition&, absl::Duration),
                  "5Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Locking(original, this, this, kRead, cond, timeout);
}

bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  ABLATE_ORIGINAL(bool (*)(Mutex*, const Condition&, absl::Time),
                  "5Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Locking(original, this, this, kRead, cond, deadline);
}

// Await* is called holding the mutex exclusively (abseil: "must be held in write mode").
void Mutex::Await(const Condition& cond) {
  ABLATE_ORIGINAL(void (*)(Mutex*, const Condition&), "5Mutex5AwaitERKNS0_9ConditionE");
  Waiting(original, this, this, cond);
}

bool Mutex::AwaitWithTimeout(const Condition& cond, absl::Duration timeout) {
  ABLATE_ORIGINAL(bool (*)(Mutex*, const Condition&, absl::Duration),
                  "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Waiting(original, this, this, cond, timeout);
}

bool Mutex::AwaitWithDeadline(const Condition& cond, absl::Time deadline) {
  ABLATE_ORIGINAL(bool (*)(Mutex*, const Condition&, absl::Time),
                  "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Waiting(original, this, this, cond, deadline);
}

// ---- CondVar: Wait* releases *mu and holds it again on return --------------------------------
void CondVar::Wait(Mutex* mu) {
  ABLATE_ORIGINAL(void (*)(CondVar*, Mutex*), "7CondVar4WaitEPNS0_5MutexE");
  Waiting(original, this, mu, mu);
}

bool CondVar::WaitWithTimeout(Mutex* mu, absl::Duration timeout) {
  ABLATE_ORIGINAL(bool (*)(CondVar*, Mutex*, absl::Duration),
                  "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  return Waiting(original, this, mu, mu, timeout);
}

bool CondVar::WaitWithDeadline(Mutex* mu, absl::Time deadline) {
  ABLATE_ORIGINAL(bool (*)(CondVar*, Mutex*, absl::Time),
                  "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  return Waiting(original, this, mu, mu, deadline);
}

// ---- Notification: Notify releases, a Wait that returns notified acquires ------------------
void Notification::Notify() {
  ABLATE_ORIGINAL(void (*)(Notification*), "12Notification6NotifyEv");
  Scope s;
  if (s.outer) __tsan_release(this);
  original(this);
}

void Notification::WaitForNotification() const {
  ABLATE_ORIGINAL(void (*)(const Notification*), "12Notification19WaitForNotificationEv", true);
  Scope s;
  original(this);
  if (s.outer) __tsan_acquire(const_cast<Notification*>(this));
}

bool Notification::WaitForNotificationWithTimeout(absl::Duration timeout) const {
  ABLATE_ORIGINAL(bool (*)(const Notification*, absl::Duration),
                  "12Notification30WaitForNotificationWithTimeoutENS0_8DurationE", true);
  Scope s;
  const bool notified = original(this, timeout);
  if (s.outer && notified) __tsan_acquire(const_cast<Notification*>(this));
  return notified;
}

bool Notification::WaitForNotificationWithDeadline(absl::Time deadline) const {
  ABLATE_ORIGINAL(bool (*)(const Notification*, absl::Time),
                  "12Notification31WaitForNotificationWithDeadlineENS0_4TimeE", true);
  Scope s;
  const bool notified = original(this, deadline);
  if (s.outer && notified) __tsan_acquire(const_cast<Notification*>(this));
  return notified;
}

// ---- Status: the last reference's delete ordered after the other threads' --------------------
// absl::Status's refcount is incremented inline (instrumented) but decremented in libabsl_status's
// UnrefNonInlined (not instrumented), so TSan saw the last owner's delete race with another
// thread's earlier copy. This is abseil 20220623's own definition (status.cc), compiled here with
// TSan so that the acq_rel decrement that orders the delete is seen.
void Status::UnrefNonInlined(uintptr_t rep) {
  status_internal::StatusRep* r = RepToPointer(rep);
  if (r->ref.load(std::memory_order_acquire) == 1 ||
      r->ref.fetch_sub(1, std::memory_order_acq_rel) - 1 == 0) {
    delete r;
  }
}

ABSL_NAMESPACE_END
}  // namespace absl
