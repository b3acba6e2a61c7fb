// What this build is. The build computes it from its sources each time it runs
// (cmake/code_version.cmake), not when CMake configures: an edit followed by a plain
// `cmake --build` gives another version.
//
// Two strings, for two readers:
//  - CodeVersion() says what a run computes: the project version and a hash of the content of
//    every file of worker/, config/, proto/ and common/ (what `ablate-worker` compiles),
//    committed or not. It goes into every run key and every sweep, and a worker is leased only
//    runs of its own CodeVersion(). A change elsewhere (docs/, dashboard/, orchestrator/) or a
//    commit of the same content leaves it as it was; reverting an edit gives the old one back.
//  - BuildVersion() says where the build came from, for people: the commit, marked when those
//    files differ from it.
// Build settings (compiler, flags, the LibTorch: CPU or CUDA) are in neither: a CUDA build of
// the same sources takes the same runs.
#ifndef ABLATE_COMMON_VERSION_H_
#define ABLATE_COMMON_VERSION_H_

#include <string>
#include <vector>

namespace ablate {

// "0.1.0+src-3f2a9c1d4e5f6071": the project version and 16 hex digits of the SHA-256 over the
// sorted paths and contents of the hashed files.
const char* CodeVersion();

// "0.1.0+bf7c9b7" from a clean checkout; "0.1.0+bf7c9b7.dirty-3f2a9c1d" (the first 8 digits of
// CodeVersion()'s hash) when the hashed files differ from commit bf7c9b7; "0.1.0+src-3f2a9c1d"
// outside a git checkout.
const char* BuildVersion();

// The hashed files that differ from the commit (modified, added, deleted or untracked but not
// ignored), repository-relative and sorted; empty from a clean checkout or outside git.
std::vector<std::string> UncommittedSources();

// What `ablate expand` and `ablate submit` say of a sweep expanded by a build with `files`
// uncommitted: "built from uncommitted changes to worker/train/trainer.cc: ..." naming up to
// three of them; "" when `files` is empty.
std::string UncommittedSourcesNote(const std::vector<std::string>& files);

// `--version` of `ablate` and `ablate-worker`: BuildVersion(), then "code " and CodeVersion(),
// then the note on uncommitted sources when there are some; lines without a final newline.
std::string VersionText();

}  // namespace ablate

#endif  // ABLATE_COMMON_VERSION_H_
