# rtcore's own files include each other without a cycle.
#
# A unit is a header of rtcore/include/rtcore with the source of the same
# name in rtcore/src; unit A depends on unit B when A's header or source
# includes "rtcore/B.hpp".  The units must form no cycle, so that each can
# be read (and tested) knowing only what lies below it: the journal never
# reaches back into the isolation or the knob applier that journal into it
# (rtcore/README.md, "The journal and the knobs").
#
#   cmake -DQRT_SOURCE_DIR=<repo> [-DQRT_EXTRA_INCLUDE=<file>=<unit>] -P rtcore_include_cycles.cmake
#
# QRT_EXTRA_INCLUDE adds one include as if <file> (a name under rtcore/src
# or rtcore/include/rtcore) held it, to show that the check refuses a cycle.
# Prints "rtcore: N units, no include cycle" or, for a cycle, a line
# starting "problem:" naming every unit in it with the files that include
# the next one.
cmake_minimum_required(VERSION 3.20)

if(NOT QRT_SOURCE_DIR)
  message(FATAL_ERROR "problem: QRT_SOURCE_DIR is not set")
endif()
file(GLOB _headers "${QRT_SOURCE_DIR}/rtcore/include/rtcore/*.hpp")
file(GLOB _sources "${QRT_SOURCE_DIR}/rtcore/src/*.cpp")

set(_units "")
foreach(f IN LISTS _headers _sources)
  get_filename_component(_unit "${f}" NAME_WE)
  get_filename_component(_name "${f}" NAME)
  list(APPEND _units "${_unit}")
  file(STRINGS "${f}" _lines REGEX "^#include \"rtcore/[A-Za-z0-9_]+\\.hpp\"")
  if(QRT_EXTRA_INCLUDE MATCHES "^([^=]+)=(.+)$" AND CMAKE_MATCH_1 STREQUAL _name)
    list(APPEND _lines "#include \"rtcore/${CMAKE_MATCH_2}.hpp\"")
  endif()
  foreach(l IN LISTS _lines)
    string(REGEX REPLACE "^#include \"rtcore/([A-Za-z0-9_]+)\\.hpp\".*" "\\1" _dep "${l}")
    if(NOT _dep STREQUAL _unit)
      list(APPEND _deps_${_unit} "${_dep}")
      list(APPEND _why_${_unit}_${_dep} "${_name}")
    endif()
  endforeach()
endforeach()
list(REMOVE_DUPLICATES _units)
list(LENGTH _units _count)

# Peel off, again and again, every unit whose dependencies are all peeled:
# what is left when nothing more comes off lies on a cycle or leads to one.
set(_left ${_units})
set(_peeled "")
while(TRUE)
  set(_now "")
  foreach(u IN LISTS _left)
    set(_free TRUE)
    foreach(d IN LISTS _deps_${u})
      if(NOT d IN_LIST _peeled)
        list(FIND _units "${d}" _known)
        if(NOT _known EQUAL -1)
          set(_free FALSE)
          break()
        endif()
      endif()
    endforeach()
    if(_free)
      list(APPEND _now "${u}")
    endif()
  endforeach()
  if(NOT _now)
    break()
  endif()
  list(APPEND _peeled ${_now})
  list(REMOVE_ITEM _left ${_now})
endwhile()

if(NOT _left)
  message("rtcore: ${_count} units, no include cycle")
  return()
endif()

# Units that only lead into a cycle are not on it: walk from the first
# left unit along left units until one repeats; that loop is the cycle.
list(GET _left 0 _at)
set(_path "")
while(NOT _at IN_LIST _path)
  list(APPEND _path "${_at}")
  foreach(d IN LISTS _deps_${_at})
    if(d IN_LIST _left)
      set(_at "${d}")
      break()
    endif()
  endforeach()
endwhile()
list(FIND _path "${_at}" _start)
list(SUBLIST _path ${_start} -1 _cycle)
list(APPEND _cycle "${_at}")
set(_text "")
list(LENGTH _cycle _n)
math(EXPR _last "${_n} - 2")
foreach(i RANGE 0 ${_last})
  math(EXPR _j "${i} + 1")
  list(GET _cycle ${i} _a)
  list(GET _cycle ${_j} _b)
  list(REMOVE_DUPLICATES _why_${_a}_${_b})
  list(JOIN _why_${_a}_${_b} ", " _files)
  string(APPEND _text " ${_a} -> ${_b} (${_files});")
endforeach()
list(JOIN _cycle " -> " _ring)
message("problem: rtcore include cycle ${_ring}:${_text} move what both need into a unit of its own below them")
