# The code version of a build (common/version.h), computed when the build runs: `cmake -P` this
# script with
#   -DSOURCE_DIR=<repository>      the tree to hash
#   -DDIRS=<a|b|c>                 its folders whose files decide what a run computes ("|"-separated)
#   -DPROJECT_VERSION=<0.1.0>
#   -DOUTPUT=<file.h>              the header to write (its #defines: common/version.cc)
# It hashes every file of DIRS, path and content, in sorted order: in a git checkout the files
# git knows or would add (tracked, and untracked ones not ignored), elsewhere every file. A file
# outside DIRS (docs/, dashboard/, tests/) changes nothing; reverting a change gives the old hash
# back. In a git checkout it also records the commit and the files of DIRS that differ from it.
# OUTPUT is written only when its content changes, so that an unchanged tree recompiles and
# relinks nothing.
cmake_minimum_required(VERSION 3.21)
foreach(var SOURCE_DIR DIRS PROJECT_VERSION OUTPUT)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "code_version.cmake: -D${var}=... is required")
  endif()
endforeach()
string(REPLACE "|" ";" dirs "${DIRS}")

find_program(GIT_EXECUTABLE git)
set(commit "")
if(GIT_EXECUTABLE)
  execute_process(COMMAND ${GIT_EXECUTABLE} rev-parse --show-toplevel
                  WORKING_DIRECTORY ${SOURCE_DIR} RESULT_VARIABLE not_git
                  OUTPUT_VARIABLE toplevel OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  # Only the repository's own checkout: a SOURCE_DIR inside some other checkout is not one.
  if(NOT not_git)
    file(REAL_PATH "${SOURCE_DIR}" source_real)
    file(REAL_PATH "${toplevel}" toplevel_real)
    if(source_real STREQUAL toplevel_real)
      execute_process(COMMAND ${GIT_EXECUTABLE} rev-parse --short HEAD
                      WORKING_DIRECTORY ${SOURCE_DIR} OUTPUT_VARIABLE commit
                      OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    endif()
  endif()
endif()

set(files "")
set(dirty "")
if(commit)
  execute_process(COMMAND ${GIT_EXECUTABLE} -c core.quotepath=off ls-files --cached --others
                          --exclude-standard -- ${dirs}
                  WORKING_DIRECTORY ${SOURCE_DIR} OUTPUT_VARIABLE listed RESULT_VARIABLE failed
                  OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(failed)
    message(FATAL_ERROR "code_version.cmake: git ls-files failed in ${SOURCE_DIR}")
  endif()
  string(REPLACE "\n" ";" listed "${listed}")
  foreach(f ${listed})
    if(f MATCHES "^\"")
      message(FATAL_ERROR "code_version.cmake: ${f}: git quotes this name (a quote, backslash "
                          "or control character in it), so it cannot be hashed: rename it")
    endif()
    # A tracked file deleted from the work tree is listed but gone: it is left out (a change).
    if(EXISTS "${SOURCE_DIR}/${f}" AND NOT IS_DIRECTORY "${SOURCE_DIR}/${f}")
      list(APPEND files "${f}")
    endif()
  endforeach()
  execute_process(COMMAND ${GIT_EXECUTABLE} -c core.quotepath=off status --porcelain
                          --untracked-files=all -- ${dirs}
                  WORKING_DIRECTORY ${SOURCE_DIR} OUTPUT_VARIABLE status
                  OUTPUT_STRIP_TRAILING_WHITESPACE)
  string(REPLACE "\n" ";" status "${status}")
  foreach(line ${status})
    # "XY PATH", or "XY OLD -> NEW" for a rename.
    string(SUBSTRING "${line}" 3 -1 path)
    string(REGEX REPLACE "^.* -> " "" path "${path}")
    list(APPEND dirty "${path}")
  endforeach()
else()
  foreach(d ${dirs})
    file(GLOB_RECURSE found RELATIVE ${SOURCE_DIR} ${SOURCE_DIR}/${d}/*)
    list(APPEND files ${found})
  endforeach()
endif()
list(REMOVE_DUPLICATES files)
list(SORT files)
list(SORT dirty)

# Path and content of each file: its path, then the SHA-256 of its bytes (binary files too).
set(manifest "")
foreach(f ${files})
  file(SHA256 "${SOURCE_DIR}/${f}" h)
  string(APPEND manifest "${f}\n${h}\n")
endforeach()
string(SHA256 source_hash "${manifest}")
string(SUBSTRING "${source_hash}" 0 16 source_hash)
list(LENGTH files file_count)

string(SUBSTRING "${source_hash}" 0 8 short_hash)
if(NOT commit)
  set(build "${PROJECT_VERSION}+src-${short_hash}")
elseif(dirty)
  set(build "${PROJECT_VERSION}+${commit}.dirty-${short_hash}")
else()
  set(build "${PROJECT_VERSION}+${commit}")
endif()
string(REPLACE ";" " " dirty_text "${dirty}")
string(REPLACE "\\" "\\\\" dirty_text "${dirty_text}")
string(REPLACE "\"" "\\\"" dirty_text "${dirty_text}")

set(content "// Written by cmake/code_version.cmake when the build runs: do not edit.
#define ABLATE_PROJECT_VERSION \"${PROJECT_VERSION}\"
#define ABLATE_SOURCE_HASH \"${source_hash}\"
#define ABLATE_SOURCE_FILES ${file_count}
#define ABLATE_BUILD_VERSION \"${build}\"
#define ABLATE_UNCOMMITTED_SOURCES \"${dirty_text}\"
")
set(old "")
if(EXISTS "${OUTPUT}")
  file(READ "${OUTPUT}" old)
endif()
if(NOT old STREQUAL content)
  file(WRITE "${OUTPUT}" "${content}")
endif()
