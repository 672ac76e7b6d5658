# Builds the one self-contained web page from lib/server/webui/: index.html
# with each `/*@include NAME*/` line replaced by the file NAME beside it, then
# wraps it as a C++ raw string for webui.cc. Run at build time by
# lib/server/CMakeLists.txt (cmake -P), so editing a part rebuilds one object.
#
# In: WEBUI_DIR (sources), PAGE_OUT (the assembled page), INC_OUT (the raw string).
file(READ "${WEBUI_DIR}/index.html" page)
string(REGEX MATCHALL "/\\*@include [A-Za-z0-9_.-]+\\*/" includes "${page}")
if(NOT includes)
  message(FATAL_ERROR "webui: index.html includes no parts")
endif()
foreach(marker IN LISTS includes)
  string(REGEX REPLACE "^/\\*@include ([A-Za-z0-9_.-]+)\\*/$" "\\1" part "${marker}")
  if(NOT EXISTS "${WEBUI_DIR}/${part}")
    message(FATAL_ERROR "webui: index.html includes ${part}, which is not in ${WEBUI_DIR}")
  endif()
  file(READ "${WEBUI_DIR}/${part}" body)
  # A part that closed the element it sits in would end the page early.
  string(TOLOWER "${body}" lower)
  if(lower MATCHES "</script" OR lower MATCHES "</style")
    message(FATAL_ERROR "webui: ${part} contains a closing </script> or </style> tag")
  endif()
  string(REPLACE "${marker}" "${body}" page "${page}")
endforeach()
if(page MATCHES "\\)K3PAGE\"")
  message(FATAL_ERROR "webui: the page contains the raw-string delimiter )K3PAGE\"")
endif()
string(LENGTH "${page}" size)
file(WRITE "${PAGE_OUT}" "${page}")
file(WRITE "${INC_OUT}" "R\"K3PAGE(${page})K3PAGE\"\n")
message(STATUS "webui: ${PAGE_OUT} is ${size} bytes")
