// A fresh directory for the running gtest test (gtest-side: process_util.h serves benchmarks
// without gtest).
#ifndef ABLATE_TESTS_TEST_DIR_H_
#define ABLATE_TESTS_TEST_DIR_H_

#include <unistd.h>

#include <filesystem>
#include <string>

#include <gtest/gtest.h>

namespace ablate::testing {

// <tmp>/<prefix>_<pid>_<test name>, emptied and created: tests in parallel processes, or
// left over from a crashed run, never share one. The fixture removes it in TearDown.
inline std::filesystem::path FreshTestDir(const std::string& prefix) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      (prefix + "_" + std::to_string(::getpid()) + "_" +
       ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace ablate::testing

#endif  // ABLATE_TESTS_TEST_DIR_H_
