# Writes OUT = a header defining ALLOY_GIT_COMMIT as the source tree's HEAD at BUILD time
# ("-dirty" when tracked files differ from it), rewriting it only when it changes so that an
# unchanged tree relinks nothing. Run by the alloy_build_commit target on every build.
execute_process(COMMAND git rev-parse --short HEAD WORKING_DIRECTORY ${SRC}
  OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
execute_process(COMMAND git status --porcelain --untracked-files=no WORKING_DIRECTORY ${SRC}
  OUTPUT_VARIABLE dirty OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT commit)
  set(commit unknown)
elseif(dirty)
  set(commit "${commit}-dirty")
endif()
set(content "#define ALLOY_GIT_COMMIT \"${commit}\"\n")
set(old "")
if(EXISTS ${OUT})
  file(READ ${OUT} old)
endif()
if(NOT old STREQUAL content)
  file(WRITE ${OUT} "${content}")
endif()
