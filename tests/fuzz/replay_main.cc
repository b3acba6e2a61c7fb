// A stand-in for libFuzzer's main() in the ordinary (gcc, unsanitized) build: runs a fuzz
// target's LLVMFuzzerTestOneInput once over every file under the directories (or files) given,
// so every `make test` replays the seed corpora and the regression inputs without clang.
//
//   spec_fuzz_replay DIR_OR_FILE...
//
// Exit status 0 when every input ran; a finding aborts the process like the fuzzer would. A
// missing path or no input at all fails too, so a moved corpus does not pass silently.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
// Optional in a target (libFuzzer declares it weak too).
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) __attribute__((weak));

int main(int argc, char** argv) {
  if (LLVMFuzzerInitialize != nullptr) LLVMFuzzerInitialize(&argc, &argv);
  namespace fs = std::filesystem;
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    const fs::path path(argv[i]);
    std::error_code error;
    if (fs::is_regular_file(path, error)) {
      inputs.push_back(path);
    } else if (fs::is_directory(path, error)) {
      for (const auto& entry : fs::recursive_directory_iterator(path)) {
        if (entry.is_regular_file()) inputs.push_back(entry.path());
      }
    } else {
      std::fprintf(stderr, "%s: no such file or directory: %s\n", argv[0], argv[i]);
      return 2;
    }
  }
  if (inputs.empty()) {
    std::fprintf(stderr, "%s: no inputs (usage: %s DIR_OR_FILE...)\n", argv[0], argv[0]);
    return 2;
  }
  std::sort(inputs.begin(), inputs.end());  // the same order on every machine
  for (const fs::path& path : inputs) {
    std::ifstream in(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in.good() && !in.eof()) {
      std::fprintf(stderr, "%s: cannot read %s\n", argv[0], path.c_str());
      return 2;
    }
    // A crash here should name its input: say which one runs (stderr is unbuffered).
    std::fprintf(stderr, "%s\n", path.c_str());
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  std::printf("%s: %zu inputs replayed, no finding\n", argv[0], inputs.size());
  return 0;
}
