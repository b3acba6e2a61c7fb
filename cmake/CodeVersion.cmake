# ablate_code_version(TARGET OUTPUT SOURCE_DIR DIRS...): a target that runs cmake/code_version.cmake
# on every build (a custom target is always out of date), hashing DIRS of SOURCE_DIR into the
# header OUTPUT. The script rewrites OUTPUT only when its content changes, and OUTPUT is the
# target's byproduct, so Ninja re-checks its time stamp (restat): whatever includes it recompiles,
# and whatever links that relinks, only when the hashed sources changed.
set(ABLATE_CODE_VERSION_SCRIPT ${CMAKE_CURRENT_LIST_DIR}/code_version.cmake)
function(ablate_code_version target output source_dir)
  string(REPLACE ";" "|" dirs "${ARGN}")
  add_custom_target(${target}
    COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${source_dir} -DDIRS=${dirs}
            -DPROJECT_VERSION=${PROJECT_VERSION} -DOUTPUT=${output}
            -P ${ABLATE_CODE_VERSION_SCRIPT}
    BYPRODUCTS ${output}
    COMMENT "code version: hashing ${dirs}"
    VERBATIM)
endfunction()
