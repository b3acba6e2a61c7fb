// The fixture of the worker tests that train (the trainer's, the agent's, `ablate-worker train`'s):
// a fresh directory per test holding corpus.txt, a small text corpus of numbered lines that a
// tiny run reads as bytes. The directory is removed in TearDown, whatever the test left in it.
#ifndef ABLATE_TESTS_WORKER_CORPUS_FIXTURE_H_
#define ABLATE_TESTS_WORKER_CORPUS_FIXTURE_H_

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "tests/test_dir.h"

namespace ablate::testing {

class CorpusTest : public ::testing::Test {
 protected:
  // The line the trainer's and the agent's corpora repeat.
  static constexpr char kWordLine[] = "In the beginning was the word, and the word was ";

  // The directory is FreshTestDir(`dir_prefix`); the corpus is `lines` lines, line i being
  // `line` followed by i and ".".
  explicit CorpusTest(std::string dir_prefix, std::string line = kWordLine, int lines = 400)
      : dir_prefix_(std::move(dir_prefix)), line_(std::move(line)), lines_(lines) {}

  void SetUp() override {
    dir_ = FreshTestDir(dir_prefix_);
    std::ofstream out(corpus_path());
    for (int i = 0; i < lines_; ++i) out << line_ << i << ".\n";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::filesystem::path corpus_path() const { return dir_ / "corpus.txt"; }

  std::filesystem::path dir_;  // the test's directory

 private:
  const std::string dir_prefix_;
  const std::string line_;
  const int lines_;
};

}  // namespace ablate::testing

#endif  // ABLATE_TESTS_WORKER_CORPUS_FIXTURE_H_
