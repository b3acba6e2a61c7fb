// A fixture with a fresh store of its own (FreshTestDir(name)/ablate.db), removed after the
// test: for the store's tests that fill it through the Store API (tests/orchestrator/store/
// test_sweeps.h).
#ifndef ABLATE_TESTS_ORCHESTRATOR_STORE_STORE_FIXTURE_H_
#define ABLATE_TESTS_ORCHESTRATOR_STORE_STORE_FIXTURE_H_

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>

#include "orchestrator/store/store.h"
#include "tests/test_dir.h"

namespace ablate {
namespace testing {

class StoreFixture : public ::testing::Test {
 protected:
  // Opens the store; call first in SetUp (a failure ends the test there).
  void OpenStore(const std::string& name) {
    dir_ = FreshTestDir(name).string();
    StoreOptions options;
    options.path = dir_ + "/ablate.db";
    absl::StatusOr<std::unique_ptr<Store>> store = Store::Open(options);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }
  void TearDown() override {
    store_.reset();
    std::filesystem::remove_all(dir_);
  }

  std::string dir_;
  std::unique_ptr<Store> store_;
};

}  // namespace testing
}  // namespace ablate

#endif  // ABLATE_TESTS_ORCHESTRATOR_STORE_STORE_FIXTURE_H_
